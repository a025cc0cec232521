"""The Helm chart helm/colony, checked offline (issue 14, item 5): every profile renders (Helm's own
library) and lints; the RayService validates against KubeRay's CRD schemas and every core kind
against Kubernetes' OpenAPI schemas (strict); the monitors have the shape Prometheus Operator needs;
serveConfigV2 parses with Ray Serve's ServeDeploySchema and the app builds from it in-process the way
Serve's controller builds it; and what users rely on: bad values fail naming the field,
one dashboard ConfigMap per JSON file, disruption budgets that let drains proceed, the API through
KubeRay's serve Service, the Chroma server's chromadb being the client's pinned one. Secrets, Redis,
Chroma, NetworkPolicies and pod security: tests/test_helm_chart_security.py.

Not checked here (no cluster): ServiceMonitor/PodMonitor against their CRD schemas (not available
offline), image pulls, a real install, GPUs. docs/deploy.md says the same.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from helm_kit import (
    CHART,
    NAMESPACE,
    PROFILES,
    RELEASE,
    Rendered,
    build_like_serve,
    crd_validator,
    merge,
    profile_values,
    ray_pod_templates,
    render,
    rendered_profiles,
    schema_errors,
)

# Kubernetes versions the core kinds are validated against: the oldest the chart declares
# (Chart.yaml kubeVersion >=1.25) and the newest kubernetes-validate 1.37.0 ships.
K8S_VERSIONS = ("1.25.0", "1.37.0")
CORE_KINDS = {"ConfigMap", "Secret", "Service", "StatefulSet", "PodDisruptionBudget", "NetworkPolicy"}
MONITOR_KINDS = {"ServiceMonitor", "PodMonitor"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return rendered_profiles()


# --- rendering, lint, schemas -------------------------------------------------------------------


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_profile_lints_clean(profile: str) -> None:
    report = helm.lint(CHART, profile_values(profile), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert report["total_charts_linted"] == 1
    assert problems == [], problems


def test_every_profile_renders_the_expected_kinds(rendered: dict[str, Rendered]) -> None:
    for profile, out in rendered.items():
        kinds = sorted({doc["kind"] for doc in out.docs})
        assert {"RayService", "ConfigMap", "Secret", "NetworkPolicy"} <= set(kinds), profile
        assert set(kinds) <= CORE_KINDS | MONITOR_KINDS | {"RayService"}, (profile, kinds)
        assert out.notes.count("kubectl") >= 3, "NOTES.txt tells how to get the token and reach the API"
    assert {d["kind"] for d in rendered["gpu-vllm"].docs} >= MONITOR_KINDS


def test_rayservice_validates_against_the_kuberay_crds(rendered: dict[str, Rendered]) -> None:
    service_schema = crd_validator("ray.io_rayservices.yaml")
    cluster_spec = crd_validator("ray.io_rayclusters.yaml", part="spec")
    for profile, out in rendered.items():
        rayservice = out.one("RayService")
        assert rayservice["apiVersion"] == "ray.io/v1"
        assert schema_errors(service_schema, rayservice) == [], profile
        # a RayService's rayClusterConfig is a RayCluster spec: the cluster KubeRay creates from it
        assert schema_errors(cluster_spec, rayservice["spec"]["rayClusterConfig"]) == [], profile


def test_crd_check_catches_a_misplaced_field(rendered: dict[str, Rendered]) -> None:
    """The CRD check is strict: a field the schema does not list fails (the API server would drop it)."""
    rayservice = yaml.safe_load(yaml.safe_dump(rendered["default"].one("RayService")))
    rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    errors = schema_errors(crd_validator("ray.io_rayservices.yaml"), rayservice)
    assert any("rayStartParam" in e for e in errors), errors
    assert any("workerGroupSpecs/0/replicas" in e for e in errors), errors


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_kinds_validate_strictly(rendered: dict[str, Rendered], version: str) -> None:
    checked: set[str] = set()
    for profile, out in rendered.items():
        documents = [doc for doc in out.docs if doc["kind"] in CORE_KINDS]
        # the Ray pods' templates too: KubeRay copies them into Pods
        for group, template in ray_pod_templates(out.one("RayService")).items():
            name = f"{out.one('RayService')['metadata']['name']}-{group}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**template["metadata"], "name": name},
                "spec": template["spec"],
            }
            documents.append(pod)
        for doc in documents:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = "/".join(map(str, exc.absolute_path))
                pytest.fail(f"{profile}: {doc['kind']} {doc['metadata']['name']} at {path}: {exc.message}")
            checked.add(doc["kind"])
    assert checked == CORE_KINDS | {"Pod"}


def test_core_kind_check_is_strict() -> None:
    """The strict check rejects a field Kubernetes does not know (so the test above can fail)."""
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80}], "selectorr": {"a": "b"}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_monitors_have_the_prometheus_operator_shape(rendered: dict[str, Rendered]) -> None:
    """No ServiceMonitor/PodMonitor schema offline: check the fields Prometheus Operator reads."""
    out = rendered["gpu-vllm"]
    # the Service it scrapes is KubeRay's <name>-serve-svc, made from spec.serveService
    api_service = out.one("RayService")["spec"]["serveService"]
    auth_secret = f"{RELEASE}-auth"

    monitor = out.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert _selects(monitor["spec"]["selector"]["matchLabels"], api_service["metadata"]["labels"])
    assert not out.kinds("Service") or not any(
        _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        for s in out.kinds("Service")
    ), "the monitor selects only the serve Service (one cluster's pods), no Service of the chart"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in api_service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # /metrics with the metrics-only token (accepted nowhere else), read from the Secret
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": auth_secret, "key": "metrics-token"},
    }
    assert {"action": "replace", "targetLabel": "cluster", "replacement": RELEASE} in endpoint["relabelings"]

    pod_monitor = out.one("PodMonitor")
    assert pod_monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert {"action": "replace", "targetLabel": "cluster", "replacement": RELEASE} in pod_endpoint[
        "relabelings"
    ]
    expressions = {e["key"]: set(e["values"]) for e in pod_monitor["spec"]["selector"]["matchExpressions"]}
    for group, template in ray_pod_templates(out.one("RayService")).items():
        labels = template["metadata"]["labels"]
        assert all(labels.get(key) in values for key, values in expressions.items()), group
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert ports.get(pod_endpoint["port"]) == 8080, f"{group} exposes Ray's metrics port by name"

    custom = render(merge(profile_values("gpu-vllm"), {"metrics": {"cluster": "eu-prod"}}))
    relabels = custom.one("ServiceMonitor")["spec"]["endpoints"][0]["relabelings"]
    assert {"action": "replace", "targetLabel": "cluster", "replacement": "eu-prod"} in relabels
    assert not rendered["default"].kinds("ServiceMonitor") and not rendered["default"].kinds("PodMonitor")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_the_api_is_kuberays_serve_service_where_the_proxies_run(rendered: dict[str, Rendered]) -> None:
    """The API is reached through KubeRay's <name>-serve-svc (spec.serveService: our labels, type,
    port; KubeRay sets its selector to the active cluster's pods, so an upgrade never splits traffic
    across two clusters), no Service of the chart selects Ray pods, and Serve's HTTP proxy listens
    on the port the Service targets on every pod it can select."""
    for profile, out in rendered.items():
        rayservice = out.one("RayService")
        serve_service = rayservice["spec"]["serveService"]
        assert "selector" not in serve_service["spec"], "KubeRay sets the selector; ours would be ignored"
        assert serve_service["metadata"]["labels"]["app.kubernetes.io/component"] == "api"
        (port,) = serve_service["spec"]["ports"]
        assert port["name"] == "serve" and port["targetPort"] == "serve" and port["port"] == 8000
        templates = ray_pod_templates(rayservice)
        for service in out.kinds("Service"):
            # KubeRay adds ray.io/* labels to the pods at run time (ray.io/serve on every pod with a
            # healthy proxy, in both clusters during an upgrade): a selector on them selects too
            selector = {k: v for k, v in service["spec"]["selector"].items() if not k.startswith("ray.io/")}
            assert not any(_selects(selector, t["metadata"]["labels"]) for t in templates.values()), (
                f"{service['metadata']['name']} selects Ray pods of whichever cluster: use the serve Service"
            )
        # the proxy: on every node (KubeRay marks each pod whose proxy is healthy), on the port named serve
        config = _serve_config(out)
        assert config["proxy_location"] == "EveryNode", profile
        head_ports = {
            p["name"]: p["containerPort"] for p in templates["head"]["spec"]["containers"][0]["ports"]
        }
        assert head_ports["serve"] == config["http_options"]["port"], profile
        settings = yaml.safe_load(out.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
        assert settings["serve"]["port"] == config["http_options"]["port"], "the settings and Serve agree"
    custom = render({"serve": {"port": 9000}, "service": {"type": "LoadBalancer", "annotations": {"a": "b"}}})
    serve_service = custom.one("RayService")["spec"]["serveService"]
    assert serve_service["spec"]["type"] == "LoadBalancer" and serve_service["metadata"]["annotations"] == {
        "a": "b"
    }
    assert (
        yaml.safe_load(custom.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])["serve"]["port"]
        == 9000
    )
    assert _serve_config(custom)["http_options"]["port"] == 9000
    assert f"svc/{RELEASE}-serve-svc" in custom.notes and f"{RELEASE}-api" not in custom.notes


def test_redis_service_selects_only_redis(rendered: dict[str, Rendered]) -> None:
    out = rendered["default"]
    templates = ray_pod_templates(out.one("RayService"))
    redis_service = out.one("Service", f"{RELEASE}-redis")["spec"]
    redis_pod = out.one("StatefulSet", f"{RELEASE}-redis")["spec"]["template"]["metadata"]["labels"]
    assert _selects(redis_service["selector"], redis_pod)
    assert all(not _selects(redis_service["selector"], t["metadata"]["labels"]) for t in templates.values())


@pytest.mark.parametrize(
    ("values", "budgets"),
    [
        ({}, {}),  # one CPU worker: a budget could only block drains
        ({"workers": {"cpu": {"replicas": 3, "maxReplicas": 4}}}, {"cpu": 2}),
        ({"workers": {"cpu": {"replicas": 2}}, "podDisruptionBudget": {"enabled": False}}, {}),
        (profile_values("cpu"), {"cpu": 1}),
        # the autoscaler may take the GPU group down to minReplicas 2; the CPU group to 1 pod
        (profile_values("gpu-vllm"), {"gpu": 1}),
        (merge(profile_values("gpu-vllm"), {"workers": {"gpu": {"minReplicas": 1}}}), {}),
    ],
)
def test_disruption_budgets_let_drains_proceed(values: dict[str, Any], budgets: dict[str, int]) -> None:
    """Ray pods are owned by a RayCluster (no scale subresource): with maxUnavailable or a percentage
    the disruption controller allows 0 evictions and every drain hangs. So an integer minAvailable of
    N-1 per worker group of N pods, and no budget where N could be 1."""
    out = render(values)
    found = {}
    templates = ray_pod_templates(out.one("RayService"))
    for budget in out.kinds("PodDisruptionBudget"):
        spec = budget["spec"]
        assert set(spec) == {"minAvailable", "selector"}, "no maxUnavailable: it blocks every eviction here"
        assert isinstance(spec["minAvailable"], int) and spec["minAvailable"] >= 1
        selected = [
            g
            for g, t in templates.items()
            if _selects(spec["selector"]["matchLabels"], t["metadata"]["labels"])
        ]
        assert len(selected) == 1 and selected[0] != "head", selected
        found[selected[0].removesuffix("-workers")] = spec["minAvailable"]
    assert found == budgets


# --- serveConfigV2 and the app --------------------------------------------------------------------


def _serve_config(out: Rendered) -> dict[str, Any]:
    text = out.one("RayService")["spec"]["serveConfigV2"]
    assert isinstance(text, str), "KubeRay takes serveConfigV2 as a YAML string"
    return yaml.safe_load(text)  # type: ignore[no-any-return]


@pytest.mark.parametrize("profile", list(PROFILES))
def test_serve_config_parses_and_the_app_builds_from_it(
    profile: str, rendered: dict[str, Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.serve.schema import ServeDeploySchema

    from colony.config import load_settings

    out = rendered[profile]
    config = ServeDeploySchema.model_validate(_serve_config(out))
    assert config.http_options.host == "0.0.0.0" and config.http_options.port == 8000
    (app,) = config.applications
    assert app.import_path == "colony.serve.app:build_app"
    # the args build_app reads (a misspelt one would be ignored without a word)
    assert set(app.args) == {"config", "replicas", "replica_cpus"}

    # the settings file the pods mount, at the path args.config names
    configmap = out.one("ConfigMap", f"{RELEASE}-config")
    mounted = Path(app.args["config"])
    head = ray_pod_templates(out.one("RayService"))["head"]["spec"]
    mount = next(m for m in head["containers"][0]["volumeMounts"] if m["name"] == "colony-config")
    assert mounted.parent == Path(mount["mountPath"]) and mounted.name in configmap["data"]
    settings_file = tmp_path / mounted.name
    settings_file.write_text(configmap["data"][mounted.name])

    # the process environment of a Ray pod: the variables the chart sets, with stand-in values
    for name in [n for n in os.environ if n.startswith("COLONY_")]:
        monkeypatch.delenv(name)
    for name in _ray_env_names(out):
        monkeypatch.setenv(
            name,
            "redis://:pw-0123456789abcdef@redis:6379/0"
            if name == "COLONY_REDIS_URL"
            else str(settings_file)
            if name == "COLONY_CONFIG"
            else "x" * 40,
        )
    settings = load_settings(settings_file)  # unknown keys or env names would raise ConfigError
    assert settings.api_token is not None and settings.secret is not None and settings.redis_url
    assert settings.api.metrics_token is not None, "the metrics token reaches the settings from the env"
    assert settings.serve.host == "0.0.0.0"
    # agent memory: every replica uses the release's Chroma server and starts none of its own
    assert settings.memory.chroma_url == f"http://{RELEASE}-chroma:8000"
    assert settings.memory.chroma.enabled is False
    data = next(m for m in head["containers"][0]["volumeMounts"] if m["name"] == "colony-data")
    assert settings.data_dir == Path(data["mountPath"])

    app.args["config"] = str(settings_file)
    infos = build_like_serve(app)
    assert set(infos) == {d.name for d in app.deployments} == {"ColonyAPI", "AgentSystem", "EngineReplica"}
    engine = infos["EngineReplica"]
    if profile == "gpu-vllm":
        assert settings.engine.kind == "vllm"
        assert engine.replica_config.ray_actor_options["num_gpus"] == 1
        assert engine.deployment_config.autoscaling_config is not None
        assert engine.deployment_config.autoscaling_config.min_replicas == 2
    else:
        assert settings.engine.kind == "embedded"
        assert not engine.replica_config.ray_actor_options.get("num_gpus")
        assert engine.deployment_config.autoscaling_config is None
    assert infos["AgentSystem"].deployment_config.num_replicas == 1


def _ray_env_names(out: Rendered) -> set[str]:
    names: set[str] = set()
    for template in ray_pod_templates(out.one("RayService")).values():
        names |= {env["name"] for env in template["spec"]["containers"][0]["env"]}
    return {name for name in names if name.startswith("COLONY_")}


def test_values_schema_is_the_generated_one() -> None:
    """values.schema.json is what helm/values_schema.py writes (its `colony:` block is derived from
    ColonySettings): a new or changed setting needs the generator run again."""
    spec = importlib.util.spec_from_file_location("values_schema", CHART.parent / "values_schema.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    committed = json.loads((CHART / "values.schema.json").read_text())
    assert committed == generator.schema(), "run: .venv/bin/python helm/values_schema.py"


def test_colony_block_accepts_only_settings_and_no_secrets() -> None:
    """values.schema.json's `colony` block lists settings of ColonySettings, never the secret ones."""
    from colony.config import ColonySettings

    block = json.loads((CHART / "values.schema.json").read_text())["properties"]["colony"]
    keys = set(block["properties"])
    assert keys <= set(ColonySettings.model_fields), keys - set(ColonySettings.model_fields)
    assert not keys & {"api_token", "secret", "redis_url"}
    assert "api_key" not in block["properties"]["engine"]["properties"]
    assert "metrics_token" not in block["properties"]["api"]["properties"]
    assert "metrics_token" in ColonySettings.model_fields["api"].annotation.model_fields  # type: ignore[union-attr]
    # serve.port is the chart's serve.port, written into the settings: no second value to disagree
    assert "port" not in block["properties"]["serve"]["properties"]
    assert block["additionalProperties"] is False
    assert all(
        section.get("additionalProperties") is False
        for section in block["properties"].values()
        if "properties" in section
    )


