"""Placing agents on replicas, with the ResourceExhausted cascade.

1. hard affinity: a replica holding every required page (resident), with room;
2. soft affinity: the best-scoring replica with room (pages are faulted in there);
3. retry later: every replica is full; wait (backoff) for room to appear;
4. suspend: free room by suspending a lower-priority agent (lowest priority, then longest idle).
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
                replica, step = await self._retry(preferred, memory), "retry"
        suspended: list[str] = []
        while replica is None:  # suspend lower-priority agents until the newcomer fits
            ports, views, snapshots = await self._state()
            victim_replica, victim = self._victim(snapshots, blueprint.metadata.priority, exclude=suspended)
            condition = ResumptionCondition(kind=ResumptionKind.RESOURCE_AVAILABLE, reason="make_room")
            await ports[victim_replica].suspend_agent(victim, "make_room", condition.model_dump(mode="json"))
            suspended.append(victim)
            try:
                replica, step = choose_replica(await self.views(), preferred, memory_mb=memory), "suspend"
            except ResourceExhausted:
                continue
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

    def _victim(
        self, snapshots: list[ReplicaSnapshot], priority: int, exclude: list[str] | None = None
    ) -> tuple[str, str]:
        """The agent to suspend: lower priority than the newcomer; lowest priority, then idle before
        busy, then longest idle."""
        candidates = [
            (slot.priority, slot.busy, slot.idle_since, slot.agent_id, snapshot.replica_id)
            for snapshot in snapshots
            for slot in snapshot.agents
            if slot.priority < priority and slot.agent_id not in (exclude or [])
        ]
        if not candidates:
            raise ResourceExhausted(
                f"no replica has room (serve.max_agents_per_replica={self.max_agents}, "
                f"serve.replica_memory_mb={self.memory_mb}) and no agent has a lower priority than "
                f"{priority} to suspend; add replicas or raise those limits"
            )
        _priority, _busy, _since, agent_id, replica_id = min(candidates)
        return replica_id, agent_id
