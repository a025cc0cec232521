"""Engine replicas as the control plane sees them on Ray Serve.

Live replicas are the ones with a heartbeat in the registry; a call to one replica goes through
the EngineReplica handle with `target_replica=<id>`, which the PageAffinityRouter honours. A
replica the router does not route to answers `ReplicaUnavailable` (from the replica that got the
call instead, or translated from Ray's actor-died errors), never a silent call to some other replica.

Not being routed to is not being dead, though: a replica Serve is stopping (an upgrade replaces
it) keeps running its agents until its process exits, and a replica of another Ray cluster (a
KubeRay NewCluster upgrade runs two against one Redis) is alive but unreachable from here. So
whether a replica is gone is read from this Ray cluster's actor table (`liveness`), not from a call;
where that table cannot be read, the monitor decides by the replica's heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
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
# dead replica ids remembered (and recent full-table verdicts); past this many, memory starts over
_KNOWN_LIMIT = 10_000
RECHECK_SECONDS = 5.0  # how long a full-table verdict on a heartbeating, not ALIVE replica is kept


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
        # looked up once
        self._dead: set[str] = set()
        # full-table verdicts on heartbeating replicas with no ALIVE actor here (another
        # cluster's, or starting): replica id -> (verdict, monotonic time it expires)
        self._recent: dict[str, tuple[Liveness, float]] = {}
        self._outage = False  # the actor table could not be read last time (logged once)

    async def liveness(self, replica_ids: Iterable[str]) -> dict[str, Liveness]:
        """Whether each replica is alive, from this Ray cluster's actor table (GCS), which knows
        the moment a replica's process is gone and never mistakes a replica it does not route to
        for a dead one. "unknown": the table could not be read (the caller decides by heartbeat).

        Cheap first: the GCS lists only its ALIVE actors (it keeps up to 100,000 dead ones, whose
        parsing took about a second a call). An ALIVE replica is alive; one that is not and whose
        heartbeat expired is dead. Only a heartbeating replica with no ALIVE actor here needs the
        whole table: dead here (a killed replica, found at once, not after its heartbeat expires),
        starting, or no actor of this cluster ("elsewhere", another cluster's). That verdict is
        kept `RECHECK_SECONDS` (a NewCluster overlap asks every round); "dead" for good."""
        ids = set(replica_ids)
        found: dict[str, Liveness] = {r: "dead" for r in ids if r in self._dead}
        todo = ids - set(found)
        if not todo:
            return found
        now = time.monotonic()
        try:
            alive = await asyncio.to_thread(self._replica_actors, "ALIVE")
            beating = {beat.get("replica_id") for beat in await self.registry.replicas()}
            unsure = {r for r in todo if r not in alive and r in beating and not self._cached(r, now)}
            actors = await asyncio.to_thread(self._replica_actors) if unsure else {}
        except Exception as exc:  # no GCS answer: say so, never guess "dead"
            if not self._outage:
                log.warning(
                    "could not read the Ray actor table (%s); deciding by heartbeat until it answers", exc
                )
            self._outage = True
            return {**found, **dict.fromkeys(todo, "unknown")}
        if self._outage:
            log.warning("the Ray actor table answers again")
            self._outage = False
        for replica_id in todo:
            if replica_id in alive:
                found[replica_id] = "alive"
            elif replica_id not in beating:
                found[replica_id] = "dead"  # no live actor here, no heartbeat anywhere
            elif replica_id not in unsure:
                found[replica_id] = self._recent[replica_id][0]
            else:
                found[replica_id] = self._full_verdict(replica_id, actors.get(replica_id), now)
        return found

    def _cached(self, replica_id: str, now: float) -> bool:
        verdict = self._recent.get(replica_id)
        if verdict is not None and verdict[1] > now:
            return True
        self._recent.pop(replica_id, None)
        return False

    def _full_verdict(self, replica_id: str, state: str | None, now: float) -> Liveness:
        """A heartbeating replica's verdict from its whole-table actor state (None: no actor here)."""
        verdict: Liveness = (
            "elsewhere" if state is None else "alive" if state in _LIVE_ACTOR_STATES else "dead"
        )
        if verdict == "dead":
            if len(self._dead) >= _KNOWN_LIMIT:
                self._dead.clear()
            self._dead.add(replica_id)
            self._recent.pop(replica_id, None)
        else:
            if len(self._recent) >= _KNOWN_LIMIT:
                self._recent.clear()
            self._recent[replica_id] = (verdict, now + RECHECK_SECONDS)
        return verdict

    def _replica_actors(self, state: str | None = None) -> dict[str, str]:
        """Replica id -> actor state of this deployment's replicas in this Ray cluster's actor
        table: those in `state` only (the GCS filters), or all, dead ones included."""
        from ray._private import state as ray_state  # no public call lists dead actors by name

        prefix = f"{REPLICA_ACTOR_PREFIX}{self.handle.app_name}#{self.handle.deployment_name}#"
        return {
            str(info["Name"]).removeprefix(prefix): str(info["State"])
            for info in ray_state.actors(actor_state_name=state).values()
            if str(info.get("Name", "")).startswith(prefix)
        }

    async def ports(self) -> list[ReplicaPort]:
        ids = sorted({beat["replica_id"] for beat in await self.registry.replicas()})
        return [self.port(replica_id) for replica_id in ids]

    def port(self, replica_id: str) -> ReplicaPort:
        return ServeReplicaPort(self.handle, replica_id)
