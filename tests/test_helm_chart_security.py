"""The Helm chart's security and disruption properties, checked offline (issue 14 and its hostile
review): secrets never in plain text outside Secrets (nor on Redis's command line: its start script
runs here on a real redis-server), existing secrets used and generated ones kept across `helm
upgrade`, a changed secret rolls the pods that read it, Redis apart with a password and an fsynced
AOF (none with an external Redis), the service account token only where Ray's autoscaler needs it,
NetworkPolicies evaluated with Kubernetes' semantics, Ray's token auth, pods unprivileged; agent
memory's Chroma server (M11): its start command run here on the real `chroma` CLI (in bubblewrap,
as the pod's user on a read-only root), its probes,
only the release's Ray pods reaching it, the settings pointing every replica at it or at an
external one. The rendering, schema and serve-config checks are in tests/test_helm_chart.py."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_kit import (
    CHART,
    NAMESPACE,
    PROFILES,
    RELEASE,
    SECRET_ENV,
    FakeKubeApi,
    Peer,
    Rendered,
    crd_validator,
    free_port,
    ingress_allowed,
    profile_values,
    ray_pod_templates,
    render,
    render_against,
    rendered_profiles,
    schema_errors,
    selector_matches,
    server_process,
)


@pytest.fixture(scope="module")
def rendered() -> dict[str, Rendered]:
    return rendered_profiles()


def test_secrets_never_appear_in_plain_text_outside_secrets() -> None:
    token, secret, password = "T" * 40 + "tok", "S" * 40 + "sec", "redispass0123456789"
    metrics = "M" * 40 + "met"
    out = render(
        {
            "auth": {"apiToken": token, "colonySecret": secret, "metricsToken": metrics},
            "redis": {"auth": {"password": password}},
        }
    )
    for doc in out.docs:
        text = yaml.safe_dump(doc)
        if doc["kind"] != "Secret":
            for value in (token, secret, password, metrics):
                assert value not in text, f"{doc['kind']} {doc['metadata']['name']} holds a secret"
    auth = out.one("Secret", f"{RELEASE}-auth")
    assert base64.b64decode(auth["data"]["api-token"]).decode() == token
    assert base64.b64decode(auth["data"]["colony-secret"]).decode() == secret
    assert base64.b64decode(auth["data"]["metrics-token"]).decode() == metrics
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
        assert env["COLONY_API__METRICS_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "my-colony-auth",
            "key": "metrics-token",
        }
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"
    redis_pod = out.one("StatefulSet", f"{RELEASE}-redis")["spec"]["template"]["spec"]
    redis_env = {e["name"]: e for e in redis_pod["containers"][0]["env"]}
    assert redis_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"


def test_redis_runs_apart_with_a_password_and_an_fsynced_aof(rendered: dict[str, Rendered]) -> None:
    out = rendered["default"]
    statefulset = out.one("StatefulSet", f"{RELEASE}-redis")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    option = {args[i]: args[i + 1] for i in range(0, len(args), 2)}
    assert option["--appendonly"] == "yes" and option["--appendfsync"] == "always"
    assert option["--dir"] == "/data"
    # the password is in no argument: the start script writes it into a file (next test runs it)
    assert not any("PASSWORD" in part or "requirepass" in part for part in args)
    assert "requirepass" in container["command"][2] and "$(REDIS_PASSWORD)" not in container["command"][2]
    env = {e["name"]: e for e in container["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "redis-password"
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    # not in a Ray pod: port 6379 of the Ray head is Ray's GCS
    for template in ray_pod_templates(out.one("RayService")).values():
        assert all(
            "redis" not in c["image"] and "valkey" not in c["image"] for c in template["spec"]["containers"]
        )
    # and no way to turn the password off: the schema has no such value, an empty one is generated
    assert (
        "requirepass" not in yaml.safe_load((CHART / "values.schema.json").read_text())["properties"]["redis"]
    )


def test_redis_start_script_keeps_the_password_off_the_command_line(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """The StatefulSet's command and args, run here as the kubelet would (sh, a real redis-server):
    the password is on no process's command line, its file is mode 0600, and the server requires it.
    A password a config file could misread is refused before the server starts."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    def connect(password: str | None) -> redis.Redis:
        return redis.Redis(port=port, password=password, socket_timeout=5, retry=Retry(NoBackoff(), 0))

    statefulset = rendered["default"].one("StatefulSet", f"{RELEASE}-redis")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "auth-conf")
    run_dir, data = tmp_path / "run", tmp_path / "data"
    run_dir.mkdir()
    data.mkdir()
    port = free_port()
    # the pod's paths and port, moved into tmp_path
    script = container["command"][2].replace(mount, str(run_dir))
    args = [str(data) if a == "/data" else str(port) if a == "6379" else a for a in container["args"]]
    argv = [*container["command"][:2], script, *container["command"][3:], *args]
    assert shutil.which("redis-server", path=str(Path(sys.executable).parent)), "the venv's redis-server"
    path_env = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    password = "chart-pass-0123456789_~.x"

    bad = subprocess.run(
        argv, env={"PATH": path_env, "REDIS_PASSWORD": "has space and $"}, capture_output=True, timeout=30
    )
    assert bad.returncode == 1 and b"characters other than" in bad.stderr

    # its own process group, so that cleanup reaches whatever the script started
    with server_process(argv, {"PATH": path_env, "REDIS_PASSWORD": password}, port, timeout=20) as server:
        client = connect(password)
        assert client.ping()
        with pytest.raises(redis.AuthenticationError):
            connect("wrong-password-0123456").ping()
        with pytest.raises(redis.RedisError, match=r"(?i)auth"):
            connect(None).ping()
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        # exec'd: the server is the process the kubelet started (it gets SIGTERM), and no process
        # has the password on its command line
        executable = Path(os.readlink(f"/proc/{server.pid}/exe")).name
        assert executable.startswith("redis-server"), (
            f"the kubelet's process runs {executable}, not the server"
        )
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                assert password.encode() not in (proc / "cmdline").read_bytes(), proc
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        assert oct((run_dir / "auth.conf").stat().st_mode & 0o777) == "0o600"


