"""The Ray Serve application (`colony.serve.app:build_app`).

- `EngineReplica` (N replicas): one InferenceEngine plus the agents next to its KV cache
  (a `ReplicaHost`), so the agents' inference never leaves the process.
- `AgentSystemDeployment` (control plane, one replica): a `ControlPlane` over the live engine
  replicas: places agents (page affinity and the ResourceExhausted cascade), stops, suspends and
  resumes them, runs the resource monitor loop (resumptions, dead-replica recovery), ensures the
  built-in agents exist.
- `ColonyAPI`: the FastAPI app behind `@serve.ingress`.

Control-plane calls to one engine replica carry `target_replica=<id>` (see `serve.router`); each
EngineReplica method checks it, so a call meant for a dead replica fails instead of acting on
another one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from colony import metrics, security
from colony.agents import AgentBlueprint
from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard, BlackboardScope, create_redis, resolve_redis_url, scope_id
from colony.config import ColonySettings, load_settings
from colony.errors import ReplicaUnavailable
from colony.serve.replicas import ServeReplicas, remote_result
from colony.system.catalog import BUILTIN_AGENTS, colony_blueprints
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.pools import PoolManager
from colony.system.registry import AgentRegistry
from colony.system.runs import RunService
from colony.vcm import PageTable
from colony.wire.token import METRICS_TOKEN_ENV, TOKEN_ENV, ensure_token_file

log = logging.getLogger(__name__)

# Serve's controller notices a dead replica at its next health check (default every 10 s), and
# until then the proxy may still route to it: 2 s bounds how long a killed replica goes unnoticed
# (the chaos suite's API-replica kill recovered in ~11 s with the default).
HEALTH_CHECK_PERIOD_S = 2.0


def settings_to_dict(settings: ColonySettings) -> dict[str, Any]:
    """Settings as plain JSON with secrets revealed, to hand to replica processes.

    The API token goes along only when it came from the config file: a token from the environment
    (a Kubernetes secret, `colony up`) is read by the API replica from its own environment at run
    time, so rotating it needs no rebuild (see colony.wire.token)."""
    data = settings.model_dump(mode="json")
    from_env = bool(os.environ.get(TOKEN_ENV))
    data["api_token"] = settings.api_token.get_secret_value() if settings.api_token and not from_env else None
    data["secret"] = settings.secret.get_secret_value() if settings.secret else None
    if settings.engine.api_key is not None:
        data["engine"]["api_key"] = settings.engine.api_key.get_secret_value()
    # like the API token: one from the environment is read by the API replica from its own
    # environment per request (a rotated Secret takes effect, an unset one is revoked)
    data["api"]["metrics_token"] = (
        settings.api.metrics_token.get_secret_value()
        if settings.api.metrics_token and not os.environ.get(METRICS_TOKEN_ENV)
        else None
    )
    return data


def connect_registry(settings: ColonySettings, name: str) -> tuple[Blackboard, AgentRegistry]:
    """A blackboard client of this process and the colony's agent registry on it."""
    client = create_redis(resolve_redis_url(settings), settings.blackboard)
    board = Blackboard(client, name, settings=settings.blackboard)
    colony_scope = scope_id(
        BlackboardScope.COLONY, tenant_id=settings.tenant_id, colony_id=settings.colony_id
    )
    return board, AgentRegistry(board.scoped(colony_scope), settings=settings)


def api_services(
    settings: ColonySettings, *, token: Any, control: Any = None, name: str = "colony:api"
) -> ApiServices:
    """What the API replica serves from: its own Redis client, and the registry, runs and page
    table built with the replica's settings (retention, default timeout: never `load_settings()`)."""
    board, registry = connect_registry(settings, name)
    return ApiServices(
        runs=RunService(board, registry, settings=settings),
        registry=registry,
        token=token,
        pages=PageTable(board, settings=settings),
        control=control,
        vcm=settings.vcm,
        settings=settings,
    )


