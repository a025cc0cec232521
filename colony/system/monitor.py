"""The resource monitor: resumes suspended agents when their ResumptionCondition holds.

Each `tick()` (the control plane runs one every `period` seconds) reads the suspended agents from
the registry and, highest priority first (FIFO among equals), evaluates each condition:
CHILDREN_COMPLETED (every child STOPPED/FAILED in the registry or its lifecycle),
RESOURCE_AVAILABLE (a replica has room), PAGES_AVAILABLE (every page resident somewhere in the page
table), IMMEDIATE, CUSTOM (only after `request_resume`). A met condition resumes the agent, same id
and restored state, on the best replica for its pages.

The same loop handles dead replicas: agents the registry places on a replica that is no longer
alive are re-placed (resumed from their last blackboard state on a live replica, their accepted
runs carried on), and the page table forgets the dead replica's pages. Where the directory can
tell (`liveness`: on Serve, the Ray actor table), a replica that does not answer but whose process
lives (starting, or draining while an upgrade replaces it) keeps its agents until it is gone: a
copy started elsewhere meanwhile would race the draining one for the agent. A replica of another
Ray cluster on the same Redis (a NewCluster upgrade) is left to that cluster's control plane
while it heartbeats. Where `liveness` cannot answer (the actor table is unreadable), the replica's
heartbeat decides: fresh, it keeps its agents (a probe would take a draining replica for a dead
one); expired, it is gone. And an agent the registry places on a live replica that does not host it
(that copy yielded to another, which then ended with its replica) is re-placed after
`missing_grace` seconds, instead of waiting for ever on a replica that will never serve it; one
whose suspension is under way (recorded, not yet done: a slow persist) is given
`SUSPENDING_GRACE_FACTOR` times that, so it is not taken for lost and started twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.agents.blueprint import AgentBlueprint
from colony.agents.models import AgentMetadata, ResumptionCondition, ResumptionKind, SuspensionRequest
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlueprintTampered, ReplicaUnavailable, ResourceExhausted
from colony.system.placement import gather_snapshots
from colony.system.registry import DONE_STATES, NOT_HOSTED, AgentRecord, AgentRegistry
from colony.system.replicas import ReplicaDirectory, ReplicaPort, as_directory, views_of
from colony.vcm.page_table import PageTable
from colony.vcm.placement import ReplicaView, choose_replica

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost

log = logging.getLogger(__name__)

# How often the monitor also reads the page table for replicas it names that are gone: a replica
# that dies hosting no agent is found only there (the registry names it nowhere).
PAGE_SWEEP_SECONDS = 10.0
# How long the registry may place an agent on a live replica that does not host it before the
# monitor re-places it: well past a heartbeat period (the hosting replica rewrites its agents'
# records each beat) and any suspension or stop in progress (their registry write follows at once).
MISSING_GRACE_SECONDS = 10.0
# An agent whose suspension is recorded but not done (its replica detached it and is persisting its
# state) waits this many missing graces: a suspension that failed half-way is still re-placed.
SUSPENDING_GRACE_FACTOR = 6.0


class ResumptionMonitor:
    def __init__(
        self,
        blackboard: Blackboard,
        replicas: Mapping[str, ReplicaHost] | ReplicaDirectory,
        registry: AgentRegistry,
        *,
        page_table: PageTable | None = None,
        max_agents_per_replica: int | None = None,
        memory_per_replica_mb: int | None = None,
        period: float = 1.0,
        probe_timeout: float = 10.0,
        lock: asyncio.Lock | None = None,
        tenant_id: str = "default",
        colony_id: str = "default",
        missing_grace: float = MISSING_GRACE_SECONDS,
    ) -> None:
        self.blackboard = blackboard
        self.directory = as_directory(replicas)
        self.registry = registry
        self.page_table = page_table
        self.max_agents = max_agents_per_replica
        self.memory_mb = memory_per_replica_mb
        self.period = period
        self.probe_timeout = probe_timeout
        self.lock = lock or asyncio.Lock()  # shared with the placer: one decision at a time
        self.tenant_id, self.colony_id = tenant_id, colony_id
        self._custom: set[str] = set()
        self._ports: dict[str, ReplicaPort] = {}
        self._views: list[ReplicaView] = []
        self._hosted: dict[str, set[str]] = {}  # agents each answering replica hosts (its snapshot)
        self._next_page_sweep = 0.0
        self.missing_grace = missing_grace
        self._missing_since: dict[str, float] = {}  # agent -> when first found on no replica
        self._liveness_outage = False  # `liveness` could not answer last round (logged once)

    def request_resume(self, agent_id: str) -> None:
        """The external trigger of CUSTOM conditions (and a push for any other kind)."""
        self._custom.add(agent_id)

    async def _refresh(self) -> None:
        found = await gather_snapshots(self.directory)
        self._ports = {rid: port for rid, (port, _) in found.items()}
        self._views = views_of([s for _, s in found.values()], self.max_agents, self.memory_mb)
        self._hosted = {rid: {slot.agent_id for slot in s.agents} for rid, (_, s) in found.items()}

    async def _pending(self) -> list[tuple[int, float, str, ResumptionCondition, list[str]]]:
        items = []
        for record in await self.registry.list(state="suspended"):
            board = self._agent_board(record.agent_id)
            metadata_e, suspension_e = await board.read_many(
                [AgentStateProtocol.key("metadata"), AgentStateProtocol.key("suspension")]
            )
            metadata = AgentMetadata.model_validate(metadata_e.value) if metadata_e else None
            request = SuspensionRequest.model_validate(suspension_e.value) if suspension_e else None
            condition = request.condition if request else ResumptionCondition(kind=ResumptionKind.CUSTOM)
            pages = list(condition.page_ids or (metadata.bound_pages if metadata else []))
            priority = metadata.priority if metadata else 0
            items.append(
                (-priority, request.requested_at if request else 0.0, record.agent_id, condition, pages)
            )
        return sorted(items, key=lambda item: (item[0], item[1], item[2]))

    def _agent_board(self, agent_id: str) -> Blackboard:
        return self.blackboard.scoped(
            scope_id(
                BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent_id
            )
        )

    async def _met(self, agent_id: str, condition: ResumptionCondition, pages: list[str]) -> bool:
        kind = condition.kind
        if agent_id in self._custom or kind is ResumptionKind.IMMEDIATE:
            return True
        if kind is ResumptionKind.CHILDREN_COMPLETED:
            for child in condition.agent_ids:
                record = await self.registry.get(child)
                if record is not None and record.state in DONE_STATES:
                    continue
                # the child's lifecycle is the source of truth (its registry record may lag)
                lifecycle = await self._agent_board(child).read(AgentStateProtocol.key("lifecycle"))
                if lifecycle is None or lifecycle.value.get("state") not in DONE_STATES:
                    return False
            return True
        if kind is ResumptionKind.RESOURCE_AVAILABLE:
            return any(not v.full for v in self._views)
        if kind is ResumptionKind.PAGES_AVAILABLE:
            if self.page_table is None:
                return False
            for page_id in pages:
                record = await self.page_table.page(page_id)
                if record is None or not record.resident_on:
                    return False
            return True
        return False  # CUSTOM without a trigger

    async def tick(self) -> list[str]:
        """One evaluation round; the ids of the agents resumed (or re-placed)."""
        async with self.lock:
            return await self._tick()

    async def _tick(self) -> list[str]:
        await self._refresh()
        resumed = await self.recover_orphans()
        for _priority, _since, agent_id, condition, pages in await self._pending():
            if not await self._met(agent_id, condition, pages):
                continue
            hard = condition.kind is ResumptionKind.PAGES_AVAILABLE
            memory = await self._memory(agent_id)
            try:
                target = choose_replica(self._views, pages, hard=hard, memory_mb=memory)
            except ResourceExhausted:
                continue  # no room now; next round
            if not await self._resume(target.replica_id, agent_id):
                continue
            self._custom.discard(agent_id)
            metrics.AGENT_RESUMPTIONS.labels(condition.kind.value).inc()
            await self._refresh()
            resumed.append(agent_id)
        return resumed

    async def recover_orphans(self) -> list[str]:
        """Re-place the agents of replicas that are gone; drop those replicas from the page table.

        A replica counts as gone only when the directory's `liveness` says its process is dead,
        or (where it cannot tell) a call addressed to it says so (`ReplicaUnavailable`), never
        because it was slow to answer: moving the agents of a live replica would run them twice.
        """
        if not self._ports:
            return []  # nothing alive to move them to (or the directory is not answering)
        records = [r for r in await self.registry.list() if r.replica and r.state not in NOT_HOSTED]
        suspects = sorted(
            {r.replica for r in records if r.replica and r.replica not in self._ports}
            | await self._page_table_suspects()
        )
        gone = await self._gone(suspects)
        recovered: list[str] = []
        for dead in sorted(gone):
            log.warning("replica %s is gone; re-placing its agents", dead)
            if self.page_table is not None:
                await self.page_table.drop_replica(dead)
        orphans = [r.agent_id for r in records if r.replica in gone]
        for agent_id in self._missing(records):
            # one that left its replica suspended or ended (its registry write was lost) is not
            # an orphan: its lifecycle says so, and its replica's heartbeat heals the record
            lifecycle, suspension = await self._agent_board(agent_id).read_many(
                [AgentStateProtocol.key("lifecycle"), AgentStateProtocol.key("suspension")]
            )
            if lifecycle is not None and lifecycle.value.get("state") in NOT_HOSTED:
                continue
            if self._suspending(agent_id, lifecycle, suspension):
                continue
            log.warning("agent %s: no replica hosts it, though the registry places it on one", agent_id)
            orphans.append(agent_id)
        for agent_id in orphans:
            pages = await self._bound_pages(agent_id)
            try:
                target = choose_replica(self._views, pages, memory_mb=await self._memory(agent_id))
            except ResourceExhausted:
                continue  # every replica is full; next round
            if not await self._resume(target.replica_id, agent_id):
                continue
            self._missing_since.pop(agent_id, None)
            metrics.AGENT_RESUMPTIONS.labels("replica_lost").inc()
            await self._refresh()
            recovered.append(agent_id)
        return recovered

    async def _gone(self, suspects: list[str]) -> set[str]:
        """Which of the replicas that did not answer are gone: by the directory's `liveness`
        where it has one (a live process, or another cluster's heartbeating replica, is not),
        else by asking each (`ReplicaUnavailable`)."""
        liveness = await self._liveness(suspects)
        beating = await self._beating(suspects, liveness)
        gone = set()
        for replica_id in suspects:
            state = liveness.get(replica_id, "unknown")
            if state == "dead":
                gone.add(replica_id)
                continue
            if state in ("alive", "elsewhere"):
                log.debug("replica %s does not answer but is %s; its agents stay", replica_id, state)
                continue
            if beating is not None:  # liveness could not tell: the heartbeat decides, not a probe
                if replica_id not in beating:
                    gone.add(replica_id)
                continue
            try:
                async with asyncio.timeout(self.probe_timeout):
                    await self.directory.port(replica_id).snapshot()
            except ReplicaUnavailable:
                gone.add(replica_id)
            except Exception as exc:  # slow or unreachable: decide next round
                log.info("replica %s did not answer (%s); not moving its agents yet", replica_id, exc)
        return gone

    async def _liveness(self, replica_ids: list[str]) -> dict[str, Any]:
        """The directory's `liveness` answer (Serve: the Ray actor table), {} where it has none;
        every replica "unknown" where it failed."""
        ask = getattr(self.directory, "liveness", None)
        if ask is None or not replica_ids:
            return {}
        try:
            answer: dict[str, Any] = await ask(replica_ids)
        except Exception as exc:
            if not self._liveness_outage:
                log.warning("replica liveness could not be read (%s); deciding by heartbeat", exc)
                self._liveness_outage = True
            return dict.fromkeys(replica_ids, "unknown")
        return answer

    async def _beating(self, suspects: list[str], liveness: dict[str, Any]) -> set[str] | None:
        """The replicas with a live heartbeat, read only when a directory that has `liveness`
        could not tell some suspect's (None otherwise: where there is no `liveness`, in-process
        hosts, a probe decides). A replica Serve is draining does not answer a probe, but its
        process, and its heartbeat, go on until it exits: the heartbeat is the safe fallback."""
        if not suspects or not hasattr(self.directory, "liveness"):
            return None  # (nothing asked: an outage is not over yet)
        unknown = [r for r in suspects if liveness.get(r, "unknown") not in ("alive", "elsewhere", "dead")]
        if not unknown:
            if self._liveness_outage:
                log.warning("replica liveness answers again")
            self._liveness_outage = False
            return None
        if not self._liveness_outage:
            log.warning("replica liveness unknown for %s; deciding by heartbeat", ", ".join(unknown))
            self._liveness_outage = True
        return {str(beat.get("replica_id")) for beat in await self.registry.replicas()}

    def _missing(self, records: list[AgentRecord]) -> list[str]:
        """Agents the registry places on an answering replica that hosts no copy of them, nor does
        any other answering replica, for `missing_grace` seconds (a copy that yielded to another,
        which then ended with its replica, left its record behind naming it)."""
        now = time.monotonic()
        anywhere = set().union(*self._hosted.values()) if self._hosted else set()
        missing = {r.agent_id for r in records if r.replica in self._hosted and r.agent_id not in anywhere}
        for agent_id in list(self._missing_since):
            if agent_id not in missing:
                del self._missing_since[agent_id]
        for agent_id in missing:
            self._missing_since.setdefault(agent_id, now)
        return sorted(a for a in missing if now - self._missing_since[a] >= self.missing_grace)

    def _suspending(self, agent_id: str, lifecycle: Any, suspension: Any) -> bool:
        """Whether the agent's suspension is under way: recorded (the replica detached it, then
        records the request) after its lifecycle's last change, which turns SUSPENDED once its
        state is persisted. A slow persist is not a lost agent; one that stays so past
        `SUSPENDING_GRACE_FACTOR` missing graces (the suspension failed half-way) is re-placed."""
        if suspension is None or (lifecycle is not None and lifecycle.updated_at >= suspension.updated_at):
            return False
        since = self._missing_since.get(agent_id, time.monotonic())
        return time.monotonic() - since < self.missing_grace * SUSPENDING_GRACE_FACTOR

    async def _page_table_suspects(self) -> set[str]:
        """Replicas the page table lists pages on that are not among the live ones (read every
        `PAGE_SWEEP_SECONDS`, through the page index, not every tick)."""
        if self.page_table is None or time.monotonic() < self._next_page_sweep:
            return set()
        self._next_page_sweep = time.monotonic() + PAGE_SWEEP_SECONDS
        return await self.page_table.holders() - set(self._ports)

    async def _resume(self, replica_id: str, agent_id: str) -> bool:
        """Resume one agent; a failure is logged and retried next round, not the round's end."""
        try:
            await self._ports[replica_id].resume_agent(agent_id)
        except BlueprintTampered as exc:  # the replica marked it failed: nothing to retry
            log.error("agent %s was not resumed: %s", agent_id, exc)
            return False
        except Exception:
            log.exception(
                "resuming agent %s on replica %s failed; trying again next round", agent_id, replica_id
            )
            return False
        return True

    async def _memory(self, agent_id: str) -> int:
        """The agent's memory need, read (from its blueprint) only when replicas have a memory budget."""
        if self.memory_mb is None:
            return 0
        entry = await self._agent_board(agent_id).read(AgentStateProtocol.key("blueprint"))
        try:
            return AgentBlueprint.from_text(entry.value).resources.memory_mb if entry else 0
        except BlueprintTampered:
            return 0  # the replica's restore refuses it too, and marks the agent failed

    async def _bound_pages(self, agent_id: str) -> list[str]:
        entry = await self._agent_board(agent_id).read(AgentStateProtocol.key("metadata"))
        return list(AgentMetadata.model_validate(entry.value).bound_pages) if entry else []
