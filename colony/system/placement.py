"""Placing agents on replicas, with the ResourceExhausted cascade.

1. hard affinity: a replica holding every required page (resident), with room;
2. soft affinity: the best-scoring replica with room (pages are faulted in there);
3. retry later: every replica is full; wait (backoff) for room to appear;
4. suspend: free room by suspending idle agents to Redis (`victims`): session agents first, then
   lower priority first, then the longest idle. An agent busy in a run is never suspended for room.

Room on demand: an idle session agent is always a victim (whatever its priority: it is resumed by
its next message, `ControlPlane.resume`), and when one can make room step 4 comes at once, without
the wait of step 3 (an idle session frees nothing by waiting). Other agents make room only for a
newcomer of a higher priority, after the wait. A suspended session waits for its next message
(CUSTOM condition, reason `make_room`); another agent for room (RESOURCE_AVAILABLE).
Replicas are reached through a `ReplicaDirectory` (in-process hosts or Serve replicas).
Each step reuses `colony.vcm.placement` (the code the request router and the simulator run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from colony import metrics
from colony.agents import AgentBlueprint, ResumptionCondition, ResumptionKind
from colony.context.sessions import is_session_id
from colony.errors import ReplicaUnavailable, ResourceExhausted
from colony.system.replicas import (
    ReplicaDirectory,
    ReplicaPort,
    ReplicaSnapshot,
    as_directory,
    views_of,
)
from colony.vcm.placement import ReplicaView, choose_replica

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost

log = logging.getLogger(__name__)
Step = Literal["hard", "soft", "retry", "suspend"]
MAKE_ROOM = "make_room"  # the reason of a suspension that makes room (the host suspends only an idle agent)
MAX_VICTIM_TRIES = 8  # victims tried in one pass (one found busy by its replica is passed over)


class Placement(BaseModel):
    agent_id: str
    replica_id: str
    step: Step
    suspended: list[str] = Field(default_factory=list)
    waited_seconds: float = 0.0


async def gather_snapshots(directory: ReplicaDirectory) -> dict[str, tuple[ReplicaPort, ReplicaSnapshot]]:
    """Every live replica's port and current snapshot (replicas that fail to answer are left out)."""
    ports = await directory.ports()
    answers = await asyncio.gather(*(port.snapshot() for port in ports), return_exceptions=True)
    found = {}
    for port, answer in zip(ports, answers, strict=True):
        if isinstance(answer, ReplicaUnavailable):
            # not routed to: starting, draining in an upgrade, another Ray cluster's (NewCluster
            # upgrade), or dead; the monitor tells these apart and logs a dead one. At warning
            # level this said so twice a second for as long as an upgrade's overlap lasts
            log.debug("replica %s did not report its state: %s", port.replica_id, answer)
            continue
        if isinstance(answer, BaseException):
            log.warning("replica %s did not report its state: %s", port.replica_id, answer)
            continue
        found[port.replica_id] = (port, answer)
    return found


