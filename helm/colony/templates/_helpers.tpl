{{/* Names and labels shared by every template. */}}

{{- define "colony.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-colony, or the release name alone when it already contains the chart name. */}}
{{- define "colony.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "colony.selectorLabels" -}}
app.kubernetes.io/name: {{ include "colony.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "colony.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "colony.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "colony.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "colony.fullname" .)) -}}
{{- end -}}

{{- define "colony.redisSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "colony.fullname" .)) -}}
{{- end -}}

{{- define "colony.redisHost" -}}
{{- printf "%s-redis" (include "colony.fullname" .) -}}
{{- end -}}

{{- define "colony.externalRedisSecretName" -}}
{{- .Values.redis.external.existingSecret | default (printf "%s-redis-url" (include "colony.fullname" .)) -}}
{{- end -}}

{{- define "colony.chromaHost" -}}
{{- printf "%s-chroma" (include "colony.fullname" .) -}}
{{- end -}}

{{/* The Chroma server every Ray pod uses: the chart's own, or memory.chroma.external.url. */}}
{{- define "colony.chromaUrl" -}}
{{- if .Values.memory.enabled -}}
{{- printf "http://%s:%d" (include "colony.chromaHost" .) (int .Values.memory.chroma.port) -}}
{{- else -}}
{{- .Values.memory.chroma.external.url | trimSuffix "/" -}}
{{- end -}}
{{- end -}}

{{/* The Chroma container's image: memory.chroma.image, else the chart's own (the same chromadb as
     the Ray pods' client). */}}
{{- define "colony.chromaImage" -}}
{{- $i := .Values.memory.chroma.image -}}
{{- if and $i.repository $i.tag -}}
{{- printf "%s:%s" $i.repository $i.tag -}}
{{- else -}}
{{- include "colony.image" . -}}
{{- end -}}
{{- end -}}

{{- define "colony.configPath" -}}/etc/colony/colony.yaml{{- end -}}

{{- define "colony.clusterLabel" -}}
{{- .Values.metrics.cluster | default .Release.Name -}}
{{- end -}}

{{/* A value kept across upgrades: given > already in the cluster's Secret > new random.
     Arguments: dict "given" "existing" (the Secret's data map) "key" "length". Result: base64. */}}
{{- define "colony.keptSecretValue" -}}
{{- if .given -}}
{{- .given | b64enc -}}
{{- else if (get .existing .key) -}}
{{- get .existing .key -}}
{{- else -}}
{{- randAlphaNum (int .length) | b64enc -}}
{{- end -}}
{{- end -}}

{{/* The colony settings file as it lands in the ConfigMap (also hashed into the pods).
     serve.port is the chart's serve.port (Serve's HTTP port), never set apart; memory.chroma_url is
     the shared Chroma server and memory.chroma.enabled false (no replica starts its own). */}}
{{- define "colony.settingsYaml" -}}
{{- $colony := deepCopy .Values.colony -}}
{{- $serve := get $colony "serve" | default dict -}}
{{- $_ := set $serve "port" (int .Values.serve.port) -}}
{{- $_ := set $colony "serve" $serve -}}
{{- $memory := get $colony "memory" | default dict -}}
{{- $_ := set $memory "chroma_url" (include "colony.chromaUrl" .) -}}
{{- $_ := set $memory "chroma" (dict "enabled" false) -}}
{{- $_ := set $colony "memory" $memory -}}
# Colony settings (colony.config.ColonySettings), rendered by the Helm chart from `.Values.colony`.
# Secrets come from the environment: COLONY_API_TOKEN, COLONY_SECRET, COLONY_REDIS_URL,
# COLONY_API__METRICS_TOKEN.
{{ toYaml $colony }}
{{- end -}}

{{/* A hash of the secret values given in the values (never the values themselves), on the pod
     templates so that changing one rolls the pods that read it. Generated and existingSecret
     values are not in it: the chart cannot see a change of those (docs/deploy.md). */}}
{{- define "colony.givenSecretsChecksum" -}}
{{- $given := list .Values.auth.apiToken .Values.auth.colonySecret .Values.auth.metricsToken .Values.redis.auth.password .Values.redis.external.url -}}
{{- printf "colony-secrets-v1\x00%s\x00%s" .Release.Name (join "\x00" $given) | sha256sum -}}
{{- end -}}

{{- define "colony.redisSecretsChecksum" -}}
{{- printf "colony-redis-v1\x00%s\x00%s" .Release.Name .Values.redis.auth.password | sha256sum -}}
{{- end -}}

{{/* The environment every Ray container gets: secrets only by reference. */}}
{{- define "colony.rayEnv" -}}
- name: COLONY_CONFIG
  value: {{ include "colony.configPath" . }}
- name: COLONY_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "colony.authSecretName" . }}
      key: api-token
- name: COLONY_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "colony.authSecretName" . }}
      key: colony-secret