@serve.deployment(
    name="EngineReplica",
    ray_actor_options={"num_cpus": 0.5},
    max_ongoing_requests=64,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    request_router_config=RequestRouterConfig(
        request_router_class="colony.serve.router:PageAffinityRouter", request_routing_stats_period_s=0.5
    ),
)
class EngineReplica:
    def __init__(self, settings: dict[str, Any]) -> None:
        context = serve.get_replica_context()
        self.app_name = context.app_name
        self.host = ReplicaHost(ColonySettings(**settings), context.replica_id.unique_id)
        self.host.spawner = self._spawn
        self._system: DeploymentHandle | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        """Serve's graceful shutdown of this replica (an upgrade, a scale-down) awaits what this
        returns: its agents are let go first, as a dying replica's would be (nothing written; their
        state stays in Redis and the resource monitor places them again, their runs redone from
        their checkpoints). Serve shuts this replica's thread pool down right after: the embedded
        engine's calls run there, and a run caught mid-inference used to fail ("cannot schedule
        new futures after shutdown") instead of being redone elsewhere. A plain method returning
        the coroutine, so the garbage collector's later call (which awaits nothing) makes none."""
        if getattr(self, "_closed", True):  # done already, or never built
            return None
        self._closed = True
        return self._let_agents_go()

    async def _let_agents_go(self) -> None:
        async with self._lock:
            await self.host.close()

    async def _started(self, target_replica: str | None = None) -> ReplicaHost:
        if target_replica is not None and target_replica != self.host.replica_id:
            raise ReplicaUnavailable(
                f"replica {target_replica} is not running (the call reached another one)"
            )
        if self._closed:
            raise ReplicaUnavailable(f"replica {self.host.replica_id} is shutting down")
        async with self._lock:
            await self.host.start()
        return self.host

    async def _spawn(self, blueprint: AgentBlueprint) -> dict[str, Any]:
        """Agents hosted here place new agents through the control plane."""
        if self._system is None:
            self._system = serve.get_deployment_handle("AgentSystem", app_name=self.app_name)
        result: dict[str, Any] = await remote_result(self._system.place.remote(blueprint.to_text()))
        return result

    async def ensure_agent(self, blueprint_text: str, target_replica: str | None = None) -> dict[str, Any]:
        return await (await self._started(target_replica)).ensure_agent(blueprint_text)

    async def resume_agent(self, agent_id: str, target_replica: str | None = None) -> dict[str, Any]:
        return await (await self._started(target_replica)).resume_agent(agent_id)

    async def suspend_agent(
        self,
        agent_id: str,
        reason: str = "request",
        condition: dict[str, Any] | None = None,
        target_replica: str | None = None,
    ) -> bool:
        return await (await self._started(target_replica)).suspend_agent(agent_id, reason, condition)

    async def stop_agent(self, agent_id: str, target_replica: str | None = None) -> bool:
        return await (await self._started(target_replica)).stop_agent(agent_id)

    async def snapshot(self, target_replica: str | None = None) -> dict[str, Any]:
        return (await (await self._started(target_replica)).snapshot()).model_dump(mode="json")

    async def info(self, target_replica: str | None = None) -> dict[str, Any]:
        return (await self._started(target_replica)).info()

    async def generate(
        self, request: dict[str, Any], page_ids: list[str] | None = None, hard: bool = False
    ) -> dict[str, Any]:
        """Inference on this replica (the router sent it here because it holds most of `page_ids`);
        `hard=True`: refuse (ResourceExhausted) rather than fault missing pages in."""
        return await (await self._started()).generate(request, page_ids, hard=hard)

    async def evict_page(self, page_id: str, target_replica: str | None = None) -> bool:
        return await (await self._started(target_replica)).evict_page(page_id)

    def record_routing_stats(self) -> dict[str, Any]:
        return self.host.routing_stats()

    async def check_health(self) -> None:
        if self.host.runtime is None:
            await self._started()


@serve.deployment(
    name="AgentSystem", ray_actor_options={"num_cpus": 0.1}, health_check_period_s=HEALTH_CHECK_PERIOD_S
)
class AgentSystemDeployment:
    def __init__(self, settings: dict[str, Any], replicas: DeploymentHandle) -> None:
        self.settings = ColonySettings(**settings)
        self.replicas = replicas
        self._control: ControlPlane | None = None
        self._builtins_ready = False
        self._lock = asyncio.Lock()

    async def _plane(self) -> ControlPlane:
        """The control plane, built (and its monitor loop started) on first use."""
        if self._control is None:
            board, registry = connect_registry(self.settings, "colony:control")
            self._control = ControlPlane(board, ServeReplicas(self.replicas, registry), self.settings)
            # the echo and ask pools (and any `agents:` pool) are sized once per control round
            self._control.pools = PoolManager(self._control, colony_blueprints(self.settings))
        self._control.start()
        return self._control

    async def place(self, blueprint_text: str) -> dict[str, Any]:
        """Host an agent (page affinity, then the ResourceExhausted cascade); resumes a known one."""
        return (await (await self._plane()).place(blueprint_text)).model_dump(mode="json")

    async def stop(self, agent_id: str) -> bool:
        return await (await self._plane()).stop(agent_id)

    async def place_instance(self, name: str, agent_id: str) -> dict[str, Any]:
        """Host another tenant's own instance of a catalog agent (made on first use)."""
        return (await (await self._plane()).place_instance(name, agent_id)).model_dump(mode="json")

    async def suspend(self, agent_id: str, reason: str = "request") -> dict[str, Any]:
        return (await (await self._plane()).suspend(agent_id, reason)).model_dump(mode="json")

    async def resume(self, agent_id: str) -> dict[str, Any]:
        return (await (await self._plane()).resume(agent_id)).model_dump(mode="json")

    async def delete(self, agent_id: str) -> int:
        """Remove an agent for good with every key of its state (`DELETE /v1/sessions/{id}`)."""
        return await (await self._plane()).delete(agent_id)

    async def undo(self, agent_id: str) -> dict[str, Any]:
        return await (await self._plane()).undo(agent_id)

    async def restore(
        self, agent_id: str, step: int, mode: str = "reexecute", run_id: str | None = None
    ) -> dict[str, Any]:
        return await (await self._plane()).restore(agent_id, step, mode, run_id)

    async def ensure_builtins(self) -> list[str]:
        """Place the agents the colony starts with: the built-ins and the `agents:` user agents
        (their packages must be importable in this replica and the engine replicas)."""
        async with self._lock:
            if not self._builtins_ready:
                plane = await self._plane()
                for blueprint in colony_blueprints(self.settings).values():
                    await plane.place(blueprint)
                self._builtins_ready = True
        return sorted({*BUILTIN_AGENTS, *self.settings.agents})

    async def check_health(self) -> None:
        await self._plane()