# --- what users rely on -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"serve": {"engine": {"numReplicas": 0}}}, "/serve/engine/numReplicas"),
        ({"serve": {"api": {"numReplicas": 0}}}, "/serve/api/numReplicas"),
        ({"replicas": 2}, "additional properties 'replicas'"),
        ({"serve": {"engine": {"replicaz": 2}}}, "additional properties 'replicaz'"),
        ({"colony": {"api_token": "t" * 40}}, "additional properties 'api_token'"),
        ({"colony": {"redis_url": "redis://:p@h:6379/0"}}, "additional properties 'redis_url'"),
        ({"colony": {"engine": {"modle": "x"}}}, "additional properties 'modle'"),
        ({"colony": {"engine": {"api_key": "sk-plain"}}}, "additional properties 'api_key'"),
        ({"colony": {"runs": {"retention_seconds": 0}}}, "/colony/runs/retention_seconds"),
        ({"colony": {"engine": {"kind": "gpt"}}}, "/colony/engine/kind"),
        ({"colony": {"data_dir": "relative/dir"}}, "/colony/data_dir"),
        ({"colony": {"agents": {"Bad Name": "pkg.mod:make"}}}, "'Bad Name' does not match"),
        ({"colony": {"agents": {"mine": "not an import path"}}}, "/colony/agents/mine"),
        ({"redis": {"auth": {"password": "short"}}}, "/redis/auth/password"),
        ({"redis": {"auth": {"password": "has@and/in-it-0123456789"}}}, "/redis/auth/password"),
        ({"redis": {"external": {"url": "redis://nopassword:6379/0"}}}, "/redis/external/url"),
        ({"redis": {"appendfsync": "sometimes"}}, "/redis/appendfsync"),
        ({"image": {"pullPolicy": "Maybe"}}, "/image/pullPolicy"),
        ({"auth": {"apiToken": "short"}}, "/auth/apiToken"),
        ({"auth": {"existingSecret": "Not_A_Name"}}, "/auth/existingSecret"),
        ({"rayVersion": "latest"}, "/rayVersion"),
        ({"workers": {"gpu": {"gpusPerPod": 0}}}, "/workers/gpu/gpusPerPod"),
        ({"extraEnv": [{"name": "COLONY_API_TOKEN", "value": "plain"}]}, "/extraEnv/0/name"),
        # pydantic-settings reads env names whatever their case
        ({"extraEnv": [{"name": "colony_api_token", "value": "plain"}]}, "/extraEnv/0/name"),
        ({"extraEnv": [{"name": "Colony_Redis_Url", "value": "redis://x"}]}, "/extraEnv/0/name"),
        ({"extraEnv": [{"name": "COLONY_API__METRICS_TOKEN", "value": "plain"}]}, "/extraEnv/0/name"),
        # a secret-looking variable only from a Secret
        ({"extraEnv": [{"name": "COLONY_ENGINE__API_KEY", "value": "sk-plain"}]}, "/extraEnv/0"),
        ({"extraEnv": [{"name": "HF_token", "value": "hf_plain"}]}, "/extraEnv/0"),
        ({"colony": {"api": {"metrics_token": "m" * 40}}}, "additional properties 'metrics_token'"),
        ({"auth": {"metricsToken": "short"}}, "/auth/metricsToken"),
        # names: DNS-1035 (the RayService's), anchored at both ends
        ({"nameOverride": "Evil x"}, "/nameOverride"),
        ({"nameOverride": "evil: x"}, "/nameOverride"),
        ({"fullnameOverride": "Evil-ok"}, "/fullnameOverride"),
        ({"fullnameOverride": "1colony"}, "/fullnameOverride"),
        # Serve's port and Ray's, the settings' serve.port (the chart derives it)
        ({"serve": {"routePrefix": "/colony"}}, "/serve/routePrefix"),  # monitors and clients use "/"
        ({"serve": {"port": 8265}}, "/serve/port"),
        ({"serve": {"port": 6379}}, "/serve/port"),
        ({"serve": {"port": 10001}}, "/serve/port"),
        ({"serve": {"port": 12000}}, "/serve/port"),
        ({"colony": {"serve": {"port": 9000}}}, "additional properties 'port'"),
        # data_dir (an emptyDir mount) over a folder the pod needs
        ({"colony": {"data_dir": "/etc/colony"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/home/ray"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/home"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/usr/lib/colony"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/var/lib/../../etc"}}, "/colony/data_dir"),
        ({"colony": {"data_dir": "/dev/shm"}}, "/colony/data_dir"),
        # KubeRay ignores these since v1.1 (the CRD marks them deprecated, unused)
        ({"rayService": {"serviceUnhealthySecondThreshold": 900}}, "serviceUnhealthySecondThreshold"),
        ({"podDisruptionBudget": {"maxUnavailable": 1}}, "additional properties 'maxUnavailable'"),
        ({"rayAuth": {"existingSecret": "Bad_Name"}}, "/rayAuth/existingSecret"),
        # agent memory: the chart writes the Chroma URL; an external one is a plain URL (a ConfigMap)
        ({"colony": {"memory": {"chroma_url": "http://x:8000"}}}, "additional properties 'chroma_url'"),
        ({"colony": {"memory": {"chroma": {"enabled": True}}}}, "additional properties 'chroma'"),
        (
            {"memory": {"chroma": {"external": {"url": "http://u:pw@chroma:8000"}}}},
            "/memory/chroma/external/url",
        ),
        ({"memory": {"chroma": {"external": {"url": "chroma:8000"}}}}, "/memory/chroma/external/url"),
        ({"memory": {"chroma": {"port": 80}}}, "/memory/chroma/port"),
        ({"memory": {"chroma": {"persistence": {"size": "lots"}}}}, "/memory/chroma/persistence/size"),
        ({"memory": {"chroma": {"image": {"tag": "latest!"}}}}, "/memory/chroma/image/tag"),
        # the sandbox switch takes a seccomp profile kind, nothing else
        (
            {"sandbox": {"userNamespaces": True, "seccompProfile": {"type": "Privileged"}}},
            "/sandbox/seccompProfile/type",
        ),
        (
            {"sandbox": {"userNamespaces": "yes", "seccompProfile": {"type": "Unconfined"}}},
            "/sandbox/userNamespaces",
        ),
    ],
)
def test_values_schema_rejects_bad_values_naming_the_field(values: dict[str, Any], field: str) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError) as exc:
            chart.validate_schema(values)
        assert field in str(exc.value)
        # `helm install` checks the same schema before rendering
        with pytest.raises(helm.HelmValuesError, match="schema"):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_a_release_name_that_is_no_dns_1035_label_fails() -> None:
    """KubeRay refuses a RayService whose name does not start with a letter: say so at install."""
    with pytest.raises(helm.HelmRenderError, match="DNS-1035"):
        render(release="1st")
    assert (
        render({"fullnameOverride": "first"}, release="1st").one("RayService")["metadata"]["name"] == "first"
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"workers": {"cpu": {"enabled": False}}}, "need a worker group"),
        ({"serve": {"engine": {"numGpus": 1}}}, "needs workers.gpu.enabled"),
        ({"redis": {"enabled": False}}, "set redis.external.url or redis.external.existingSecret"),
        (
            {"workers": {"cpu": {"minReplicas": 3, "maxReplicas": 2, "replicas": 2}}},
            "minReplicas \\(3\\) is above",
        ),
        ({"workers": {"cpu": {"replicas": 5, "maxReplicas": 4}}}, "replicas \\(5\\) is outside"),
        (
            {"serve": {"engine": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 2}}}},
            "autoscaling.minReplicas \\(3\\) is above maxReplicas",
        ),
        ({"head": {"rayStartParams": {"num-cpus": "4"}}}, "head.rayStartParams.num-cpus is set by the chart"),
        ({"head": {"rayStartParams": {"dashboard-host": "127.0.0.1"}}}, "dashboard-host is set by the chart"),
        ({"memory": {"enabled": False}}, "set memory.chroma.external.url"),
        ({"memory": {"chroma": {"external": {"url": "http://c:8000"}}}}, "while memory.enabled is true"),
        (
            {"memory": {"chroma": {"image": {"repository": "chromadb/chroma"}}}},
            "without memory.chroma.image.tag",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


def test_one_dashboard_configmap_per_json_file(rendered: dict[str, Rendered], tmp_path: Path) -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    configmaps = [
        c for c in rendered["default"].kinds("ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    assert len(configmaps) == len(files)
    if files:  # the dashboards are generated from colony's metrics (issue 14 item 3): five of them
        assert len(files) == 5
        contents = {key: value for c in configmaps for key, value in c["data"].items()}
        assert contents == {f.name: f.read_text() for f in files}

    # zero files render none; many render one each, labelled for Grafana's sidecar
    chart = tmp_path / "colony"
    shutil.copytree(CHART, chart)
    (chart / "dashboards").mkdir(exist_ok=True)  # git keeps no empty folder
    for old in (chart / "dashboards").glob("*.json"):
        old.unlink()
    assert [
        c for c in render(chart=chart).kinds("ConfigMap") if c["metadata"]["name"] != f"{RELEASE}-config"
    ] == []
    boards = {"colony-overview.json": '{"title": "Overview"}', "colony_pages.json": '{"title": "Pages"}'}
    for name, text in boards.items():
        (chart / "dashboards" / name).write_text(text)
    out = render({"dashboards": {"label": "grafana.com/dashboard", "labelValue": "yes"}}, chart=chart)
    made = [c for c in out.kinds("ConfigMap") if c["metadata"]["name"] != f"{RELEASE}-config"]
    assert sorted(c["metadata"]["name"] for c in made) == [
        f"{RELEASE}-dashboard-overview",
        f"{RELEASE}-dashboard-pages",
    ]
    assert all(c["metadata"]["labels"]["grafana.com/dashboard"] == "yes" for c in made)
    assert {k: v for c in made for k, v in c["data"].items()} == boards
    assert not [
        c
        for c in render({"dashboards": {"enabled": False}}, chart=chart).kinds("ConfigMap")
        if c["metadata"]["name"] != f"{RELEASE}-config"
    ]


def test_what_an_upgrade_changes(rendered: dict[str, Rendered]) -> None:
    """A serve-only change leaves rayClusterConfig alone (KubeRay applies it in place); a change of
    Colony's settings changes the pods' checksum, so KubeRay starts a new cluster with them."""
    base = rendered["default"].one("RayService")["spec"]
    scaled = render({"serve": {"engine": {"numReplicas": 3}}}).one("RayService")["spec"]
    assert scaled["serveConfigV2"] != base["serveConfigV2"]
    assert scaled["rayClusterConfig"] == base["rayClusterConfig"]
    resettled = render({"colony": {"log_level": "DEBUG"}}).one("RayService")["spec"]
    assert resettled["serveConfigV2"] == base["serveConfigV2"]
    for group, template in ray_pod_templates({"spec": resettled}).items():
        before = ray_pod_templates({"spec": base})[group]["metadata"]["annotations"]["checksum/colony-config"]
        assert template["metadata"]["annotations"]["checksum/colony-config"] != before, group


def test_head_runs_no_replicas_and_gpu_workers_get_gpus(rendered: dict[str, Rendered]) -> None:
    for profile, out in rendered.items():
        cluster = out.one("RayService")["spec"]["rayClusterConfig"]
        assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", profile
        images = {
            c["image"]
            for t in ray_pod_templates(out.one("RayService")).values()
            for c in t["spec"]["containers"]
        }
        assert images == {"colony:0.1.0-gpu" if profile == "gpu-vllm" else "colony:0.1.0-cpu"}, profile
    groups = {
        g["groupName"]: g
        for g in rendered["gpu-vllm"].one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    }
    gpu = groups["gpu-workers"]["template"]["spec"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == gpu["requests"]["nvidia.com/gpu"] == "1"
    assert (
        "nvidia.com/gpu"
        not in groups["cpu-workers"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    )


def test_gpu_profile_mounts_the_model_weights_where_engine_model_points(
    rendered: dict[str, Rendered],
) -> None:
    """docker/Dockerfile.gpu ships no weights: the GPU workers mount them where engine.model says."""
    out = rendered["gpu-vllm"]
    model = Path(
        yaml.safe_load(out.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])["engine"]["model"]
    )
    templates = ray_pod_templates(out.one("RayService"))
    mounts = [Path(m["mountPath"]) for m in templates["gpu-workers"]["spec"]["containers"][0]["volumeMounts"]]
    assert any(model.is_relative_to(mount) for mount in mounts if mount != Path("/dev/shm")), (model, mounts)
    volumes = {v["name"]: v for v in templates["gpu-workers"]["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "colony-models", "readOnly": True}
    assert "models" not in {v["name"] for v in templates["head"]["spec"]["volumes"]}


# --- the hostile review's findings (issue 14) --------------------------------------------------------


# --- agent memory's Chroma server (M11; its pod, probes, NetworkPolicy, an external one: the security tests)


def test_the_chroma_server_is_the_clients_chromadb(rendered: dict[str, Rendered]) -> None:
    """Chroma's server and client are one version (its HTTP API and on-disk format change between
    releases): pyproject.toml pins chromadb exactly in the default install, so every image built
    from it has that version; the venv runs it; the chart's Chroma runs the Ray pods' image; and
    every version the chart and docs/deploy.md name is that pin."""
    project = tomllib.loads((CHART.parent.parent / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["dependencies"] if re.match(r"chromadb\s*[=<>~!]", r)]
    assert len(pins) == 1 and re.fullmatch(r"chromadb==[0-9]+\.[0-9]+\.[0-9]+", pins[0]), pins
    version = pins[0].removeprefix("chromadb==")
    assert importlib.metadata.version("chromadb") == version
    for profile, out in rendered.items():
        (chroma,) = out.one("StatefulSet", f"{RELEASE}-chroma")["spec"]["template"]["spec"]["containers"]
        ray = {
            c["image"]
            for t in ray_pod_templates(out.one("RayService")).values()
            for c in t["spec"]["containers"]
        }
        assert ray == {chroma["image"]}, profile
    texts = [p.read_text() for p in (CHART / "templates").glob("*") if p.is_file()]
    texts += [(CHART / "values.yaml").read_text(), (CHART.parent.parent / "docs" / "deploy.md").read_text()]
    named = {
        v for text in texts for v in re.findall(r"(?i)chroma(?:db)?(?:==|:| )([0-9]+\.[0-9]+\.[0-9]+)", text)
    }
    assert named == {version}, f"the chart and docs name Chroma {named}, the pin is {version}"
    own = render({"memory": {"chroma": {"image": {"repository": "chromadb/chroma", "tag": version}}}})
    (chroma,) = own.one("StatefulSet", f"{RELEASE}-chroma")["spec"]["template"]["spec"]["containers"]
    assert chroma["image"] == f"chromadb/chroma:{version}"
