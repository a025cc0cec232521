"""Writes helm/colony/values.schema.json, the JSON schema `helm install` checks the chart's values
against (draft-07; a bad value fails naming its field).

The `colony:` block (Colony's settings file) is derived from `colony.config.ColonySettings`, so a
misspelt or invalid setting fails at `helm install` rather than in a pod, and a new setting reaches
the chart by running this again: `.venv/bin/python helm/values_schema.py`. Left out of that block:
the secrets (`api_token`, `secret`, `redis_url`, `engine.api_key`, `api.metrics_token`: they reach the
pods from Secrets), `embedded_redis` (the chart's pods always use a Redis server) and `serve.port`
(the chart writes its own `serve.port` there, so the two cannot disagree), and `memory.chroma_url` and
`memory.chroma` (the chart writes the shared Chroma server's URL, from its `memory:` values, and
turns the per-process server off). tests/test_helm_chart.py fails
when the committed file differs from what this writes.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parent / "colony" / "values.schema.json"
# settings that must not be plain values (Secrets carry them) or mean nothing in the chart
LEFT_OUT = {
    ("api_token",),
    ("secret",),
    ("redis_url",),
    ("embedded_redis",),
    ("engine", "api_key"),
    ("api", "metrics_token"),
    ("serve", "port"),
    ("memory", "chroma_url"),
    ("memory", "chroma"),
}
# environment variables the chart sets in the Ray containers, refused in extraEnv; pydantic-settings
# matches env names case-insensitively, so the check ignores case
CHART_ENV = (
    "COLONY_API_TOKEN",
    "COLONY_SECRET",
    "COLONY_REDIS_URL",
    "COLONY_CONFIG",
    "COLONY_API__METRICS_TOKEN",
    "REDIS_PASSWORD",
)
# extraEnv names that hold a secret: only `valueFrom` (a Secret), never a plain `value`
SECRET_ENV_NAME = "(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)"
# where data_dir (an emptyDir mount) must not go: the settings mount, Ray's install and session
# folders, system folders (a mount there hides what the image put there)
DATA_DIR_REFUSED = (
    r"^/(home|home/ray|etc|var|opt|tmp|root|run|srv|mnt|models)?/?$",
    r"^/(etc|dev|proc|sys|usr|bin|sbin|lib|lib32|lib64|boot|home/ray/anaconda3|tmp/ray)(/.*)?$",
    r"(^|/)\.\.?(/|$)",
)
# pydantic's annotations that are no JSON-schema constraint (or one Helm's validator would misread)
DROPPED_KEYS = {"title", "default", "format", "writeOnly"}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """The schema with every `$ref` replaced by its definition and pydantic's annotations dropped."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    return {key: _inline(value, defs) for key, value in node.items() if key not in DROPPED_KEYS}


