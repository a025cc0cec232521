"""Offline tools for checking the Helm chart (tests/test_helm_chart.py).

- `render`: the chart rendered by Helm itself (helm-python-sdk embeds Helm's Go library; no helm
  binary, no cluster), parsed into manifests.
- `crd_validator`: a jsonschema validator for a KubeRay CRD's `openAPIV3Schema`, made as strict as
  an API server with strict field validation: an object schema that lists its properties accepts no
  other field (unless it says `x-kubernetes-preserve-unknown-fields`), so a misspelt or misplaced
  field fails here instead of being pruned silently by the API server.
- `FakeKubeApi`: a tiny Kubernetes API stand-in (discovery of v1 and GET of Secrets) so Helm's
  `lookup` runs for real: what `helm upgrade` sees of the Secrets an install created.
- `ingress_allowed`: NetworkPolicies evaluated as a network plugin enforces them.
- `build_like_serve`: serveConfigV2's application built in-process as Serve's controller builds it.
- `server_process`: a server container's command (Redis's, Chroma's) run here in its own process
  group, yielded once it listens, stopped with its group.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "colony"
CRDS = Path(__file__).resolve().parent / "data" / "k8s-crds"
# the profiles users install (plus the chart's defaults alone)
PROFILES = {
    "default": None,
    "cpu": CHART / "values-cpu.yaml",
    "gpu-vllm": CHART / "values-gpu-vllm.yaml",
    "external-redis": CHART / "values-external-redis.yaml",
}
RELEASE = "colony"
NAMESPACE = "colony-test"


def profile_values(profile: str) -> dict[str, Any]:
    path = PROFILES[profile]
    return {} if path is None else yaml.safe_load(path.read_text()) or {}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, maps merged key by key (as `-f a.yaml --set ...` does)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Rendered:
    """One rendering of the chart: the manifests by kind and name, and the raw text per template."""

    texts: dict[str, str]
    docs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for template, text in sorted(self.texts.items()):
            if template.endswith(".txt"):  # NOTES.txt
                continue
            self.docs.extend(doc for doc in yaml.safe_load_all(text) if doc)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [doc for doc in self.kinds(kind) if name is None or doc["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        )
        return found[0]

    @property
    def notes(self) -> str:
        return next((text for name, text in self.texts.items() if name.endswith("NOTES.txt")), "")


def render(values: dict[str, Any] | None = None, *, chart: Path = CHART, release: str = RELEASE) -> Rendered:
    """Render the chart as `helm template` would (values are checked against values.schema.json)."""
    with helm.Chart.load(chart) as loaded:
        texts = loaded.render(values or {}, name=release, namespace=NAMESPACE, is_install=True)
    return Rendered(texts)


def ray_pod_templates(rayservice: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The head's and each worker group's pod template, by group name ("head" for the head)."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster.get("workerGroupSpecs") or []:
        templates[group["groupName"]] = group["template"]
    return templates


def _strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema in which listed properties are the only ones allowed."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _crd_schema(filename: str, version: str) -> dict[str, Any]:
    # the C loader: these files are about 1 MB each (2 s apiece with the pure-Python one)
    crd = yaml.load((CRDS / filename).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return _strict(served["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]
    raise AssertionError(f"{filename} has no version {version}")


def crd_validator(filename: str, version: str = "v1", *, part: str | None = None) -> jsonschema.Validator:
    """A validator of a CRD version's schema; `part="spec"` validates only the spec (e.g. a
    RayService's rayClusterConfig against the RayCluster spec)."""
    schema = _crd_schema(filename, version)
    if part is not None:
        schema = schema["properties"][part]
    return jsonschema.Draft7Validator(schema)


def schema_errors(validator: jsonschema.Validator, document: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message[:300]}"
        for error in validator.iter_errors(document)
    ]


