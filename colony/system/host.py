"""ReplicaHost: one engine plus the agents living next to its KV cache, in one process.

The Serve `EngineReplica` deployment wraps it; tests use it directly. It keeps the agent
registry in step with its agents and writes a heartbeat with its engine and page stats (with a
TTL of five periods, so a dead replica drops out of the listing and the control plane re-places
its agents). It is also a `ReplicaPort`: the placer and the resource monitor call it directly
in-process, or through the Serve router when it runs in an EngineReplica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from colony import metrics, security
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentType,
    LocalAgentRuntime,
    ResumptionCondition,
    ResumptionKind,
)
from colony.aio import cancel_and_wait
from colony.blackboard import Blackboard, BlackboardScope, create_redis, resolve_redis_url, scope_id
from colony.blackboard.connection import OutageBackoff
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentUsageError,
    BlackboardUnavailable,
    BlueprintTampered,
    ResourceExhausted,
)
from colony.inference import InferenceEngine, InferenceRequest, create_engine
from colony.system.host_pages import ReplicaPages
from colony.system.registry import HEARTBEAT_MISSES, NOT_HOSTED, ON_DEMAND, AgentRecord, AgentRegistry
from colony.system.replicas import AgentSlot, ReplicaSnapshot
from colony.system.tenant_quota import making_an_agent
from colony.vcm import PageTable
from colony.wire.tenants import prefix_of, tenant_of

log = logging.getLogger(__name__)
Spawner = Callable[[AgentBlueprint], Awaitable[dict[str, Any]]]


SUSPENSION_REASONS = {  # the metric label of a suspension, by the condition it waits for
    ResumptionKind.RESOURCE_AVAILABLE: "make_room",
    ResumptionKind.CHILDREN_COMPLETED: "children",
    ResumptionKind.PAGES_AVAILABLE: "pages",
    ResumptionKind.CUSTOM: "request",
    ResumptionKind.IMMEDIATE: "other",
}


# Records naming this replica a heartbeat reads, on average: with more agents hosted, the beat that
# reads them all (and heals what others wrote) comes once in ceil(agents / this) beats, and the
# others write only the agents whose state changed since (a replica of 10,000 idle agents read them
# all every beat: ~1 CPU-s a beat)
SWEEP_RECORDS_PER_BEAT = 128


class ReplicaHost:
    def __init__(
        self, settings: ColonySettings, replica_id: str, *, engine: InferenceEngine | None = None
    ) -> None:
        self.settings = settings
        security.use_settings(settings)  # blueprints this process signs and verifies use its secret
        self.replica_id = replica_id
        self.engine = engine
        self.blackboard: Blackboard | None = None
        self.runtime: LocalAgentRuntime | None = None
        self.registry: AgentRegistry | None = None
        self.pages: PageTable | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._owns_client = False
        # how agents hosted here place new agents (the control plane); set by whoever runs the host
        self.spawner: Spawner | None = None
        # what the engine does with pages, counted; the page table told; prefetches; what to keep
        self.paging = ReplicaPages(replica_id)
        # the registry state of each hosted agent as last read or written here (`_beat`), the beats
        # so far, and the beat that next reads every record naming this replica
        self._written: dict[str, str] = {}
        # when each hosted agent was placed or resumed here: its last activity until it runs
        self._arrived: dict[str, float] = {}
        self._beats = 0
        self._next_sweep = 0

    async def start(self, blackboard: Blackboard | None = None) -> None:
        if self.runtime is not None:
            return
        if blackboard is None:
            client = create_redis(resolve_redis_url(self.settings), self.settings.blackboard)
            blackboard = Blackboard(client, "colony:bootstrap", settings=self.settings.blackboard)
            self._owns_client = True
        self.blackboard = blackboard
        colony_board = blackboard.scoped(
            scope_id(
                BlackboardScope.COLONY, tenant_id=self.settings.tenant_id, colony_id=self.settings.colony_id
            )
        )
        self.registry = AgentRegistry(colony_board, settings=self.settings)
        self.pages = PageTable(
            blackboard,
            settings=self.settings,
        )
        if self.engine is None:
            self.engine = create_engine(self.settings)
        self.paging.bind(self.engine, self.pages, self.registry)
        self.engine.pin_wait_seconds = self.settings.vcm.page_wait_seconds
        self.engine.page_holds = self.paging.held
        self.engine.pages_needed_soon = self.paging.needed_soon
        await self.engine.start()
        self.runtime = LocalAgentRuntime(
            blackboard,
            tenant_id=self.settings.tenant_id,
            colony_id=self.settings.colony_id,
            engine=self.engine,
            replica=self,
            pages=self.pages,
            spawner=self.spawn,
            settings=self.settings,
        )
        self.runtime.on_suspended = self._suspended
        self.runtime.on_stopped = self._stopped
        self.runtime.prefetch = self.paging.prefetch
        self.paging.runtime = self.runtime
        await self._beat()
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name=f"{self.replica_id}-heartbeat")

    def _ready(self) -> tuple[LocalAgentRuntime, AgentRegistry]:
        if self.runtime is None or self.registry is None:
            raise RuntimeError("ReplicaHost.start() has not run")
        return self.runtime, self.registry

    async def ensure_agent(self, blueprint: AgentBlueprint | str) -> dict[str, Any]:
        """Host the agent: resume it if the blackboard already knows it, else spawn it."""
        runtime, _ = self._ready()
        bp = AgentBlueprint.from_text(blueprint) if isinstance(blueprint, str) else blueprint
        agent_id = bp.metadata.agent_id
        if agent_id in runtime.agent_ids:
            agent = runtime.get(agent_id)
        elif await self._known(agent_id):
            agent = await self._restore(agent_id)
        else:
            agent = await runtime.spawn(bp)
        self._arrived.setdefault(agent_id, time.time())
        record = await self._put(agent)
        return record.model_dump(mode="json")

    async def _known(self, agent_id: str) -> bool:
        runtime, _ = self._ready()
        return await runtime.agent_board(agent_id).read(AgentStateProtocol.key("blueprint")) is not None

    def _record(self, agent: Agent) -> AgentRecord:
        return AgentRecord(
            agent_id=agent.agent_id,
            role=agent.metadata.role,
            agent_type=agent.metadata.agent_type.value,
            state=agent.state.value,
            replica=self.replica_id,
        )

    async def _suspended(self, agent_id: str, condition: ResumptionCondition) -> None:
        """An agent left this replica suspended: the registry says so (no replica)."""
        if self.engine is not None:
            self.engine.release_pins()
        self._arrived.pop(agent_id, None)
        _, registry = self._ready()
        record = await registry.get(agent_id)
        if record is not None:
            # suspended to make room until asked for (an idle session): resumed on demand only
            on_demand = condition.kind is ResumptionKind.CUSTOM and condition.reason == "make_room"
            waits = ON_DEMAND if on_demand else condition.kind.value
            update = {"state": "suspended", "replica": None, "waits": waits}
            await registry.put(record.model_copy(update=update))
        reason = "make_room" if condition.reason == "make_room" else None
        metrics.AGENT_SUSPENSIONS.labels(reason or SUSPENSION_REASONS.get(condition.kind, "other")).inc()

    async def _stopped(self, agent_id: str) -> None:
        if self.engine is not None:
            self.engine.release_pins()
        self._arrived.pop(agent_id, None)
        _, registry = self._ready()
        await registry.set_state(agent_id, "stopped")

    async def spawn(self, blueprint: AgentBlueprint) -> dict[str, Any]:
        """Place a new agent through the control plane (hosted agents spawn their workers so)."""
        if self.spawner is None:
            raise RuntimeError(
                f"replica {self.replica_id} has no control plane to place agents with (ReplicaHost.spawner)"
            )
        meta, home = blueprint.metadata, self.settings.tenant_id
        if meta.parent_id is not None and tenant_of(meta.agent_id, home) != tenant_of(meta.parent_id, home):
            raise AgentUsageError(  # what an agent starts stays its tenant's (colony.wire.tenants)
                f"agent {meta.parent_id!r} may not start {meta.agent_id!r}: the child of an agent is "
                f"named with its tenant's prefix ({prefix_of(meta.parent_id, home) or 'none'!r})"
            )
        runtime, registry = self._ready()
        if await registry.get(meta.agent_id) is not None:
            return await self.spawner(blueprint)
        tenant = tenant_of(meta.agent_id, home)  # a new agent of another tenant: its quota
        redis = runtime.blackboard.redis
        async with making_an_agent(redis, self.settings.colony_id, self.settings.api, registry, tenant, home):
            return await self.spawner(blueprint)

    async def snapshot(self) -> ReplicaSnapshot:
        """What this replica holds and hosts, for the placer and the resource monitor."""
        runtime, _ = self._ready()
        assert self.engine is not None
        slots = []
        for agent_id in runtime.agent_ids:
            agent = runtime.get(agent_id)
            run = agent.current_run
            busy = run is not None and not run.done
            # its last activity: the end (or start) of its newest run, or its arrival here
            ran = (run.finished_at if run and run.done else run.started_at if run else 0.0) or 0.0
            idle_since = max(ran, self._arrived.get(agent_id, 0.0))
            slots.append(
                AgentSlot(
                    agent_id=agent_id,
                    priority=agent.metadata.priority,
                    busy=busy,
                    idle_since=idle_since,
                    memory_mb=agent.resources.memory_mb,
                )
            )
        return ReplicaSnapshot(
            replica_id=self.replica_id,
            resident=sorted(self.engine.resident_pages()),
            swapped=sorted(self.engine.swapped_pages()),
            agents=slots,
        )

    async def suspend_agent(
        self, agent_id: str, reason: str = "request", condition: dict[str, Any] | None = None
    ) -> bool:
        """Suspend a hosted agent until `condition` (default: CUSTOM, i.e. an explicit resume).
        To make room (`reason` make_room) only an idle agent is suspended: False for a busy one."""
        runtime, _ = self._ready()
        if agent_id not in runtime.agent_ids:
            return False
        if reason == "make_room":
            run = runtime.get(agent_id).current_run
            if run is not None and not run.done:
                return False
        parsed = (
            ResumptionCondition.model_validate(condition)
            if condition is not None
            else ResumptionCondition(kind=ResumptionKind.CUSTOM, reason=reason)
        )
        await runtime.suspend(agent_id, reason, parsed)
        return True

    async def resume_agent(self, agent_id: str) -> dict[str, Any]:
        """Bring a suspended agent back here, same id, state restored from the blackboard."""
        agent = await self._restore(agent_id)
        self._arrived[agent_id] = time.time()
        record = await self._put(agent)
        return record.model_dump(mode="json")

    async def _restore(self, agent_id: str) -> Agent:
        """Resume an agent from the blackboard; one whose stored blueprint is refused (tampered,
        unsigned) is never run: Agent.restore marked it FAILED, and the registry says so too."""
        runtime, registry = self._ready()
        try:
            return await runtime.resume(agent_id)
        except BlueprintTampered as exc:
            log.error("agent %s not resumed on %s: %s", agent_id, self.replica_id, exc)
            record = await registry.get(agent_id) or AgentRecord(agent_id=agent_id)
            await registry.put(record.model_copy(update={"state": "failed", "replica": None}))
            raise

    async def stop_agent(self, agent_id: str) -> bool:
        runtime, registry = self._ready()
        if agent_id not in runtime.agent_ids:
            return False
        await runtime.stop(agent_id)
        await registry.set_state(agent_id, "stopped")
        return True

    async def generate(
        self,
        request: dict[str, Any],
        page_ids: list[str] | None = None,
        *,
        hard: bool = False,
        holder: str | None = None,
    ) -> dict[str, Any]:
        """Run an inference request here; pages it names that this engine lacks are faulted in
        (their text from the page table) first, unless `hard` affinity is asked for: then a replica
        without every page refuses with ResourceExhausted (the router sent the call to the best
        holder, so none holds them all). The pages are made resident and pinned all together, from the
        fault to the answer, so a concurrent fault never evicts a page this request has just loaded;
        when they do not all fit beside the pages others use, the request waits holding none
        (`vcm.page_wait_seconds`), then fails with ResourceExhausted. `holder`: the page-bound agent
        asking, which may evict its own held pages (`paging.held`) to bring in its next one."""
        assert self.engine is not None
        page_ids = list(dict.fromkeys(page_ids or request.get("page_ids") or []))
        capacity = self.engine.page_capacity()
        if capacity is not None and len(page_ids) > capacity:
            raise ResourceExhausted(
                f"the request names {len(page_ids)} pages but replica {self.replica_id} holds at most "
                f"{capacity} at once (engine.page_slots); ask about fewer pages per request"
            )
        if hard:
            missing = [p for p in page_ids if p not in self.engine.resident_pages()]
            if missing:
                raise ResourceExhausted(
                    f"no replica holds all of pages {page_ids[:5]} (missing here: {missing[:5]}); "
                    "load them first or ask with soft affinity"
                )
        async with self.paging.using(page_ids, holder) as faulted:
            response = await self.engine.generate(
                InferenceRequest.model_validate({**request, "page_ids": page_ids})
            )
        return {**response.model_dump(mode="json"), "replica_id": self.replica_id, "faulted": faulted}

    def pinned(self, page_ids: list[str]) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold pages against eviction across several steps (a page-bound agent working on them)."""
        assert self.engine is not None
        return self.engine.pinned(page_ids)

    async def ensure_pages(self, page_ids: list[str]) -> list[str]:
        """Load the pages this engine does not hold (page faults), all or none; the page table
        follows. Returns the ids faulted in."""
        async with self.paging.using(list(dict.fromkeys(page_ids))) as faulted:
            return faulted

    async def evict_page(self, page_id: str) -> bool:
        """Evict a page; VCM-bound agents bound to it are suspended until it is resident again."""
        runtime, _ = self._ready()
        evicted = await self.paging.evict(page_id)
        for agent_id in runtime.agent_ids:
            metadata = runtime.get(agent_id).metadata
            if metadata.agent_type is AgentType.VCM_BOUND and page_id in metadata.bound_pages:
                condition = ResumptionCondition(
                    kind=ResumptionKind.PAGES_AVAILABLE, page_ids=metadata.bound_pages
                )
                await runtime.suspend(agent_id, "pages evicted", condition)
        return evicted

    def routing_stats(self) -> dict[str, Any]:
        """What the page-affinity router needs to know about this replica."""
        if self.engine is None or self.runtime is None:
            return {"resident": [], "swapped": [], "agents": 0}
        return {
            "resident": sorted(self.engine.resident_pages()),
            "swapped": sorted(self.engine.swapped_pages()),
            "agents": len(self.runtime.agent_ids),
        }

    def info(self) -> dict[str, Any]:
        runtime, _ = self._ready()
        assert self.engine is not None
        return {
            "replica_id": self.replica_id,
            "engine": self.engine.kind,
            "agents": len(runtime.agent_ids),
            "agent_ids": runtime.agent_ids,
            "max_agents": self.settings.serve.max_agents_per_replica,
            "stats": self.engine.stats().model_dump(mode="json"),
            "pages": {
                **self.paging.counts,
                "resident": len(self.engine.resident_pages()),
                "swapped": len(self.engine.swapped_pages()),
                "slots": self.engine.page_capacity(),  # KV slots for pages (None: not bounded)
            },
            # the pages this replica's agents will need next, in order, with why and the estimate
            # (first 32), and how the uses so far compared with that list (`ReplicaPages.info`)
            **self.paging.info(),
            "updated_at": time.time(),
        }

    async def _beat(self) -> None:
        runtime, registry = self._ready()
        ttl = self.settings.serve.heartbeat_seconds * HEARTBEAT_MISSES
        await registry.beat(self.replica_id, self.info(), ttl)
        await self.paging.touch_accessed()
        await registry.publish(metrics.published_counters(), self.replica_id)
        await self._drop_yielded()
        hosted = set(runtime.agent_ids)
        self._beats += 1
        records: list[AgentRecord] | None = None
        if self._beats >= self._next_sweep:
            # the records naming this replica, in one paged query (pipelined reads of the replica's
            # index), not one read per hosted agent in turn; a hosted agent missing from them has
            # no record, or one naming another replica. Every beat while few agents live here; with
            # many, one beat in ceil(agents / SWEEP_RECORDS_PER_BEAT), so an idle replica's beats
            # read about that many records each on average, not all of them every time
            records = await registry.list(replica=self.replica_id)
            self._written = {record.agent_id: record.state for record in records}
            self._next_sweep = self._beats + max(1, -(-len(hosted) // SWEEP_RECORDS_PER_BEAT))
        for agent_id in sorted(hosted):
            if not runtime.has(agent_id):
                continue  # stopped or suspended meanwhile: its own hook wrote the registry
            agent = runtime.get(agent_id)
            if self._written.get(agent_id) != agent.state.value:  # as read, else as written since
                await self._put(agent)
        for gone in [a for a in self._written if not runtime.has(a)]:
            del self._written[gone]  # left (its own hook wrote the registry), or never here
        if records is not None:
            await self._heal_registry(hosted, records)
        await self.paging.refresh_needed_soon()

    async def _put(self, agent: Agent) -> AgentRecord:
        """Write a hosted agent's registry record, and remember the state written (`_beat`)."""
        _, registry = self._ready()
        record = await registry.put(self._record(agent))
        self._written[agent.agent_id] = record.state
        return record

    async def _drop_yielded(self) -> None:
        """A copy that found another live copy of its agent (e.g. one placed while Redis had lost
        the agent's state) has stopped writing and refuses runs: drop it, without a write, so it
        stops claiming the agent's runs and the registry names the copy that serves them."""
        runtime, _ = self._ready()
        for agent_id in list(runtime.agent_ids):
            try:
                yielded = runtime.get(agent_id).stored.yielded
            except AgentNotFound:  # stopped or suspended while an earlier one was dropped
                continue
            if yielded:
                log.warning("agent %s: another live copy serves it; this replica drops its copy", agent_id)
                await runtime.drop(agent_id)

    async def _heal_registry(self, hosted: set[str], records: list[AgentRecord]) -> None:
        """Records that place an agent here (`records`, read this beat) that is not here (a
        registry write lost a race with a stop or a suspension) take the agent's lifecycle state,
        the source of truth."""
        runtime, registry = self._ready()
        for record in records:
            if record.agent_id in hosted or runtime.has(record.agent_id):
                continue
            lifecycle = await runtime.agent_board(record.agent_id).read(AgentStateProtocol.key("lifecycle"))
            held = lifecycle.value if lifecycle is not None and isinstance(lifecycle.value, dict) else {}
            state = held.get("state", "stopped") if lifecycle is not None else "stopped"
            if state in NOT_HOSTED and not runtime.has(record.agent_id):
                await registry.put(record.model_copy(update={"state": state, "replica": None}))

    async def _heartbeat_loop(self) -> None:
        """Beat every `serve.heartbeat_seconds` for ever: a Redis outage is logged once (and its
        end), every other failure each time; the next beat rewrites what a restart lost."""
        outage = OutageBackoff(f"replica {self.replica_id} heartbeat", log)
        while True:
            await asyncio.sleep(self.settings.serve.heartbeat_seconds)
            try:
                await self._beat()
                outage.recovered()
            except BlackboardUnavailable as exc:
                outage.note(exc)
            except Exception:
                log.exception("replica %s heartbeat failed", self.replica_id)

    async def close(self) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait([self._heartbeat])
        if self.runtime is not None:
            await self.runtime.shutdown()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                await self.engine.close()
        if self._owns_client and self.blackboard is not None:
            await self.blackboard.close()
