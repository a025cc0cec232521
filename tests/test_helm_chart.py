"""The Helm chart helm/colony, checked offline (issue 14, item 5): every profile renders (Helm's own
library) and lints; the RayService validates against KubeRay's CRD schemas and every core kind
against Kubernetes' OpenAPI schemas (strict); the monitors have the shape Prometheus Operator needs;
serveConfigV2 parses with Ray Serve's ServeDeploySchema and the app builds from it in-process the way
Serve's controller builds it; and what users rely on: bad values fail naming the field, secrets
never appear in plain text outside Secrets, Redis always has a password, the external-Redis profile
runs no Redis, generated secrets survive `helm upgrade`, one dashboard ConfigMap per JSON file.

Not checked here (no cluster): ServiceMonitor/PodMonitor against their CRD schemas (not available
offline), image pulls, a real install, GPUs. docs/deploy.md says the same.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
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
    FakeKubeApi,
    Rendered,
    crd_validator,
    merge,
    profile_values,
    ray_pod_templates,
    render,
    render_against,
    schema_errors,
)

# Kubernetes versions the core kinds are validated against: the oldest the chart declares
# (Chart.yaml kubeVersion >=1.25) and the newest kubernetes-validate 1.37.0 ships.
K8S_VERSIONS = ("1.25.0", "1.37.0")
CORE_KINDS = {"ConfigMap", "Secret", "Service", "StatefulSet", "PodDisruptionBudget"}
MONITOR_KINDS = {"ServiceMonitor", "PodMonitor"}
SECRET_ENV = {"COLONY_API_TOKEN": "api-token", "COLONY_SECRET": "colony-secret"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return {profile: render(profile_values(profile)) for profile in PROFILES}


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
        assert {"RayService", "ConfigMap", "Secret", "Service", "PodDisruptionBudget"} <= set(kinds), profile
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
    api_service = out.one("Service", f"{RELEASE}-api")
    auth_secret = f"{RELEASE}-auth"

    monitor = out.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert _selects(monitor["spec"]["selector"]["matchLabels"], api_service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in api_service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # the API's /metrics needs the bearer token: read from the Secret, never written out
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": auth_secret, "key": "api-token"},
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


def test_services_and_budget_select_the_right_pods(rendered: dict[str, Rendered]) -> None:
    out = rendered["default"]
    templates = ray_pod_templates(out.one("RayService"))
    head = templates.pop("head")["metadata"]["labels"]
    api = out.one("Service", f"{RELEASE}-api")["spec"]
    # KubeRay sets ray.io/serve=true on the head pod once its Serve proxy is healthy
    assert api["selector"].pop("ray.io/serve") == "true"
    assert _selects(api["selector"], head)
    assert api["ports"][0]["targetPort"] == "serve"
    assert all(not _selects(api["selector"], t["metadata"]["labels"]) for t in templates.values())

    budget = out.one("PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert all(
        _selects(budget["selector"]["matchLabels"], t["metadata"]["labels"]) for t in templates.values()
    )
    assert not _selects(budget["selector"]["matchLabels"], head)

    redis_service = out.one("Service", f"{RELEASE}-redis")["spec"]
    redis_pod = out.one("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert _selects(redis_service["selector"], redis_pod)
    assert all(not _selects(redis_service["selector"], t["metadata"]["labels"]) for t in templates.values())


# --- serveConfigV2 and the app --------------------------------------------------------------------


def _serve_config(out: Rendered) -> dict[str, Any]:
    text = out.one("RayService")["spec"]["serveConfigV2"]
    assert isinstance(text, str), "KubeRay takes serveConfigV2 as a YAML string"
    return yaml.safe_load(text)  # type: ignore[no-any-return]


def _build_like_serve(app_config: Any) -> dict[str, Any]:
    """Build the application the way Serve's controller does for a config deploy
    (`build_serve_application`, then `override_deployment_info`): import the import_path, call it
    with the args, build the deployments, apply the config's per-deployment options."""
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve._private.build_app import build_app
    from ray.serve._private.deploy_utils import deploy_args_to_deployment_info

    try:
        application = call_user_app_builder_with_args_if_necessary(
            import_attr(app_config.import_path), app_config.args
        )
    except TypeError as exc:  # Serve's own check of the builder's signature
        raise AssertionError(
            f"Serve cannot build {app_config.import_path} from serveConfigV2: {exc} "
            "(an application builder takes exactly one parameter, the args dict)"
        ) from exc
    built = build_app(application, name=app_config.name)
    assert built.ingress_deployment_name == "ColonyAPI"
    infos = {
        deployment.name: deploy_args_to_deployment_info(
            deployment_name=deployment.name,
            deployment_config_proto_bytes=deployment._deployment_config.to_proto_bytes(),
            replica_config_proto_bytes=deployment._replica_config.to_proto_bytes(),
            deployer_job_id="offline",
            app_name=app_config.name,
        )
        for deployment in built.deployments
    }
    return override_deployment_info(infos, app_config)  # type: ignore[no-any-return]


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
    assert settings.serve.host == "0.0.0.0"
    data = next(m for m in head["containers"][0]["volumeMounts"] if m["name"] == "colony-data")
    assert settings.data_dir == Path(data["mountPath"])

    app.args["config"] = str(settings_file)
    infos = _build_like_serve(app)
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


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"workers": {"cpu": {"enabled": False}}}, "need a worker group"),
        ({"serve": {"engine": {"numGpus": 1}}}, "needs workers.gpu.enabled"),
        ({"redis": {"enabled": False}}, "set redis.external.url or redis.external.existingSecret"),
    ],
)
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