class FakeKubeApi:
    """Just enough of a Kubernetes API for Helm's `lookup` of Secrets: discovery of the core group
    and GET of a Secret from `secrets` ((namespace, name) -> manifest); records every request."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                api.requests.append(self.path)
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts == ["api", "v1"]:
                    resource = {
                        "name": "secrets",
                        "singularName": "secret",
                        "namespaced": True,
                        "kind": "Secret",
                        "verbs": ["get", "list"],
                    }
                    return self._send(
                        200,
                        {
                            "kind": "APIResourceList",
                            "apiVersion": "v1",
                            "groupVersion": "v1",
                            "resources": [resource],
                        },
                    )
                if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
                    secret = api.secrets.get((parts[3], parts[5]))
                    if secret is not None:
                        return self._send(200, secret)
                return self._send(
                    404,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "NotFound",
                        "code": 404,
                        "message": "not found",
                    },
                )

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def kubeconfig(self) -> str:
        port = self._server.server_address[1]
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "test", "user": {"token": "test"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "test"}}],
                "current-context": "fake",
            }
        )

    @contextmanager
    def running(self) -> Iterator[FakeKubeApi]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def render_against(api: FakeKubeApi, values: dict[str, Any], *, upgrade: bool) -> Rendered:
    """Render as `helm install`/`helm upgrade` do against a cluster: `lookup` asks `api`."""
    with (
        helm.Chart.load(CHART) as chart,
        helm.Config(kubeconfig_content=api.kubeconfig, namespace=NAMESPACE, storage_driver="memory") as cfg,
    ):
        texts = cfg.render(
            chart,
            values,
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=not upgrade,
            is_upgrade=upgrade,
            revision=2 if upgrade else 1,
        )
    return Rendered(texts)


# --- NetworkPolicy semantics (what a network plugin enforces), for the policy tests ---------------


@dataclass(frozen=True)
class Peer:
    """A pod that sends traffic: its namespace (with the namespace's labels) and its own labels."""

    namespace: str
    labels: dict[str, str]
    namespace_labels: dict[str, str] = field(default_factory=dict)


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector against labels (`{}` selects everything)."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _peer_matches(peer: dict[str, Any], source: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer:  # pod traffic is matched by the selectors (an ipBlock is for outside)
        return False
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selector_matches(namespaces, source.namespace_labels)
    return in_namespace and (pods is None or selector_matches(pods, source.labels))


def ingress_allowed(
    policies: list[dict[str, Any]], pod_labels: dict[str, str], source: Peer, port: int, namespace: str
) -> bool:
    """Whether `source` may open TCP `port` on a pod with `pod_labels` in `namespace` under these
    NetworkPolicies (Kubernetes semantics: a pod no Ingress policy selects accepts everything; a
    selected pod accepts what any rule of any selecting policy allows; rules match by port number)."""
    selecting = [
        p
        for p in policies
        if p["kind"] == "NetworkPolicy"
        and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
        and selector_matches(p["spec"]["podSelector"], pod_labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any(_peer_matches(peer, source, namespace) for peer in peers):
                continue
            ports = rule.get("ports")
            if ports and not any(p.get("port") in (None, port) for p in ports):
                continue
            return True
    return False


@functools.lru_cache(maxsize=1)
def rendered_profiles() -> dict[str, Rendered]:
    """Every profile rendered once per test session (the chart tests only read the result)."""
    return {profile: render(profile_values(profile)) for profile in PROFILES}


# The Ray pods' secret variables and the auth Secret's keys they come from.
SECRET_ENV = {
    "COLONY_API_TOKEN": "api-token",
    "COLONY_SECRET": "colony-secret",
    "COLONY_API__METRICS_TOKEN": "metrics-token",
}


# --- serveConfigV2 as Serve's controller reads it ---------------------------------------------------


def build_like_serve(app_config: Any) -> dict[str, Any]:
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


# --- the chart's servers run here as the kubelet would (Redis, Chroma) ----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(
    argv: list[str], env: dict[str, str], port: int, *, cwd: Path | None = None, timeout: float = 60
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` started in its own process group (cleanup reaches whatever it starts), yielded once
    127.0.0.1:`port` accepts connections; SIGTERM to the group on exit (SIGKILL after 15 s)."""
    server = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    stop_process_group(server)
                    err = server.stderr.read().decode(errors="replace")[-2000:] if server.stderr else ""
                    raise AssertionError(f"{argv[0]} did not listen on {port}: {err}") from None
                time.sleep(0.05)
        yield server
    finally:
        stop_process_group(server)


def stop_process_group(server: subprocess.Popen[bytes], grace: float = 15) -> int:
    """SIGTERM to the process group `server` leads, SIGKILL after `grace` seconds; its exit status."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        return server.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        return server.wait(timeout=10)