- name: COLONY_API__METRICS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "colony.authSecretName" . }}
      key: metrics-token
{{- if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "colony.redisSecretName" . }}
      key: redis-password
- name: COLONY_REDIS_URL
  # $(REDIS_PASSWORD) is expanded by the kubelet from the variable above
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:%d/0" (include "colony.redisHost" .) (int .Values.redis.port) | quote }}
{{- else }}
- name: COLONY_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "colony.externalRedisSecretName" . }}
      key: redis-url
{{- end }}
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "colony.rayVolumeMounts" -}}
- name: colony-config
  mountPath: /etc/colony
  readOnly: true
- name: colony-data
  mountPath: {{ .Values.colony.data_dir | default "/var/lib/colony" }}
- name: dshm
  mountPath: /dev/shm
{{- end -}}

{{/* Volumes of a Ray pod; argument: dict "root" $ "shm" "<size>". */}}
{{- define "colony.rayVolumes" -}}
- name: colony-config
  configMap:
    name: {{ include "colony.fullname" .root }}-config
- name: colony-data
  emptyDir: {}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .shm }}
{{- end -}}

{{/* Pod-level settings of a Ray pod; argument: dict "root" $ "head" true|false. Only the head
     with Ray's autoscaler on mounts the service account token: the autoscaler sidecar KubeRay adds
     there calls the Kubernetes API with it. */}}
{{- define "colony.rayPodSpec" -}}
{{- $root := .root -}}
enableServiceLinks: false
automountServiceAccountToken: {{ and .head $root.Values.enableInTreeAutoscaling | ternary true false }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{- define "colony.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/*
The Ray containers' securityContext: containerSecurityContext, and with sandbox.userNamespaces the
seccomp profile of sandbox.seccompProfile and AppArmor unconfined, which let bubblewrap (uid 1000,
no capability) create the sandbox's namespaces (docs/deploy.md, "The sandbox in these pods").
*/}}
{{- define "colony.rayContainerSecurity" -}}
{{- $context := deepCopy (.Values.containerSecurityContext | default dict) -}}
{{- if .Values.sandbox.userNamespaces -}}
{{- $_ := set $context "seccompProfile" .Values.sandbox.seccompProfile -}}
{{- $_ := set $context "appArmorProfile" (dict "type" "Unconfined") -}}
{{- end -}}
{{- if $context -}}
securityContext:
{{ toYaml $context | indent 2 }}
{{- end -}}
{{- end -}}

{{/*
With sandbox.userNamespaces: AppArmor unconfined for a Ray container also as the annotation that
Kubernetes before 1.30 reads (1.30 and later read the securityContext field; both agree).
*/}}
{{- define "colony.rayAppArmor" -}}
{{- if .root.Values.sandbox.userNamespaces -}}
container.apparmor.security.beta.kubernetes.io/{{ .container }}: unconfined
{{- end -}}
{{- end -}}
