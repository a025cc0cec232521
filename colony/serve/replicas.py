"""Engine replicas as the control plane sees them on Ray Serve.

Live replicas are the ones with a heartbeat in the registry; a call to one replica goes through
the EngineReplica handle with `target_replica=<id>`, which the PageAffinityRouter honours. A
replica the router does not route to answers `ReplicaUnavailable` (from the replica that got the
call instead, or translated from Ray's actor-died errors), never a silent call to some other replica.

Not being routed to is not being dead, though: a replica Serve is stopping (an upgrade replaces
it) keeps running its agents until its process exits, and a replica of another Ray cluster (a
KubeRay NewCluster upgrade runs two against one Redis) is alive but unreachable from here. So
whether a replica is gone is read from this Ray cluster's actor table (`liveness`), not from a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, Literal, TypeVar

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.handle import DeploymentHandle

from colony.errors import ReplicaUnavailable
from colony.system.registry import AgentRegistry
from colony.system.replicas import ReplicaPort, ReplicaSnapshot

T = TypeVar("T")
log = logging.getLogger(__name__)
# What this cluster knows of a replica: its actor lives (starting, serving, or draining), died,
# is no actor of this Ray cluster but heartbeats (another cluster's), or could not be looked up.
Liveness = Literal["alive", "dead", "elsewhere", "unknown"]
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"  # Serve names replica actors SERVE_REPLICA::<app>#<deployment>#<id>
_LIVE_ACTOR_STATES = frozenset({"ALIVE", "PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING"})
_KNOWN_LIMIT = 10_000  # replica ids whose fate is settled (dead, or another cluster's), remembered


async def remote_result(response: Awaitable[T], replica_id: str | None = None) -> T:
    """Await a deployment call, re-raising the callee's own error (a Colony error keeps its type
    and message) and Ray's actor-died errors as `ReplicaUnavailable`."""
    try:
        return await response
    except RayTaskError as exc:
        cause = exc.cause
        raise (cause if isinstance(cause, Exception) else exc) from None
    except RayActorError as exc:
        raise ReplicaUnavailable(f"replica {replica_id or '?'} is not running: {exc}") from None


class ServeReplicaPort:
    def __init__(self, handle: DeploymentHandle, replica_id: str) -> None:
        self.handle = handle
        self.replica_id = replica_id

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        response: Awaitable[Any] = getattr(self.handle, method).remote(
            *args, target_replica=self.replica_id, **kwargs
        )
        return await remote_result(response, self.replica_id)

    async def snapshot(self) -> ReplicaSnapshot:
        return ReplicaSnapshot.model_validate(await self._call("snapshot"))

    async def ensure_agent(self, blueprint: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("ensure_agent", blueprint)
        return result

    async def resume_agent(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("resume_agent", agent_id)
        return result

    async def suspend_agent(self, agent_id: str, reason: str, condition: dict[str, Any] | None) -> bool:
        return bool(await self._call("suspend_agent", agent_id, reason, condition))

    async def stop_agent(self, agent_id: str) -> bool:
        return bool(await self._call("stop_agent", agent_id))


class ServeReplicas:
    """The EngineReplica deployment as a `ReplicaDirectory`."""

    def __init__(self, handle: DeploymentHandle, registry: AgentRegistry) -> None:
        self.handle = handle
        self.registry = registry
        # replicas this cluster's actor table says are dead: that never changes, so each is
        # looked up once (another cluster's replica is re-checked: its heartbeat may stop)
        self._settled: dict[str, Liveness] = {}

    async def liveness(self, replica_ids: Iterable[str]) -> dict[str, Liveness]:
        """Whether each replica is alive, from this Ray cluster's actor table (GCS), which knows
        the moment a replica's process is gone and never mistakes a replica it does not route to
        for a dead one. A replica with no actor here is another cluster's while it heartbeats
        ("elsewhere"), and gone for this cluster once it stops. "unknown": the table could not
        be read (the caller falls back to asking the replica)."""
        ids = set(replica_ids)
        found: dict[str, Liveness] = {r: self._settled[r] for r in ids if r in self._settled}
        todo = ids - set(found)
        if not todo:
            return found
        try:
            actors = await asyncio.to_thread(self._replica_actors)
            beating = {beat.get("replica_id") for beat in await self.registry.replicas()}
        except Exception as exc:  # no GCS answer: say so, never guess "dead"
            log.info("could not read the actor table (%s); asking the replicas instead", exc)
            return {**found, **dict.fromkeys(todo, "unknown")}
        for replica_id in todo:
            state = actors.get(replica_id)
            if state is None:  # no actor of this cluster: another cluster's, while it heartbeats
                found[replica_id] = "elsewhere" if replica_id in beating else "dead"
                continue
            found[replica_id] = "alive" if state in _LIVE_ACTOR_STATES else "dead"
            if found[replica_id] == "dead":  # final: remembered (bounded)
                if len(self._settled) >= _KNOWN_LIMIT:
                    self._settled.clear()
                self._settled[replica_id] = "dead"
        return found

    def _replica_actors(self) -> dict[str, str]:
        """Replica id -> actor state of this deployment's replicas in this Ray cluster's actor
        table (dead ones included; Ray keeps them there)."""
        from ray._private import state as ray_state  # no public call lists dead actors by name

        prefix = f"{REPLICA_ACTOR_PREFIX}{self.handle.app_name}#{self.handle.deployment_name}#"
        return {
            str(info["Name"]).removeprefix(prefix): str(info["State"])
            for info in ray_state.actors().values()
            if str(info.get("Name", "")).startswith(prefix)
        }

    async def ports(self) -> list[ReplicaPort]:
        ids = sorted({beat["replica_id"] for beat in await self.registry.replicas()})
        return [self.port(replica_id) for replica_id in ids]

    def port(self, replica_id: str) -> ReplicaPort:
        return ServeReplicaPort(self.handle, replica_id)
