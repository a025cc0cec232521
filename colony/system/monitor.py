"""The resource monitor: resumes suspended agents when their ResumptionCondition holds.

Each `tick()` (the control plane runs one every `period` seconds) reads the suspended agents from
the registry (through its resumable index: an agent suspended to make room, e.g. an idle session,
waits to be asked for, `resume_now`, and costs a round nothing) and, highest priority first (FIFO
among equals), evaluates each condition:
CHILDREN_COMPLETED (every child STOPPED/FAILED in the registry or its lifecycle),
RESOURCE_AVAILABLE (a replica has room), PAGES_AVAILABLE (every page resident somewhere in the page
table), IMMEDIATE, CUSTOM (only after `request_resume`). A met condition resumes the agent, same id
and restored state, on the best replica for its pages. The pages of the page-bound agents left
suspended are then left for the replicas that would get them, closest resumption first
(`colony.system.soon_publish`), which their eviction passes over while another page can go.

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
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.agents.blueprint import AgentBlueprint
from colony.agents.models import (
    AgentMetadata,
    AgentState,
    ResumptionCondition,
    ResumptionKind,
    SuspensionRequest,
)
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlueprintTampered,
    ReplicaUnavailable,
    ResourceExhausted,
)
from colony.system.placement import gather_snapshots
from colony.system.registry import NOT_HOSTED, AgentRecord, AgentRegistry
from colony.system.replicas import ReplicaDirectory, ReplicaPort, as_directory, views_of
from colony.system.resumption_queue import Queued, queue_of, read_suspension, valid_or_none
from colony.system.soon_publish import (
    WAITS_FOR_ROOM,
    Judged,
    NeededSoonPublisher,
    Waiting,
    children_done,
    pages_resident,
)
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
# How often a round also reads every suspended agent's record, for those that do not say what they
# wait for (records written before they did); the others are read through the resumable index.
FULL_SWEEP_SECONDS = 60.0
# The states in which a replica hosts the agent: the records `recover_orphans` reads (never the
# suspended or ended ones, which may be many)
# Idle agents one on-demand resume suspends at most to fit (more only where memory budgets differ)
MAKE_ROOM_TRIES = 4
MakeRoom = Callable[[int, list[str]], Awaitable[str]]  # (priority, exclude) -> the agent suspended
HOSTED_STATES = tuple(s.value for s in AgentState if s.value not in NOT_HOSTED)


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
        self._refreshed_at = 0.0  # when `_views` were read (monotonic; 0: to be read again)
        self._next_page_sweep = 0.0
        self._next_full_sweep = 0.0
        self.missing_grace = missing_grace
        self._missing_since: dict[str, float] = {}  # agent -> when first found on no replica
        self._liveness_outage = False  # `liveness` could not answer last round (logged once)
        # what each replica is told its suspended page-bound agents will need there, closest first
        self._soon = NeededSoonPublisher(registry)

    def request_resume(self, agent_id: str) -> None:
        """The external trigger of CUSTOM conditions (and a push for any other kind)."""
        self._custom.add(agent_id)

    async def _refresh(self) -> None:
        found = await gather_snapshots(self.directory)
        self._ports = {rid: port for rid, (port, _) in found.items()}
        self._views = views_of([s for _, s in found.values()], self.max_agents, self.memory_mb)
        self._hosted = {rid: {slot.agent_id for slot in s.agents} for rid, (_, s) in found.items()}
        self._refreshed_at = time.monotonic()

    def forget(self, agent_id: str) -> None:
        """The agent was deleted: no resume of it is pending any more."""
        self._custom.discard(agent_id)
        self._missing_since.pop(agent_id, None)

    def invalidate(self) -> None:
        """The replica views are out of date (an agent was placed): the next decision reads them."""
        self._refreshed_at = 0.0

    def note_left(self, replica_id: str, agent_id: str) -> None:
        """`agent_id` left `replica_id` (suspended through the control plane): one slot less in use
        in the views, if they count it (its memory is not known here: counted as still taken, the
        safe side). Views read after it left (a round in between) do not count it: freeing its
        slot there again would let the next decisions place over `max_agents_per_replica`."""
        hosted = self._hosted.get(replica_id)
        if hosted is None or agent_id not in hosted:
            return
        hosted.discard(agent_id)
        for view in self._views:
            if view.replica_id == replica_id and view.load > 0:
                view.load -= 1

    async def resume_now(self, agent_id: str, make_room: MakeRoom | None = None) -> AgentRecord | None:
        """Resume one suspended agent at once (an explicit request: `POST .../resume`), without a
        whole round: one placement decision, on the replica views of the last round when they are
        fresher than a period (else read again; and read again when they find no room or their
        choice fails, since a slot may have been freed or a replica lost since), then the resume
        on the target, which reads the agent's state. Checked under the lock that the agent is
        still suspended (a round may have resumed it meanwhile): `AgentNotFound` /
        `AgentStateConflict`. None when no replica has room or the resume failed: the agent stays
        suspended with its request noted (`request_resume`), and a later round resumes it.
        `make_room` (room on demand): with no room, called with the agent's priority to suspend
        an idle agent (`AgentPlacer.make_room_locked`), once, before giving up."""
        async with self.lock:
            record = await self.registry.get(agent_id)
            if record is None:
                raise AgentNotFound(f"no agent named {agent_id!r}; GET /v1/agents lists them")
            if record.state != "suspended":
                raise AgentStateConflict(f"agent {agent_id!r} is {record.state}, not suspended")
            fresh = self._views and time.monotonic() - self._refreshed_at < self.period
            if not fresh:
                await self._refresh()
            metadata, _request, condition, pages = await self._suspension(agent_id)
            hard = condition.kind is ResumptionKind.PAGES_AVAILABLE
            memory = await self._memory(agent_id)
            target = self._choose(pages, hard, memory)
            if target is None and fresh:
                await self._refresh()
                target = self._choose(pages, hard, memory)
                fresh = False
            if target is None and make_room is not None:
                target = await self._room_for(agent_id, metadata, pages, hard, memory, make_room)
            if target is None:
                self._custom.add(agent_id)
                return None
            answer = await self._resume(target.replica_id, agent_id)
            if answer is None:
                # the resume may have taken effect though it failed (the replica's registry write,
                # or its answer, was lost): resuming it elsewhere would run two live copies
                await self._refresh()
                taken = await self._taken_effect(record, condition)
                if taken is not None:
                    return taken
                if fresh and await self._lifecycle_state(agent_id) == "suspended":
                    # a replica of the last round's views may be gone since: once more, on new views
                    target = self._choose(pages, hard, memory)
                    answer = await self._resume(target.replica_id, agent_id) if target is not None else None
                    if answer is None and target is not None:
                        await self._refresh()
                        taken = await self._taken_effect(record, condition)
                        if taken is not None:
                            return taken
            if target is None or answer is None:
                self._custom.add(agent_id)
                return None
            self._custom.discard(agent_id)
            metrics.AGENT_RESUMPTIONS.labels(condition.kind.value).inc()
            target.load += 1  # the views stay true for the next decision without a new read
            if target.memory_free_mb is not None:
                target.memory_free_mb -= memory
            self._hosted.setdefault(target.replica_id, set()).add(agent_id)
            return AgentRecord.model_validate(answer)

    async def _room_for(
        self,
        agent_id: str,
        metadata: AgentMetadata | None,
        pages: list[str],
        hard: bool,
        memory: int,
        make_room: MakeRoom,
    ) -> ReplicaView | None:
        """Suspend idle agents (`make_room`) until the agent fits, at most MAKE_ROOM_TRIES; None
        when none can be suspended (all busy, or of a higher priority)."""
        for _ in range(MAKE_ROOM_TRIES):
            try:
                await make_room(metadata.priority if metadata else 0, [agent_id])
            except ResourceExhausted as exc:
                log.info("no room made for agent %s: %s", agent_id, exc)
                return None
            await self._refresh()
            target = self._choose(pages, hard, memory)
            if target is not None:
                return target
        return None

    def _hosting(self, agent_id: str) -> str | None:
        """The replica whose snapshot (the views' last read) hosts the agent, if any."""
        return next((rid for rid, agents in sorted(self._hosted.items()) if agent_id in agents), None)

    async def _lifecycle_state(self, agent_id: str) -> str | None:
        """The agent's lifecycle state in its own scope (the source of truth; the registry lags)."""
        entry = await self._agent_board(agent_id).read(AgentStateProtocol.key("lifecycle"))
        value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
        state = value.get("state")
        return state if isinstance(state, str) else None

    async def _taken_effect(self, record: AgentRecord, condition: ResumptionCondition) -> AgentRecord | None:
        """After a resume that failed: the agent's record as it is if a replica hosts it now (the
        resume took effect; the replica's heartbeat writes the registry record it could not), else
        None. The views were just read, so they count it already."""
        replica_id = self._hosting(record.agent_id)
        if replica_id is None:
            return None
        log.warning(
            "resuming agent %s failed but replica %s hosts it: counted as resumed there",
            record.agent_id,
            replica_id,
        )
        self._custom.discard(record.agent_id)
        metrics.AGENT_RESUMPTIONS.labels(condition.kind.value).inc()
        state = await self._lifecycle_state(record.agent_id)
        return record.model_copy(update={"state": state or "idle", "replica": replica_id})

    def _choose(self, pages: list[str], hard: bool, memory: int) -> ReplicaView | None:
        try:
            return choose_replica(self._views, pages, hard=hard, memory_mb=memory)
        except ResourceExhausted:
            return None

    async def _suspension(
        self, agent_id: str
    ) -> tuple[AgentMetadata | None, SuspensionRequest | None, ResumptionCondition, list[str]]:
        """A suspended agent's metadata, suspension request, the condition it waits for and the
        pages it needs (the condition's, else its bound pages): one read."""
        held = await read_suspension(self._agent_board(agent_id))
        return held.metadata, held.request, held.condition, held.pages

    async def _suspended_records(self) -> list[AgentRecord]:
        """The suspended agents a round looks at: those whose condition the monitor checks (the
        registry's resumable index), those with a resume requested (`request_resume`), and, every
        `FULL_SWEEP_SECONDS`, every suspended record that does not say what it waits for (written
        before records said so). Agents suspended to make room (idle sessions: 10,000 of them),
        resumed when asked for, cost a round nothing."""
        found = {r.agent_id: r for r in await self.registry.list(state="suspended", resumable=True)}
        for agent_id in sorted(self._custom - set(found)):
            record = await self.registry.get(agent_id)
            if record is not None and record.state == "suspended":
                found[agent_id] = record
        if time.monotonic() >= self._next_full_sweep:
            self._next_full_sweep = time.monotonic() + FULL_SWEEP_SECONDS
            for record in await self.registry.list(state="suspended"):
                if record.waits is None:
                    found.setdefault(record.agent_id, record)
        return list(found.values())

    async def _pending(self) -> list[Queued]:
        """The suspended agents, highest priority first (FIFO among equals): the resumption
        queue (colony.system.resumption_queue, which the API shows as it is here)."""
        records = await self._suspended_records()
        return await queue_of([r.agent_id for r in records], self._agent_board)

    def _agent_board(self, agent_id: str) -> Blackboard:
        return self.blackboard.scoped(
            scope_id(
                BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent_id
            )
        )

    async def _judge(self, agent_id: str, condition: ResumptionCondition, pages: list[str]) -> Judged:
        """Whether the condition holds, and how close it is (`soon_publish.Judged`), from what the
        check reads anyway."""
        kind = condition.kind
        if agent_id in self._custom or kind is ResumptionKind.IMMEDIATE:
            return Judged(True, 1.0, "resume requested" if agent_id in self._custom else "resumes at once")
        if kind is ResumptionKind.CHILDREN_COMPLETED:
            done, total = await children_done(self.registry, self._agent_board, condition.agent_ids)
            return Judged(done >= total, done / total if total else 1.0, f"children {done}/{total} done")
        if kind is ResumptionKind.RESOURCE_AVAILABLE:
            room = any(not v.full for v in self._views)
            return Judged(room, 1.0 if room else WAITS_FOR_ROOM, "room" if room else "waits for room")
        if kind is ResumptionKind.PAGES_AVAILABLE:
            resident = pages_resident(self._views, pages)
            near, why = resident / len(pages) if pages else 1.0, f"pages {resident}/{len(pages)} resident"
            if self.page_table is None:
                return Judged(False, near, why)
            for page_id in pages:
                record = await self.page_table.page(page_id)
                if record is None or not record.resident_on:
                    return Judged(False, near, why)
            return Judged(True, 1.0, why)
        return Judged(False, 0.0, "waits to be asked for")  # CUSTOM without a trigger

    async def tick(self) -> list[str]:
        """One evaluation round; the ids of the agents resumed (or re-placed)."""
        async with self.lock:
            return await self._tick()

    async def _tick(self) -> list[str]:
        await self._refresh()
        resumed = await self.recover_orphans()
        waiting: list[Waiting] = []  # the page-bound agents left suspended, highest priority first
        for queued in await self._pending():
            agent_id, condition, pages, bound = queued.agent_id, queued.condition, queued.pages, queued.bound
            if self._hosting(agent_id) is not None:
                # hosted though its record says suspended: a resume took effect and its registry
                # write was lost (the replica's next heartbeat writes it); resumed already
                continue
            judged = await self._judge(agent_id, condition, pages)
            if bound and pages:  # (one resumed below leaves its `bound` pages with it)
                waiting.append(Waiting(agent_id, pages, judged.close, judged.why))
            if not judged.met:
                continue
            hard = condition.kind is ResumptionKind.PAGES_AVAILABLE
            memory = await self._memory(agent_id)
            try:
                target = choose_replica(self._views, pages, hard=hard, memory_mb=memory)
            except ResourceExhausted:
                continue  # no room now; next round
            if await self._resume(target.replica_id, agent_id) is None:
                continue
            self._custom.discard(agent_id)
            metrics.AGENT_RESUMPTIONS.labels(condition.kind.value).inc()
            await self._refresh()
            resumed.append(agent_id)
            if bound and pages:
                waiting.pop()
        await self._soon.publish(self._views, waiting)
        return resumed

    async def recover_orphans(self) -> list[str]:
        """Re-place the agents of replicas that are gone; drop those replicas from the page table.

        A replica counts as gone only when the directory's `liveness` says its process is dead,
        or (where it cannot tell) a call addressed to it says so (`ReplicaUnavailable`), never
        because it was slow to answer: moving the agents of a live replica would run them twice.
        """
        if not self._ports:
            return []  # nothing alive to move them to (or the directory is not answering)
        records = [r for state in HOSTED_STATES for r in await self.registry.list(state=state) if r.replica]
        suspects = sorted(
            {r.replica for r in records if r.replica and r.replica not in self._ports}
            | await self._page_table_suspects()
        )
        gone = await self.gone(suspects)
        recovered: list[str] = []
        for dead in sorted(gone):
            log.warning("replica %s is gone; re-placing its agents", dead)
            if self.page_table is not None:
                await self.page_table.drop_replica(dead)
        orphans = [r.agent_id for r in records if r.replica in gone and await self._lost(r.agent_id, r)]
        for agent_id in self._missing(records):
            if await self._lost(agent_id):
                log.warning("agent %s: no replica hosts it, though the registry places it on one", agent_id)
                orphans.append(agent_id)
        for agent_id in orphans:
            try:  # one agent's spoilt state must not stop the others' (found by review)
                pages = await self._bound_pages(agent_id)
                target = choose_replica(self._views, pages, memory_mb=await self._memory(agent_id))
            except ResourceExhausted:
                continue  # every replica is full; next round
            except Exception as exc:
                log.warning("agent %s: not re-placed this round: %r", agent_id, exc)
                continue
            if await self._resume(target.replica_id, agent_id) is None:
                continue
            self._missing_since.pop(agent_id, None)
            metrics.AGENT_RESUMPTIONS.labels("replica_lost").inc()
            await self._refresh()
            recovered.append(agent_id)
        return recovered

    async def gone(self, suspects: list[str]) -> set[str]:
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

    async def _lost(self, agent_id: str, gone: AgentRecord | None = None) -> bool:
        """Whether a replica should host the agent and none does. Not one whose lifecycle says it
        is suspended or ended (its registry write was lost; found by review: one stopped on a
        replica that then died came back wiped, one suspended by request resumed): its record is
        healed here when its replica is `gone`, else by that replica's heartbeat; nor one whose
        suspension is under way."""
        lifecycle, suspension = await self._agent_board(agent_id).read_many(
            [AgentStateProtocol.key("lifecycle"), AgentStateProtocol.key("suspension")]
        )
        held = lifecycle.value if lifecycle is not None and isinstance(lifecycle.value, dict) else {}
        if held.get("state") in NOT_HOSTED:
            if gone is not None:
                await self.registry.put(gone.model_copy(update={"state": held["state"], "replica": None}))
            return False
        return not self._suspending(agent_id, lifecycle, suspension)

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

    async def _resume(self, replica_id: str, agent_id: str) -> dict[str, Any] | None:
        """Resume one agent: its registry record as the replica wrote it, or None when it failed
        (logged, and retried next round: never the round's end)."""
        try:
            return await self._ports[replica_id].resume_agent(agent_id)
        except BlueprintTampered as exc:  # the replica marked it failed: nothing to retry
            log.error("agent %s was not resumed: %s", agent_id, exc)
            return None
        except Exception:
            log.exception(
                "resuming agent %s on replica %s failed; trying again next round", agent_id, replica_id
            )
            return None

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
        metadata = valid_or_none(AgentMetadata, entry.value) if entry else None
        return list(metadata.bound_pages) if metadata is not None else []  # (spoilt: placed anywhere)