class ServeAgentControl:
    """The API's way to suspend, resume, undo and restore agents: calls to the AgentSystem deployment."""

    def __init__(self, system: DeploymentHandle) -> None:
        self.system = system

    async def suspend(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await remote_result(self.system.suspend.remote(agent_id))
        return result

    async def resume(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await remote_result(self.system.resume.remote(agent_id))
        return result

    async def delete(self, agent_id: str) -> int:
        deleted: int = await remote_result(self.system.delete.remote(agent_id))
        return deleted

    async def place_instance(self, name: str, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await remote_result(self.system.place_instance.remote(name, agent_id))
        return result

    async def undo(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await remote_result(self.system.undo.remote(agent_id))
        return result

    async def restore(
        self, agent_id: str, step: int, mode: str = "reexecute", run_id: str | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await remote_result(self.system.restore.remote(agent_id, step, mode, run_id))
        return result


@serve.deployment(
    name="ColonyAPI",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=256,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
)
@serve.ingress()
class ColonyAPI:
    """The HTTP API. Its FastAPI app is built in the replica (`__serve_build_asgi_app__`), not
    pickled from the driver, so its metrics and clients are this process's own."""

    def __init__(self, settings: dict[str, Any], system: DeploymentHandle) -> None:
        self.settings = ColonySettings(**settings)
        security.use_settings(self.settings)  # the blueprints it hands to the system are signed with it
        self.system = system
        # the token is looked up per request (env, config file, token file); with none configured
        # this creates the token file on a loopback host and refuses to start on any other
        self.tokens = ensure_token_file(self.settings)
        self._services: ApiServices | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._builtins_ready = False
        self._lock = asyncio.Lock()

    async def _publish_loop(self, services: ApiServices) -> None:
        """This replica's own metrics (runs, HTTP) go into the cluster-wide sums even when no scrape
        reaches it (a scrape publishes too): one write per heartbeat period, for the replica's life."""
        while True:
            await asyncio.sleep(self.settings.serve.heartbeat_seconds)
            try:
                await services.registry.publish(metrics.published_counters(), "api")
            except Exception:  # Redis away: the next period retries; /metrics still answers
                log.debug("API metrics publication failed; the next one retries", exc_info=True)

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(
            self._get_services,
            token=self.tokens,
            api=self.settings.api,
            max_import_bytes=self.settings.context.max_export_bytes,
        )

    async def _get_services(self) -> ApiServices:
        if self._services is not None and self._builtins_ready:
            return self._services
        async with self._lock:
            if self._services is None:
                self._services = api_services(
                    self.settings, token=self.tokens, control=ServeAgentControl(self.system)
                )
                self._publisher = asyncio.create_task(self._publish_loop(self._services))
            if not self._builtins_ready:
                await self.system.ensure_builtins.remote()
                self._builtins_ready = True
        return self._services


def engine_scaling(settings: ColonySettings, replicas: int) -> dict[str, Any]:
    """How many EngineReplicas: `replicas` fixed, or with `serve.autoscaling.enabled` Serve's
    autoscaler between its min and max on the replicas' ongoing requests (docs/scaling.md)."""
    autoscaling = settings.serve.autoscaling
    if autoscaling.enabled:
        return {"autoscaling_config": autoscaling.serve_config()}
    return {"num_replicas": replicas}


def build_app(args: dict[str, Any]) -> Any:
    """The Serve application as a Serve config deploys it (`import_path: colony.serve.app:build_app`
    in deployments/*.yaml and the chart's serveConfigV2): Serve calls a builder with exactly one
    argument, the `args` dict: `config` (YAML path), `replicas` (engine replicas), `replica_cpus`
    (CPUs per engine replica)."""
    return build_app_with_settings(args)


def build_app_with_settings(
    args: dict[str, Any] | None = None, *, settings: ColonySettings | None = None
) -> Any:
    """`build_app` with settings made in code (`colony up`, tests) instead of the `config` file."""
    args = dict(args or {})
    if settings is None:
        config = args.get("config")
        settings = load_settings(Path(config) if config else None)
    # user agents (`agents:`) are imported and built here first: a module that does not import, a
    # factory that returns no blueprint or a name taken by a built-in stops the deploy with a
    # ConfigError naming the setting (`colony up` prints it) instead of failing inside a replica
    colony_blueprints(settings)
    data = settings_to_dict(settings)
    replicas = EngineReplica.options(
        **engine_scaling(settings, int(args.get("replicas", 1))),
        ray_actor_options={"num_cpus": float(args.get("replica_cpus", 0.5))},
    ).bind(data)
    system = AgentSystemDeployment.bind(data, replicas)
    return ColonyAPI.bind(data, system)
