{{/* serveConfigV2: Ray Serve's multi-application config for the Colony app, built as data and
     written with toYaml so it is always valid YAML (tests parse it with ServeDeploySchema). */}}
{{- define "colony.serveConfig" -}}
{{- $s := .Values.serve -}}
{{- $engine := $s.engine -}}
{{- $engineReplicas := $engine.numReplicas -}}
{{- if $engine.autoscaling.enabled -}}
{{- $engineReplicas = $engine.autoscaling.minReplicas -}}
{{- end -}}
{{- $engineActor := dict "num_cpus" $engine.numCpus -}}
{{- if gt (float64 $engine.numGpus) 0.0 -}}
{{- $_ := set $engineActor "num_gpus" $engine.numGpus -}}
{{- end -}}
{{- $engineDeployment := dict "name" "EngineReplica" "ray_actor_options" $engineActor -}}
{{- if $engine.autoscaling.enabled -}}
{{- $_ := set $engineDeployment "autoscaling_config" (dict
      "min_replicas" $engine.autoscaling.minReplicas
      "max_replicas" $engine.autoscaling.maxReplicas
      "target_ongoing_requests" $engine.autoscaling.targetOngoingRequests) -}}
{{- else -}}
{{- $_ := set $engineDeployment "num_replicas" $engine.numReplicas -}}
{{- end -}}
{{- $deployments := list
      (dict "name" "ColonyAPI" "num_replicas" $s.api.numReplicas "ray_actor_options" (dict "num_cpus" $s.api.numCpus))
      (dict "name" "AgentSystem" "num_replicas" 1 "ray_actor_options" (dict "num_cpus" $s.agentSystem.numCpus))
      $engineDeployment -}}
{{- $app := dict
      "name" $s.appName
      "route_prefix" $s.routePrefix
      "import_path" "colony.serve.app:build_app"
      "args" (dict "config" (include "colony.configPath" .) "replicas" $engineReplicas "replica_cpus" $engine.numCpus)
      "deployments" $deployments -}}
{{- $config := dict
      "proxy_location" "EveryNode"
      "http_options" (dict "host" "0.0.0.0" "port" $s.port)
      "applications" (list $app) -}}
{{- toYaml $config -}}
{{- end -}}