def test_external_redis_profile_runs_no_redis(rendered: dict[str, Rendered]) -> None:
    out = rendered["external-redis"]
    # the Chroma server (agent memory) still runs here; nothing of Redis does
    assert [s["metadata"]["name"] for s in out.kinds("StatefulSet")] == [f"{RELEASE}-chroma"]
    assert [s["metadata"]["name"] for s in out.kinds("Service")] == [f"{RELEASE}-chroma"]
    assert f"{RELEASE}-redis" not in {p["metadata"]["name"] for p in out.kinds("NetworkPolicy")}
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
    assert set(first.one("Secret", f"{RELEASE}-auth")["data"]) == {
        "api-token",
        "colony-secret",
        "metrics-token",
    }
    for name in (f"{RELEASE}-auth", f"{RELEASE}-redis"):
        before, after = first.one("Secret", name)["data"], upgraded.one("Secret", name)["data"]
        assert before == after, name
        assert all(len(base64.b64decode(value)) >= 40 for value in before.values())
    assert "found no Secret" not in upgraded.notes
    # an upgrade that finds no Secret (deleted, or no access) says that it generated new values
    with FakeKubeApi().running() as empty:
        lost = render_against(empty, {}, upgrade=True)
    for name in (f"{RELEASE}-auth", f"{RELEASE}-redis"):
        assert f"found no Secret {name}" in lost.notes
    # without the cluster's Secrets (a fresh install) the values are new: the lookup is what keeps them
    fresh = render()
    assert fresh.one("Secret", f"{RELEASE}-auth")["data"] != first.one("Secret", f"{RELEASE}-auth")["data"]


