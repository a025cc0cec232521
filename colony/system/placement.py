"""Placing agents on replicas, with the ResourceExhausted cascade.

1. hard affinity: a replica holding every required page (resident), with room;
2. soft affinity: the best-scoring replica with room (pages are faulted in there);
3. retry later: every replica is full; wait (backoff) for room to appear;
4. suspend: free room by suspending a lower-priority agent (lowest priority, then longest idle).
Each step reuses `colony.vcm.placement` (the code the request router and the simulator run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from colony import metrics
from colony.agents import AgentBlueprint, ResumptionCondition, ResumptionKind
from colony.errors import ResourceExhausted
from colony.system.host import ReplicaHost
from colony.vcm.placement import ReplicaView, choose_replica

log = logging.getLogger(__name__)
Step = Literal["hard", "soft", "retry", "suspend"]


class Placement(BaseModel):
    agent_id: str
    replica_id: str
    step: Step
    suspended: list[str] = Field(default_factory=list)
    waited_seconds: float = 0.0


def replica_views(hosts: Mapping[str, ReplicaHost], max_agents: int | None) -> list[ReplicaView]:
    """Placement views of in-process hosts, from the stats they also give the request router."""
    views = []
    for replica_id, host in sorted(hosts.items()):
        stats = host.routing_stats()
        resident, swapped = set(stats["resident"]), set(stats["swapped"])
        views.append(ReplicaView(replica_id, resident, swapped, int(stats["agents"]), max_agents))
    return views


class AgentPlacer:
    def __init__(
        self,
        hosts: Mapping[str, ReplicaHost],
        *,
        max_agents_per_replica: int,
        retry_seconds: float = 2.0,
        retry_backoff: float = 0.1,
    ) -> None:
        self.hosts = dict(hosts)
        self.max_agents = max_agents_per_replica
        self.retry_seconds = retry_seconds
        self.retry_backoff = retry_backoff

    def views(self) -> list[ReplicaView]:
        return replica_views(self.hosts, self.max_agents)

    async def place(self, blueprint: AgentBlueprint) -> Placement:
        agent_id = blueprint.metadata.agent_id
        required = blueprint.resources.required_pages
        preferred = blueprint.resources.preferred_pages or required
        step: Step
        started = time.monotonic()
        try:
            replica = choose_replica(self.views(), required, hard=True) if required else None
            step = "hard"
            if replica is None:
                raise ResourceExhausted("no required pages")
        except ResourceExhausted:
            try:
                replica, step = choose_replica(self.views(), preferred), "soft"
            except ResourceExhausted:
                replica, step = await self._retry(preferred), "retry"
        suspended: list[str] = []
        if replica is None:
            victim_replica, victim = self._victim(blueprint.metadata.priority)
            await self.hosts[victim_replica].runtime.suspend(  # type: ignore[union-attr]
                victim, "make_room", ResumptionCondition(kind=ResumptionKind.RESOURCE_AVAILABLE)
            )
            suspended.append(victim)
            replica, step = choose_replica(self.views(), preferred), "suspend"
        await self.hosts[replica.replica_id].ensure_agent(blueprint)
        metrics.PLACEMENTS.labels(step).inc()
        return Placement(
            agent_id=agent_id,
            replica_id=replica.replica_id,
            step=step,
            suspended=suspended,
            waited_seconds=time.monotonic() - started,
        )

    async def _retry(self, pages: list[str]) -> ReplicaView | None:
        """Wait, with backoff, for a replica to have room; None when the wait runs out."""
        deadline = time.monotonic() + self.retry_seconds
        delay = self.retry_backoff
        metrics.PLACEMENTS_QUEUED.inc()
        while time.monotonic() < deadline:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            try:
                return choose_replica(self.views(), pages)
            except ResourceExhausted:
                delay = min(delay * 2, 1.0)
        return None

    def _victim(self, priority: int) -> tuple[str, str]:
        """The agent to suspend: lower priority than the newcomer; lowest priority, then longest idle."""
        candidates = []
        for replica_id, host in self.hosts.items():
            assert host.runtime is not None
            for agent_id in host.runtime.agent_ids:
                agent = host.runtime.get(agent_id)
                if agent.metadata.priority < priority:
                    idle_since = (
                        agent.current_run.finished_at
                        if agent.current_run and agent.current_run.done
                        else (agent.current_run.started_at if agent.current_run else 0.0)
                    )
                    busy = agent.current_run is not None and not agent.current_run.done
                    candidates.append(
                        (agent.metadata.priority, busy, idle_since or 0.0, agent_id, replica_id)
                    )
        if not candidates:
            raise ResourceExhausted(
                f"every replica is at its {self.max_agents}-agent capacity and no agent has a lower priority "
                f"than {priority} to suspend; add replicas or raise engine capacity"
            )
        _priority, _busy, _since, agent_id, replica_id = min(candidates)
        return replica_id, agent_id