def test_secrets_never_appear_in_plain_text_outside_secrets() -> None:
    token, secret, password = "T" * 40 + "tok", "S" * 40 + "sec", "redispass0123456789"
    out = render(
        {"auth": {"apiToken": token, "colonySecret": secret}, "redis": {"auth": {"password": password}}}
    )
    for doc in out.docs:
        text = yaml.safe_dump(doc)
        if doc["kind"] != "Secret":
            for value in (token, secret, password):
                assert value not in text, f"{doc['kind']} {doc['metadata']['name']} holds a secret"
    auth = out.one("Secret", f"{RELEASE}-auth")
    assert base64.b64decode(auth["data"]["api-token"]).decode() == token
    assert base64.b64decode(auth["data"]["colony-secret"]).decode() == secret
    assert auth["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    redis_secret = out.one("Secret", f"{RELEASE}-redis")
    assert base64.b64decode(redis_secret["data"]["redis-password"]).decode() == password

    # every Ray container reads them from the Secrets
    for group, template in ray_pod_templates(out.one("RayService")).items():
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        for name, key in SECRET_ENV.items():
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-auth", "key": key}, group
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": f"{RELEASE}-redis",
            "key": "redis-password",
        }
        assert env["COLONY_REDIS_URL"]["value"] == f"redis://:$(REDIS_PASSWORD)@{RELEASE}-redis:6379/0"
        names = list(env)
        assert names.index("REDIS_PASSWORD") < names.index("COLONY_REDIS_URL"), (
            "kubelet expands earlier vars only"
        )


def test_existing_secrets_are_used_and_none_generated() -> None:
    out = render(
        {"auth": {"existingSecret": "my-colony-auth"}, "redis": {"auth": {"existingSecret": "my-redis"}}}
    )
    assert out.kinds("Secret") == []
    for template in ray_pod_templates(out.one("RayService")).values():
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        assert env["COLONY_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-colony-auth"
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"
    redis_env = {
        e["name"]: e for e in out.one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert redis_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"


def test_redis_runs_apart_with_a_password_and_an_fsynced_aof(rendered: dict[str, Rendered]) -> None:
    out = rendered["default"]
    statefulset = out.one("StatefulSet", f"{RELEASE}-redis")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    option = {args[i]: args[i + 1] for i in range(0, len(args), 2)}
    assert option["--requirepass"] == "$(REDIS_PASSWORD)"
    assert option["--appendonly"] == "yes" and option["--appendfsync"] == "always"
    assert option["--dir"] == "/data"
    env = {e["name"]: e for e in container["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "redis-password"
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    # not in a Ray pod: port 6379 of the Ray head is Ray's GCS
    for template in ray_pod_templates(out.one("RayService")).values():
        assert all("redis" not in c["image"] for c in template["spec"]["containers"])
    # and no way to turn the password off: the schema has no such value, an empty one is generated
    assert (
        "requirepass" not in yaml.safe_load((CHART / "values.schema.json").read_text())["properties"]["redis"]
    )


def test_external_redis_profile_runs_no_redis(rendered: dict[str, Rendered]) -> None:
    out = rendered["external-redis"]
    assert out.kinds("StatefulSet") == []
    assert {s["metadata"]["name"] for s in out.kinds("Service")} == {f"{RELEASE}-api"}
    assert [s["metadata"]["name"] for s in out.kinds("Secret")] == [f"{RELEASE}-auth"]
    for template in ray_pod_templates(out.one("RayService")).values():
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        assert env["COLONY_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "colony-redis-url",
            "key": "redis-url",
        }
        assert "REDIS_PASSWORD" not in env

    url = "rediss://:s3cret-pass-0123456789@redis.example:6380/0"
    by_value = render({"redis": {"enabled": False, "external": {"url": url}}})
    secret = by_value.one("Secret", f"{RELEASE}-redis-url")
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == url
    assert url not in yaml.safe_dump(by_value.one("RayService"))


def test_generated_secrets_survive_an_upgrade() -> None:
    """Helm's `lookup` against a Kubernetes API stand-in: the install generates the token, the
    colony secret and the Redis password; the upgrade finds them in the cluster and keeps them."""
    api = FakeKubeApi()
    with api.running():
        first = render_against(api, {}, upgrade=False)
        assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-auth" in api.requests, "lookup asked"
        for secret in first.kinds("Secret"):
            api.secrets[(NAMESPACE, secret["metadata"]["name"])] = secret
        upgraded = render_against(api, {"serve": {"engine": {"numReplicas": 3}}}, upgrade=True)
    for name in (f"{RELEASE}-auth", f"{RELEASE}-redis"):
        before, after = first.one("Secret", name)["data"], upgraded.one("Secret", name)["data"]
        assert before == after, name
        assert all(len(base64.b64decode(value)) >= 40 for value in before.values())
    # without the cluster's Secrets (a fresh install) the values are new: the lookup is what keeps them
    fresh = render()
    assert fresh.one("Secret", f"{RELEASE}-auth")["data"] != first.one("Secret", f"{RELEASE}-auth")["data"]


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