def test_only_the_autoscaling_head_mounts_the_service_account_token(rendered: dict[str, Rendered]) -> None:
    """Ray's autoscaler (a sidecar KubeRay adds to the head) calls the Kubernetes API with the pod's
    service account token; no other pod needs one, so no other pod gets one."""
    for profile, out in rendered.items():
        autoscaling = out.one("RayService")["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]
        assert autoscaling is (profile == "gpu-vllm")
        for group, template in ray_pod_templates(out.one("RayService")).items():
            mounted = template["spec"]["automountServiceAccountToken"]
            assert mounted is (autoscaling and group == "head"), (profile, group)
        for statefulset in out.kinds("StatefulSet"):
            assert statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    on = render({"enableInTreeAutoscaling": True})
    assert ray_pod_templates(on.one("RayService"))["head"]["spec"]["automountServiceAccountToken"] is True
    assert (
        ray_pod_templates(on.one("RayService"))["cpu-workers"]["spec"]["automountServiceAccountToken"]
        is False
    )


RAY_CONTROL_PORTS = (8265, 6379, 10001, 52365)  # dashboard/Jobs API, GCS, client, dashboard agent


# who sends traffic in the NetworkPolicy tests
RELEASE_POD = Peer(
    NAMESPACE, {"app.kubernetes.io/name": "colony", "app.kubernetes.io/instance": RELEASE, "x": "y"}
)
NEIGHBOUR = Peer(NAMESPACE, {"app": "something-else"})
OTHER_RELEASE = Peer(NAMESPACE, {"app.kubernetes.io/name": "colony", "app.kubernetes.io/instance": "other"})
OPERATOR = Peer(
    "kuberay-system",
    {"app.kubernetes.io/name": "kuberay-operator"},
    {"kubernetes.io/metadata.name": "kuberay-system"},
)
STRANGER = Peer("elsewhere", {}, {"kubernetes.io/metadata.name": "elsewhere"})
PROMETHEUS = Peer("monitoring", {"app": "prometheus"}, {"kubernetes.io/metadata.name": "monitoring"})


def _network(values: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    out = render(values)
    pods = {g: t["metadata"]["labels"] for g, t in ray_pod_templates(out.one("RayService")).items()}
    for statefulset in out.kinds("StatefulSet"):  # <release>-redis, <release>-chroma
        component = statefulset["metadata"]["name"].removeprefix(f"{RELEASE}-")
        pods[component] = statefulset["spec"]["template"]["metadata"]["labels"]
    return out.kinds("NetworkPolicy"), pods


def test_network_policies_close_ray_control_ports_and_redis() -> None:
    """Evaluated with Kubernetes' NetworkPolicy semantics: a pod of this namespace that is not of
    this release reaches the API port and nothing else (no `ray job submit` to read the secrets,
    no Redis); the release's own pods reach everything; KubeRay's operator reaches the dashboard;
    Prometheus reaches the metrics ports only while the monitors are on."""
    policies, pods = _network({})
    release, neighbour, other_release = RELEASE_POD, NEIGHBOUR, OTHER_RELEASE
    operator, stranger, prometheus = OPERATOR, STRANGER, PROMETHEUS
    for group in ("head", "cpu-workers"):
        labels = pods[group]
        assert ingress_allowed(policies, labels, neighbour, 8000, NAMESPACE), group
        for port in (*RAY_CONTROL_PORTS, 8080, 20000):
            assert not ingress_allowed(policies, labels, neighbour, port, NAMESPACE), (group, port)
            assert not ingress_allowed(policies, labels, other_release, port, NAMESPACE), (group, port)
            assert ingress_allowed(policies, labels, release, port, NAMESPACE), (group, port)
        assert ingress_allowed(policies, labels, operator, 8265, NAMESPACE)
        assert not ingress_allowed(policies, labels, stranger, 8000, NAMESPACE)
        assert not ingress_allowed(policies, labels, prometheus, 8080, NAMESPACE), "monitors off"
    for peer in (neighbour, other_release, operator, stranger):
        assert not ingress_allowed(policies, pods["redis"], peer, 6379, NAMESPACE)
    assert ingress_allowed(policies, pods["redis"], release, 6379, NAMESPACE)

    policies, pods = _network(profile_values("gpu-vllm"))  # both monitors on
    for group in ("head", "gpu-workers"):
        assert ingress_allowed(policies, pods[group], prometheus, 8080, NAMESPACE)
        assert ingress_allowed(policies, pods[group], prometheus, 8000, NAMESPACE)
        assert not ingress_allowed(policies, pods[group], prometheus, 8265, NAMESPACE)

    # an ingress controller's namespace added; the policies off
    ingress = Peer("ingress-nginx", {}, {"kubernetes.io/metadata.name": "ingress-nginx"})
    values = {
        "networkPolicy": {
            "apiIngressFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
            ]
        }
    }
    policies, pods = _network(values)
    assert ingress_allowed(policies, pods["head"], ingress, 8000, NAMESPACE)
    assert not ingress_allowed(policies, pods["head"], ingress, 8265, NAMESPACE)
    assert not ingress_allowed(policies, pods["head"], neighbour, 8000, NAMESPACE), "replaced, not added"
    assert _network({"networkPolicy": {"enabled": False}})[0] == []


def test_ray_token_auth_is_on(rendered: dict[str, Rendered]) -> None:
    """KubeRay's authOptions (mode: token; Ray >= 2.52, the CRD's field): Ray's dashboard, Jobs API,
    GCS and client refuse callers without the token KubeRay generates per cluster (or yours)."""
    for profile, out in rendered.items():
        cluster = out.one("RayService")["spec"]["rayClusterConfig"]
        assert cluster["authOptions"] == {"mode": "token"}, profile
        assert tuple(map(int, cluster["rayVersion"].split("."))) >= (2, 52, 0), "KubeRay's minimum for token"
    own = render({"rayAuth": {"existingSecret": "my-ray-token"}}).one("RayService")
    assert own["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token", "secretName": "my-ray-token"}
    cluster_spec = crd_validator("ray.io_rayclusters.yaml", part="spec")
    assert schema_errors(cluster_spec, own["spec"]["rayClusterConfig"]) == []
    off = render({"rayAuth": {"enabled": False}}).one("RayService")
    assert "authOptions" not in off["spec"]["rayClusterConfig"]


def test_deprecated_rayservice_fields_are_gone(rendered: dict[str, Rendered]) -> None:
    """KubeRay ignores serviceUnhealthySecondThreshold/deploymentUnhealthySecondThreshold since v1.1
    (ray-operator/apis/ray/v1/rayservice_types.go at feeaf72f: "Deprecated: This field is not used
    anymore", kuberay#1685): the chart sets neither, and its schema refuses them (test above)."""
    for out in rendered.values():
        spec = out.one("RayService")["spec"]
        assert not {"serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"} & set(spec)


def _pod_annotations(out: Rendered) -> dict[str, dict[str, str]]:
    annotations = {
        g: t["metadata"]["annotations"] for g, t in ray_pod_templates(out.one("RayService")).items()
    }
    for statefulset in out.kinds("StatefulSet"):
        component = statefulset["metadata"]["name"].removeprefix(f"{RELEASE}-")
        annotations[component] = statefulset["spec"]["template"]["metadata"].get("annotations", {})
    return annotations


def test_a_changed_secret_value_rolls_the_pods_that_read_it() -> None:
    """A secret given in the values is hashed onto the pod templates that read it (never written
    out): changing it rolls them; generated secrets (looked up, or new in `helm template`) leave
    the hash alone, so rendering again rolls nothing."""
    token, password = "T" * 40, "redispass0123456789"
    base = _pod_annotations(render({"auth": {"apiToken": token}, "redis": {"auth": {"password": password}}}))
    same = _pod_annotations(render({"auth": {"apiToken": token}, "redis": {"auth": {"password": password}}}))
    assert base == same
    new_token = _pod_annotations(
        render({"auth": {"apiToken": "U" * 40}, "redis": {"auth": {"password": password}}})
    )
    new_password = _pod_annotations(
        render({"auth": {"apiToken": token}, "redis": {"auth": {"password": "otherpass0123456789"}}})
    )
    for group in ("head", "cpu-workers"):
        assert new_token[group]["checksum/given-secrets"] != base[group]["checksum/given-secrets"], group
        assert new_password[group]["checksum/given-secrets"] != base[group]["checksum/given-secrets"], group
        assert new_token[group]["checksum/colony-config"] == base[group]["checksum/colony-config"]
    assert new_password["redis"]["checksum/given-password"] != base["redis"]["checksum/given-password"]
    assert new_token["redis"] == base["redis"], "the API token is not Redis's business"
    for values in (base, new_token, new_password):
        text = json.dumps(values)
        assert token not in text and password not in text and "U" * 40 not in text
    # generated secrets: two renders (two fresh random sets) give the same pods
    assert _pod_annotations(render()) == _pod_annotations(render())
    notes = render().notes
    assert "WARNING" in notes and "existingSecret" in notes, "GitOps users are told generated secrets rotate"
    given = {"apiToken": token, "colonySecret": "S" * 40, "metricsToken": "M" * 40}
    assert "WARNING" not in render({"auth": given, "redis": {"auth": {"password": password}}}).notes


@pytest.mark.parametrize("profile", list(PROFILES))
def test_pods_run_unprivileged(profile: str, rendered: dict[str, Rendered]) -> None:
    """Ray containers: the image's ray user (1000:100), no privilege escalation, no capabilities,
    the runtime's seccomp profile; Redis: non-root, read-only root; no pod mounts a service
    account token unless Ray's autoscaler needs it; the settings are mounted read-only."""
    out = rendered[profile]
    for group, template in ray_pod_templates(out.one("RayService")).items():
        spec = template["spec"]
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert (
            context["runAsNonRoot"] is True and context["runAsUser"] == 1000 and context["runAsGroup"] == 100
        )
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["fsGroup"] == 100
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not context.get("privileged")
        config = next(m for m in container["volumeMounts"] if m["name"] == "colony-config")
        assert config["readOnly"] is True, group
        assert spec["enableServiceLinks"] is False
    settings = yaml.safe_load(out.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
    # bubblewrap cannot make user namespaces under RuntimeDefault seccomp: the weak fallback stays refused
    assert settings["planning"] == {"sandbox_isolation": "auto", "allow_weak_sandbox": False}
    for statefulset in out.kinds("StatefulSet"):
        pod = statefulset["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False


# --- agent memory's Chroma server (M11) -----------------------------------------------------------------


def _chroma(out: Rendered) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Chroma StatefulSet, its one container and its Service."""
    statefulset = out.one("StatefulSet", f"{RELEASE}-chroma")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return statefulset, container, out.one("Service", f"{RELEASE}-chroma")


@pytest.mark.parametrize("profile", list(PROFILES))
def test_chroma_runs_apart_probed_on_its_heartbeat(profile: str, rendered: dict[str, Rendered]) -> None:
    """One Chroma server per release: a StatefulSet on a PVC from the Ray pods' own image (its
    chromadb is the client's), probed on GET /api/v2/heartbeat at the port its ClusterIP Service
    targets; that Service selects the Chroma pod only; the settings every Ray pod mounts name it
    as memory.chroma_url and turn the per-replica server off."""
    out = rendered[profile]
    statefulset, container, service = _chroma(out)
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    selector = {"matchLabels": service["spec"]["selector"]}
    assert service["spec"]["type"] == "ClusterIP" and selector_matches(selector, labels)
    others = [t["metadata"]["labels"] for t in ray_pod_templates(out.one("RayService")).values()]
    others += [
        o["spec"]["template"]["metadata"]["labels"] for o in out.kinds("StatefulSet") if o != statefulset
    ]
    assert others and not any(selector_matches(selector, other) for other in others)
    (port,) = service["spec"]["ports"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == port["port"] == 8000
    assert container["command"] == ["chroma", "run", "--path", "/data", "--host", "0.0.0.0", "--port", "8000"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "4Gi"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]["httpGet"]
        assert probe["path"] == "/api/v2/heartbeat" and ports[probe["port"]] == 8000, kind
    assert container["resources"]["requests"] and container["resources"]["limits"]
    ray_images = {
        c["image"] for t in ray_pod_templates(out.one("RayService")).values() for c in t["spec"]["containers"]
    }
    assert ray_images == {container["image"]}, "the Chroma server is the Ray pods' chromadb"
    settings = yaml.safe_load(out.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
    assert settings["memory"]["chroma_url"] == f"http://{service['metadata']['name']}:{port['port']}"
    assert settings["memory"]["chroma"] == {"enabled": False}, "no replica starts its own server"


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").glob("*/children") for c in t.read_text().split()]


def test_chroma_start_command_serves_its_probe_and_keeps_the_index(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    """The StatefulSet's command run here as the kubelet would, with the venv's `chroma` (the
    chromadb the client pins), in bubblewrap as the pod's user (runAsUser/runAsGroup in a user
    namespace) on a read-only root with a fresh /tmp (the emptyDir) and the data folder (the PVC)
    writable: the probes' path answers on the probed port, a client stores and queries vectors,
    the server is the container's process itself (SIGTERM reaches it; it exits 0) and fits its
    memory request idle, and a restart on the same data folder still has the index."""
    import chromadb
    import httpx

    statefulset, container, _ = _chroma(rendered["default"])
    pod = statefulset["spec"]["template"]["spec"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]} == {"/data": "data", "/tmp": "tmp"}
    assert "emptyDir" in volumes["tmp"] and "data" not in volumes, "data is the PVC (volumeClaimTemplates)"
    assert {e["name"]: e["value"] for e in container["env"]} == {"TMPDIR": "/tmp"}
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / container["command"][0]).is_file(), "the venv's chroma CLI (chromadb)"
    assert shutil.which("bwrap"), "bubblewrap (the README test command installs it: .ci/system-packages test)"
    data = tmp_path / "data"
    data.mkdir()
    user, group = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    jail = ["bwrap", "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--bind", str(data), str(data)]
    jail += ["--ro-bind", sys.prefix, sys.prefix]  # the venv, also when it lies under /tmp (a CI clone)
    jail += ["--proc", "/proc", "--dev", "/dev", "--unshare-user", "--uid", str(user), "--gid", str(group)]
    jail += ["--chdir", "/", "--die-with-parent", "--"]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/home/ray", "TMPDIR": "/tmp"}
    probe = container["readinessProbe"]["httpGet"]

    def start(port: int) -> Any:
        moved = {"/data": str(data), "0.0.0.0": "127.0.0.1", "8000": str(port)}
        return server_process([*jail, *(moved.get(a, a) for a in container["command"])], env, port)

    port = free_port()
    with start(port) as sandbox:
        beat = httpx.get(f"http://127.0.0.1:{port}{probe['path']}", timeout=10)
        assert beat.status_code == 200 and "nanosecond heartbeat" in beat.json()
        (server,) = _children(sandbox.pid)  # bwrap's one child is the container's process
        assert Path(os.readlink(f"/proc/{server}/exe")).name.startswith("python")
        assert _children(server) == [], "the server runs in the container's process, no child to orphan"
        client = chromadb.HttpClient(host="127.0.0.1", port=port)
        index = client.create_collection("colony-default-default-memory", metadata={"hnsw:space": "cosine"})
        index.add(
            ids=["s#a", "s#b"],
            embeddings=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
            metadatas=[{"scope": "s", "created_at": 1.0}, {"scope": "s", "created_at": 2.0}],
        )
        assert index.query(query_embeddings=[[0.9, 0.1, 0.0]], n_results=1)["ids"] == [["s#a"]]
        rss_kib = next(
            int(line.split()[1])
            for line in Path(f"/proc/{server}/status").read_text().splitlines()
            if line.startswith("VmRSS")
        )
        request = container["resources"]["requests"]["memory"]
        assert request.endswith("Mi") and rss_kib * 1024 < int(request[:-2]) * 2**20, "fits its request"
        os.kill(server, signal.SIGTERM)  # the kubelet signals the container's process
        assert sandbox.wait(timeout=30) == 0, "stops within the default grace period, exit status 0"
    assert (data / "chroma.sqlite3").is_file()

    port = free_port()
    with start(port):
        index = chromadb.HttpClient(host="127.0.0.1", port=port).get_collection(
            "colony-default-default-memory"
        )
        assert index.count() == 2
        assert index.query(query_embeddings=[[0.1, 0.9, 0.0]], n_results=1)["ids"] == [["s#b"]]


def test_only_the_releases_ray_pods_reach_chroma() -> None:
    """Chroma has no authentication of its own: its NetworkPolicy admits this release's Ray pods
    on its port and nobody else, not even the release's other pods (Redis) nor Prometheus."""
    for values, groups in (
        ({}, ("head", "cpu-workers")),
        (profile_values("gpu-vllm"), ("head", "gpu-workers")),
    ):
        policies, pods = _network(values)
        for group in groups:
            assert ingress_allowed(policies, pods["chroma"], Peer(NAMESPACE, pods[group]), 8000, NAMESPACE)
        other_ray = Peer(NAMESPACE, {**pods["head"], "app.kubernetes.io/instance": "other"})
        redis_pod = Peer(NAMESPACE, pods["redis"])
        for peer in (RELEASE_POD, redis_pod, other_ray, NEIGHBOUR, OPERATOR, STRANGER, PROMETHEUS):
            assert not ingress_allowed(policies, pods["chroma"], peer, 8000, NAMESPACE), peer
    policies, pods = _network({"memory": {"chroma": {"port": 8100}}})
    head = Peer(NAMESPACE, pods["head"])
    assert ingress_allowed(policies, pods["chroma"], head, 8100, NAMESPACE)
    assert not ingress_allowed(policies, pods["chroma"], head, 8000, NAMESPACE)
    off = render(
        {"memory": {"enabled": False, "chroma": {"external": {"url": "http://chroma.example:8000"}}}}
    )
    assert f"{RELEASE}-chroma" not in {p["metadata"]["name"] for p in off.kinds("NetworkPolicy")}


def test_an_external_chroma_replaces_the_charts_and_settings_are_kept() -> None:
    """memory.enabled false: no Chroma here, the Ray pods use memory.chroma.external.url; other
    memory settings given under `colony.memory` reach the settings file untouched; moving the
    server's port moves the URL and rolls the Ray pods (the settings' checksum)."""
    url = "https://chroma.example:8443/"
    out = render({"memory": {"enabled": False, "chroma": {"external": {"url": url}}}})
    assert not [d for d in out.docs if d["metadata"]["name"] == f"{RELEASE}-chroma"]
    settings = yaml.safe_load(out.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
    assert settings["memory"] == {"chroma_url": url.rstrip("/"), "chroma": {"enabled": False}}
    assert "external Chroma at https://chroma.example:8443" in out.notes

    tuned = render({"colony": {"memory": {"vector_weight": 0.5, "collection_prefix": "team"}}})
    settings = yaml.safe_load(tuned.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
    assert settings["memory"] == {
        "vector_weight": 0.5,
        "collection_prefix": "team",
        "chroma_url": f"http://{RELEASE}-chroma:8000",
        "chroma": {"enabled": False},
    }
    moved = render({"memory": {"chroma": {"port": 8100}}})
    settings = yaml.safe_load(moved.one("ConfigMap", f"{RELEASE}-config")["data"]["colony.yaml"])
    assert settings["memory"]["chroma_url"] == f"http://{RELEASE}-chroma:8100"
    assert moved.one("Service", f"{RELEASE}-chroma")["spec"]["ports"][0]["port"] == 8100
    before = ray_pod_templates(render().one("RayService"))
    for group, template in ray_pod_templates(moved.one("RayService")).items():
        key = "checksum/colony-config"
        assert template["metadata"]["annotations"][key] != before[group]["metadata"]["annotations"][key]


def _ray_contexts(out: Rendered) -> dict[str, dict[str, Any]]:
    templates = ray_pod_templates(out.one("RayService"))
    return {group: t["spec"]["containers"][0]["securityContext"] for group, t in templates.items()}


def test_the_sandbox_switch_opens_user_namespaces_and_nothing_else(rendered: dict[str, Rendered]) -> None:
    """By default every Ray container keeps RuntimeDefault (bubblewrap cannot start: code generation
    refuses); with sandbox.userNamespaces its seccomp profile is the one asked for and AppArmor is
    unconfined, which lets bubblewrap make its user namespace as uid 1000, and nothing else moves:
    still non-root, no capability, no privilege escalation. The RayService still fits the CRDs."""
    for profile, out in rendered.items():
        for group, context in _ray_contexts(out).items():
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, (profile, group)
            assert "appArmorProfile" not in context
        for template in ray_pod_templates(out.one("RayService")).values():
            assert not any("apparmor" in key for key in template["metadata"]["annotations"])
    for asked in ({"type": "Unconfined"}, {"type": "Localhost", "localhostProfile": "profiles/colony.json"}):
        out = render({"sandbox": {"userNamespaces": True, "seccompProfile": asked}})
        contexts = _ray_contexts(out)
        assert set(contexts) >= {"head", "cpu-workers"}
        for template in ray_pod_templates(out.one("RayService")).values():  # (Kubernetes < 1.30)
            name = template["spec"]["containers"][0]["name"]
            assert (
                template["metadata"]["annotations"][f"container.apparmor.security.beta.kubernetes.io/{name}"]
                == "unconfined"
            )
        for context in contexts.values():
            assert context["seccompProfile"] == asked and context["appArmorProfile"] == {"type": "Unconfined"}
            assert context["runAsNonRoot"] is True and context["runAsUser"] == 1000
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {
                "drop": ["ALL"]
            }
        assert schema_errors(crd_validator("ray.io_rayservices.yaml"), out.one("RayService")) == []