def _close(node: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Objects accept only their listed settings; the left-out ones are removed."""
    if "properties" in node:
        for name in list(node["properties"]):
            if (*path, name) in LEFT_OUT:
                del node["properties"][name]
            else:
                _close(node["properties"][name], (*path, name))
        node["additionalProperties"] = False
        node.pop("required", None)
    for option in node.get("anyOf", []):
        _close(option, path)
    return node


def colony_block() -> dict[str, Any]:
    """JSON schema of the chart's `colony:` values: ColonySettings without secrets, closed."""
    from colony.config import AGENT_FACTORY_PATTERN, AGENT_NAME_PATTERN, ColonySettings

    raw = ColonySettings.model_json_schema()
    block = _close(_inline({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {})))
    block["description"] = (
        "Colony's settings file (colony.config.ColonySettings), mounted into every Ray pod. No "
        "secrets: api_token, secret, redis_url, engine.api_key and api.metrics_token come from Secrets."
    )
    props = block["properties"]
    # the chart mounts a volume at data_dir: an absolute path, not over a folder the pod needs
    props["data_dir"] = {
        "type": "string",
        "pattern": r"^/\S*$",
        "not": {"anyOf": [{"pattern": refused} for refused in DATA_DIR_REFUSED]},
        "description": props["data_dir"]["description"],
    }
    # what the settings' validators check, as patterns (the same expressions)
    props["agents"]["propertyNames"] = {"pattern": f"^{AGENT_NAME_PATTERN.pattern}$"}
    props["agents"]["additionalProperties"] = {
        "type": "string",
        "pattern": f"^{AGENT_FACTORY_PATTERN.pattern}$",
    }
    return copy.deepcopy(block)


NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# names that become the RayService's (KubeRay wants a DNS-1035 label: a letter first)
DNS1035 = r"^$|^[a-z]([-a-z0-9]*[a-z0-9])?$"
# ports of the Ray pods Serve's HTTP port must not take: GCS, dashboard, client, metrics, the
# dashboard agent's, the object manager's and node manager's defaults; 10002-19999 are Ray's workers'
RAY_PORTS = [6379, 8076, 8077, 8080, 8265, 10001, 52365, 52366, 44217, 44227]
QTY = {"type": ["string", "number"], "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"}
QTY_NUM = {
    "anyOf": [
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"},
        {"type": "number", "minimum": 0},
    ]
}


def obj(
    props: dict[str, Any], required: tuple[str, ...] | list[str] = (), extra: bool = False, **kw: Any
) -> dict[str, Any]:
    """An object schema; closed (no other keys) unless `extra`."""
    s: dict[str, Any] = {"type": "object", "additionalProperties": extra, "properties": props}
    if required:
        s["required"] = list(required)
    s.update(kw)
    return s


def secret_name() -> dict[str, Any]:
    """An optional Kubernetes Secret name."""
    return {"type": "string", "pattern": r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}


resources = obj(
    {
        "requests": {"type": "object", "additionalProperties": QTY_NUM},
        "limits": {"type": "object", "additionalProperties": QTY_NUM},
    },
    description="Kubernetes resources of the container",
)
ray_params = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number", "boolean"]},
    "propertyNames": {"pattern": r"^[a-z][a-z0-9-]*$"},
    "description": "extra `ray start` parameters (KubeRay rayStartParams)",
}
volumes = {
    "extraVolumes": {
        "type": "array",
        "items": obj(
            {"name": {"type": "string", "pattern": NAME, "maxLength": 63}}, required=["name"], extra=True
        ),
    },
    "extraVolumeMounts": {
        "type": "array",
        "items": obj(
            {"name": {"type": "string", "pattern": NAME}, "mountPath": {"type": "string", "pattern": "^/"}},
            required=["name", "mountPath"],
            extra=True,
        ),
    },
}
scheduling = {
    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
    "tolerations": {"type": "array", "items": {"type": "object"}},
    "affinity": {"type": "object"},
}
duration = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h))+$"}
image = obj(
    {
        "repository": {"type": "string", "minLength": 1, "pattern": r"^[a-z0-9][a-z0-9._/:-]*$"},
        "tag": {"type": "string", "minLength": 1, "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"},
        "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    },
    required=["repository", "tag", "pullPolicy"],
)


def persistence() -> dict[str, Any]:
    """A StatefulSet's PVC: size, storage class, access modes."""
    return obj(
        {
            "size": {"type": "string", "pattern": r"^[0-9]+(Mi|Gi|Ti|M|G|T)$"},
            "storageClass": {"type": "string"},
            "accessModes": {
                "type": "array",
                "minItems": 1,
                "items": {"enum": ["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"]},
            },
        },
        required=["size", "accessModes"],
    )


def memory_block() -> dict[str, Any]:
    """The Chroma server of agent memory: run here (`enabled`) or an external one by URL. The URL
    lands in a ConfigMap, so it may carry no credentials (Colony sends none to Chroma either)."""
    optional_image = obj(
        {
            "repository": {"type": "string", "pattern": r"^$|^[a-z0-9][a-z0-9._/:-]*$"},
            "tag": {"type": "string", "pattern": r"^$|^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"},
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        },
        required=["repository", "tag", "pullPolicy"],
        description="empty repository and tag: the chart's image (the client's chromadb)",
    )
    return obj(
        {
            "enabled": {"type": "boolean", "description": "run the Chroma server here (else external.url)"},
            "chroma": obj(
                {
                    "image": optional_image,
                    "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                    "persistence": persistence(),
                    "resources": resources,
                    **scheduling,
                    "external": obj(
                        {
                            "url": {
                                "type": "string",
                                "pattern": r"^$|^https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$",
                                "description": "http(s)://host[:port] of a Chroma server; no credentials",
                            }
                        },
                        required=["url"],
                    ),
                },
                required=["image", "port", "persistence", "resources", "external"],
            ),
        },
        required=["enabled", "chroma"],
    )


def worker_group(gpu: bool) -> dict[str, Any]:
    """A Ray worker group's values (the GPU one also says how many GPUs each pod gets)."""
    props: dict[str, Any] = {
        "enabled": {"type": "boolean"},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 1},
        "rayStartParams": ray_params,
        "resources": resources,
        "shmSize": QTY,
        **volumes,
        **scheduling,
    }
    if gpu:
        props["gpusPerPod"] = {"type": "integer", "minimum": 1, "maximum": 16}
    return obj(props, required=["enabled", "replicas", "minReplicas", "maxReplicas", "resources", "shmSize"])