class AgentPlacer:
    def __init__(
        self,
        replicas: Mapping[str, ReplicaHost] | ReplicaDirectory,
        *,
        max_agents_per_replica: int,
        memory_per_replica_mb: int | None = None,
        retry_seconds: float = 2.0,
        retry_backoff: float = 0.1,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self.directory = as_directory(replicas)
        self.max_agents = max_agents_per_replica
        self.memory_mb = memory_per_replica_mb
        self.retry_seconds = retry_seconds
        self.retry_backoff = retry_backoff
        # one decision at a time (shared with the resource monitor), so two placements do not take
        # one slot and an agent is never resumed in two places
        self.lock = lock or asyncio.Lock()

    async def _state(self) -> tuple[dict[str, ReplicaPort], list[ReplicaView], list[ReplicaSnapshot]]:
        found = await gather_snapshots(self.directory)
        snapshots = [snapshot for _, snapshot in found.values()]
        return (
            {rid: port for rid, (port, _) in found.items()},
            views_of(snapshots, self.max_agents, self.memory_mb),
            snapshots,
        )

    async def views(self) -> list[ReplicaView]:
        return (await self._state())[1]

    async def place(self, blueprint: AgentBlueprint) -> Placement:
        async with self.lock:
            return await self.place_locked(blueprint)

    async def place_locked(self, blueprint: AgentBlueprint, *, wait: bool = True) -> Placement:
        """`place` for a caller that holds `self.lock` (and checked, under it, that the agent is
        not hosted already). `wait=False`: only the room there is now (steps hard and soft): no
        wait for replicas starting or for room, and no lower-priority agent suspended to make
        room; ResourceExhausted at once otherwise. For work that can come back later (a pool
        growing), which must not hold the lock the monitor and explicit resumes share."""
        agent_id = blueprint.metadata.agent_id
        required = blueprint.resources.required_pages
        preferred = blueprint.resources.preferred_pages or required or blueprint.metadata.bound_pages
        memory = blueprint.resources.memory_mb
        if self.memory_mb is not None and memory > self.memory_mb:
            raise ResourceExhausted(
                f"agent {agent_id} needs {memory} MB, more than a replica has for agents "
                f"(serve.replica_memory_mb={self.memory_mb})"
            )
        step: Step
        started = time.monotonic()
        ports, views, snapshots = await self._state()
        deadline = time.monotonic() + (self.retry_seconds if wait else 0.0)
        while not views and time.monotonic() < deadline:  # replicas still starting
            await asyncio.sleep(self.retry_backoff)
            ports, views, snapshots = await self._state()
        if not views:
            raise ResourceExhausted("no engine replica is running; check `colony status` and the Ray logs")
        try:
            replica = choose_replica(views, required, hard=True, memory_mb=memory) if required else None
            step = "hard"
            if replica is None:
                raise ResourceExhausted("no required pages")
        except ResourceExhausted:
            try:
                replica, step = choose_replica(views, preferred, memory_mb=memory), "soft"
            except ResourceExhausted:
                if not wait:
                    raise ResourceExhausted(
                        f"no replica has room for agent {agent_id} now "
                        f"(serve.max_agents_per_replica={self.max_agents}, "
                        f"serve.replica_memory_mb={self.memory_mb}); try again later or add replicas"
                    ) from None
                replica, step = None, "suspend"
        suspended: list[str] = []
        if replica is None:
            replica, step = await self._make_room(blueprint, preferred, suspended, snapshots)
        ports = ports if replica.replica_id in ports else (await self._state())[0]
        await ports[replica.replica_id].ensure_agent(blueprint.to_text())
        metrics.PLACEMENTS.labels(step).inc()
        return Placement(
            agent_id=agent_id,
            replica_id=replica.replica_id,
            step=step,
            suspended=suspended,
            waited_seconds=time.monotonic() - started,
        )

    async def _make_room(
        self,
        blueprint: AgentBlueprint,
        pages: list[str],
        suspended: list[str],
        snapshots: list[ReplicaSnapshot],
    ) -> tuple[ReplicaView, Step]:
        """Steps 3 and 4 for a newcomer that fits nowhere: idle sessions are suspended at once;
        otherwise wait for room (step 3), then suspend idle lower-priority agents (step 4)."""
        priority, memory = blueprint.metadata.priority, blueprint.resources.memory_mb
        if not any(is_session_id(v.agent_id) for v in victims(snapshots, priority)):
            replica = await self._retry(pages, memory)
            if replica is not None:
                return replica, "retry"
        while True:  # bounded: each pass suspends one more hosted agent, or raises
            found = await self.make_room_locked(priority, exclude=suspended)
            suspended.append(found)
            try:
                return choose_replica(await self.views(), pages, memory_mb=memory), "suspend"
            except ResourceExhausted:
                continue

    async def make_room_locked(self, priority: int, *, exclude: list[str] | None = None) -> str:
        """Suspend the first of `victims` that its replica still finds idle (for a caller holding
        `self.lock`); the id suspended. ResourceExhausted when no agent can make room."""
        tried = list(exclude or [])
        for _ in range(MAX_VICTIM_TRIES):
            ports, _views, snapshots = await self._state()
            found = [v for v in victims(snapshots, priority) if v.agent_id not in tried]
            if not found:
                break
            victim = found[0]
            tried.append(victim.agent_id)
            session = is_session_id(victim.agent_id)
            kind = ResumptionKind.CUSTOM if session else ResumptionKind.RESOURCE_AVAILABLE
            condition = ResumptionCondition(kind=kind, reason=MAKE_ROOM)
            if await ports[victim.replica_id].suspend_agent(
                victim.agent_id, MAKE_ROOM, condition.model_dump(mode="json")
            ):
                metrics.AGENT_EVICTIONS.labels("session" if session else "other").inc()
                log.info("agent %s suspended to make room", victim.agent_id)
                return victim.agent_id
        raise ResourceExhausted(
            f"no replica has room (serve.max_agents_per_replica={self.max_agents}, "
            f"serve.replica_memory_mb={self.memory_mb}) and no idle session, nor idle agent of a lower "
            f"priority than {priority}, to suspend; retry later, add replicas or raise those limits"
        )

    async def _retry(self, pages: list[str], memory: int) -> ReplicaView | None:
        """Wait, with backoff, for a replica to have room; None when the wait runs out."""
        deadline = time.monotonic() + self.retry_seconds
        delay = self.retry_backoff
        metrics.PLACEMENTS_QUEUED.inc()
        while time.monotonic() < deadline:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            try:
                return choose_replica(await self.views(), pages, memory_mb=memory)
            except ResourceExhausted:
                delay = min(delay * 2, 1.0)
        return None


class Victim(BaseModel):
    """A hosted agent that may be suspended to make room, and where it is."""

    agent_id: str
    replica_id: str
    priority: int
    idle_since: float


def victims(snapshots: list[ReplicaSnapshot], priority: int) -> list[Victim]:
    """The agents that may be suspended to make room for a newcomer of `priority`, in the order
    they go: only idle ones (an agent busy in a run is never suspended for room), session agents
    whatever their priority, other agents only of a lower priority; sessions first, then the lowest
    priority, then the longest idle (the oldest last activity)."""
    found = [
        Victim(
            agent_id=slot.agent_id,
            replica_id=snapshot.replica_id,
            priority=slot.priority,
            idle_since=slot.idle_since,
        )
        for snapshot in snapshots
        for slot in snapshot.agents
        if not slot.busy and (is_session_id(slot.agent_id) or slot.priority < priority)
    ]
    return sorted(found, key=lambda v: (not is_session_id(v.agent_id), v.priority, v.idle_since, v.agent_id))