def schema() -> dict[str, Any]:
    """The whole values schema."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the colony Helm chart",
        "type": "object",
        "additionalProperties": False,
        "required": ["rayVersion", "image", "colony", "serve", "head", "workers", "auth", "redis", "memory"],
        "properties": {
            "global": {"type": "object"},
            "rayVersion": {
                "type": "string",
                "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$",
                "description": "Ray of the images; equals the pin in pyproject.toml",
            },
            "nameOverride": {"type": "string", "pattern": DNS1035, "maxLength": 40},
            "fullnameOverride": {"type": "string", "pattern": DNS1035, "maxLength": 40},
            "image": image,
            "imagePullSecrets": {
                "type": "array",
                "items": obj({"name": {"type": "string", "minLength": 1}}, required=["name"]),
            },
            "colony": colony_block(),
            "serve": obj(
                {
                    "appName": {"type": "string", "pattern": r"^[a-z][a-z0-9_-]{0,62}$"},
                    # "/" only: the ServiceMonitor, NOTES and clients address the API at the root
                    "routePrefix": {"const": "/"},
                    "port": {
                        "type": "integer",
                        "minimum": 1024,
                        "maximum": 65535,
                        "not": {"anyOf": [{"enum": RAY_PORTS}, {"minimum": 10002, "maximum": 19999}]},
                        "description": "Serve's HTTP port; not one of Ray's ports (nor 10002-19999)",
                    },
                    "api": obj(
                        {
                            "numReplicas": {"type": "integer", "minimum": 1},
                            "numCpus": {"type": "number", "exclusiveMinimum": 0},
                        },
                        required=["numReplicas", "numCpus"],
                    ),
                    "agentSystem": obj(
                        {"numCpus": {"type": "number", "exclusiveMinimum": 0}}, required=["numCpus"]
                    ),
                    "engine": obj(
                        {
                            "numReplicas": {"type": "integer", "minimum": 1},
                            "numCpus": {"type": "number", "exclusiveMinimum": 0},
                            "numGpus": {"type": "number", "minimum": 0},
                            "autoscaling": obj(
                                {
                                    "enabled": {"type": "boolean"},
                                    "minReplicas": {"type": "integer", "minimum": 1},
                                    "maxReplicas": {"type": "integer", "minimum": 1},
                                    "targetOngoingRequests": {"type": "number", "exclusiveMinimum": 0},
                                },
                                required=["enabled", "minReplicas", "maxReplicas", "targetOngoingRequests"],
                            ),
                        },
                        required=["numReplicas", "numCpus", "numGpus", "autoscaling"],
                    ),
                },
                required=["appName", "routePrefix", "port", "api", "agentSystem", "engine"],
            ),
            "rayService": obj(
                {"upgradeStrategy": {"enum": ["NewCluster", "None"]}}, required=["upgradeStrategy"]
            ),
            "rayAuth": obj(
                {"enabled": {"type": "boolean"}, "existingSecret": secret_name()},
                required=["enabled", "existingSecret"],
            ),
            "head": obj(
                {
                    "rayStartParams": ray_params,
                    "resources": resources,
                    "shmSize": QTY,
                    **volumes,
                    **scheduling,
                },
                required=["resources", "shmSize"],
            ),
            "workers": obj({"cpu": worker_group(False), "gpu": worker_group(True)}, required=["cpu", "gpu"]),
            "enableInTreeAutoscaling": {"type": "boolean"},
            "extraEnv": {
                "type": "array",
                "items": obj(
                    {
                        "name": {
                            "type": "string",
                            "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$",
                            "not": {"pattern": "(?i)^(" + "|".join(CHART_ENV) + ")$"},
                        },
                        "value": {"type": "string"},
                        "valueFrom": {"type": "object"},
                    },
                    required=["name"],
                    # a secret-looking variable comes from a Secret (valueFrom), never as a plain value
                    **{
                        "if": {"properties": {"name": {"pattern": SECRET_ENV_NAME}}, "required": ["name"]},
                        "then": {"not": {"required": ["value"]}},
                    },
                ),
                "description": "extra env of the Ray containers (not the variables the chart sets; "
                "KEY/TOKEN/SECRET/PASSWORD ones only with valueFrom)",
            },
            "podSecurityContext": {"type": "object"},
            "containerSecurityContext": {"type": "object"},
            "auth": obj(
                {
                    "existingSecret": secret_name(),
                    "apiToken": {
                        "type": "string",
                        "pattern": r"^$|^[A-Za-z0-9._~+/=-]{32,512}$",
                        "description": "32+ URL/header-safe characters; empty = generated",
                    },
                    "colonySecret": {
                        "type": "string",
                        "pattern": r"^$|^[\x21-\x7e]{32,512}$",
                        "description": "32+ printable characters; empty = generated",
                    },
                    "metricsToken": {
                        "type": "string",
                        "pattern": r"^$|^[A-Za-z0-9._~+/=-]{32,512}$",
                        "description": "32+ URL/header-safe characters; empty = generated",
                    },
                },
                required=["existingSecret", "apiToken", "colonySecret", "metricsToken"],
            ),
            "redis": obj(
                {
                    "enabled": {"type": "boolean"},
                    "image": image,
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "appendfsync": {"enum": ["always", "everysec", "no"]},
                    "maxmemory": {"type": "string", "pattern": r"^$|^[0-9]+(b|kb|mb|gb|k|m|g)?$"},
                    "auth": obj(
                        {
                            "existingSecret": secret_name(),
                            "password": {
                                "type": "string",
                                "pattern": r"^$|^[A-Za-z0-9._~-]{16,128}$",
                                "description": "16+ URL-safe characters; empty = generated",
                            },
                        },
                        required=["existingSecret", "password"],
                    ),
                    "persistence": persistence(),
                    "resources": resources,
                    **scheduling,
                    "external": obj(
                        {
                            "url": {
                                "type": "string",
                                "pattern": r"^$|^rediss?://[^:@/\s]*:[^@/\s]+@[^\s/]+(/[0-9]+)?$",
                                "description": "redis[s]://:PASSWORD@host:port[/db]",
                            },
                            "existingSecret": secret_name(),
                        },
                        required=["url", "existingSecret"],
                    ),
                },
                required=["enabled", "port", "appendfsync", "auth", "persistence", "external"],
            ),
            "memory": memory_block(),
            "service": obj(
                {
                    "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                required=["type", "port"],
            ),
            "metrics": obj(
                {
                    "cluster": {"type": "string", "pattern": r"^$|^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"},
                    "serviceMonitor": obj(
                        {
                            "enabled": {"type": "boolean"},
                            "interval": duration,
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                        required=["enabled"],
                    ),
                    "podMonitor": obj(
                        {
                            "enabled": {"type": "boolean"},
                            "interval": duration,
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                        required=["enabled"],
                    ),
                },
                required=["serviceMonitor", "podMonitor"],
            ),
            "dashboards": obj(
                {
                    "enabled": {"type": "boolean"},
                    "label": {
                        "type": "string",
                        "pattern": r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$",
                    },
                    "labelValue": {
                        "type": "string",
                        "pattern": r"^$|^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$",
                    },
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                required=["enabled", "label", "labelValue"],
            ),
            "networkPolicy": obj(
                {
                    "enabled": {"type": "boolean"},
                    "apiIngressFrom": {"type": "array", "items": {"type": "object"}},
                    "operatorFrom": {"type": "array", "items": {"type": "object"}},
                    "monitoringFrom": {"type": "array", "items": {"type": "object"}},
                },
                required=["enabled", "apiIngressFrom", "operatorFrom", "monitoringFrom"],
            ),
            "podDisruptionBudget": obj({"enabled": {"type": "boolean"}}, required=["enabled"]),
            "sandbox": obj(
                {
                    "userNamespaces": {"type": "boolean"},
                    "seccompProfile": obj(
                        {
                            "type": {"enum": ["Unconfined", "Localhost", "RuntimeDefault"]},
                            "localhostProfile": {"type": "string", "minLength": 1},
                        },
                        required=["type"],
                    ),
                },
                required=["userNamespaces", "seccompProfile"],
            ),
        },
    }


def main(argv: list[str]) -> int:
    text = json.dumps(schema(), indent=2) + "\n"
    if argv[1:] == ["--check"]:
        if SCHEMA_PATH.read_text() != text:
            print(
                f"{SCHEMA_PATH} is out of date: run .venv/bin/python helm/values_schema.py", file=sys.stderr
            )
            return 1
        return 0
    SCHEMA_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main(sys.argv))
