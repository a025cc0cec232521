"""ReplicaPages: the page side of a `ReplicaHost` (docs/vcm.md).

It counts what the replica's engine does with pages (hits, faults, loads, swap-ins, evictions,
prefetches), keeps the page table in step with what the engine holds, fetches a page-bound agent's
pages before its first step here, and tells the engine which pages it must not evict (`held`) and
which it should keep while another can go (`needed_soon`), in the order they will be needed, from
what this replica knows now: runs claimed, prefetches, what the resource monitor says of the
suspended agents, and each page's own history of uses here (`colony.vcm.page_demand`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from colony import metrics
from colony.agents import Agent, AgentState, AgentType, LocalAgentRuntime
from colony.inference import InferenceEngine, Page
from colony.system.registry import AgentRegistry, SoonSuspended
from colony.vcm import PageTable
from colony.vcm.eviction import NeededSoon, SoonEntry
from colony.vcm.page_demand import PageDemand

log = logging.getLogger(__name__)

SHOWN_ENTRIES = 32  # needed-soon entries a heartbeat shows (`GET /v1/replicas`)


class _Plan:
    """The needed-soon list being worked out: entries in order, and the tiers they make (a page
    counts once, where first named)."""

    def __init__(self) -> None:
        self.entries: list[SoonEntry] = []
        self.tiers: list[list[str]] = []
        self.named: set[str] = set()

    def add(self, entries: list[SoonEntry]) -> None:
        """One tier: pages whose order among themselves is not known (needed together)."""
        fresh = [e for e in entries if e.page_id not in self.named]
        if fresh:
            self.named.update(e.page_id for e in fresh)
            self.entries.extend(fresh)
            self.tiers.append([e.page_id for e in fresh])


class ReplicaPages:
    """The pages of replica `replica_id`. Its host binds the engine, the page table and the
    registry when it starts (`bind`), then the runtime of its agents (`runtime`)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.engine: InferenceEngine | None = None
        self.table: PageTable | None = None
        self.registry: AgentRegistry | None = None
        self.runtime: LocalAgentRuntime | None = None
        self.counts = dict.fromkeys(("hits", "faults", "loads", "swap_ins", "evictions", "prefetched"), 0)
        self._accessed: set[str] = set()  # pages used since the last heartbeat (their last_access)
        # pages of suspended page-bound agents the monitor would resume here (read each heartbeat)
        self._soon_suspended: tuple[SoonSuspended, ...] = ()  # closest first, as the monitor wrote them
        self._prefetching: dict[str, list[str]] = {}  # agent id -> pages being prefetched for it
        self.demand = PageDemand()  # each page's uses here: when it is needed next
        # the latest needed-soon list (page -> reason): what a use is checked against (`using`)
        self._named: dict[str, str] = {}
        self.soon_uses: Counter[str] = Counter()  # uses by named/unnamed and hit/fault (`info`)

    def bind(self, engine: InferenceEngine, table: PageTable, registry: AgentRegistry) -> None:
        self.engine, self.table, self.registry = engine, table, registry

    def held(self) -> dict[str, list[str]]:
        """Pages of the page-bound agents running here, by agent: the engine never evicts them for
        anyone else (their next step would fault the page straight back in); an agent's own fault
        (`generate(..., holder=)`) may. Idle, suspended and ended agents hold none."""
        if self.runtime is None:
            return {}
        held: dict[str, list[str]] = {}
        for agent_id in self.runtime.agent_ids:
            agent = self.runtime.get(agent_id)
            metadata = agent.metadata
            if metadata.agent_type is AgentType.VCM_BOUND and agent.state is AgentState.RUNNING:
                held[agent_id] = list(metadata.bound_pages)
        return held

    def needed_soon(self) -> NeededSoon:
        """Pages agents destined to this replica will use next, which eviction passes over while
        another page can go (`engine.pages_needed_soon`; a preference, never a pin), in tiers,
        soonest first (`soon_entries` says why and on what estimate). When every evictable page is
        needed soon, the engine evicts from the last tier that holds one: the page needed last."""
        return NeededSoon(self._plan().tiers)

    def soon_entries(self) -> list[SoonEntry]:
        """The needed-soon list with, for each page, why and the estimate it rests on."""
        return self._plan().entries

    def _plan(self) -> _Plan:
        """The order, soonest first, and why:

        1. `run_waiting`: pages of page-bound agents with a run claimed or queued here but not
           begun (`LocalAgentRuntime.runs_waiting`): certain, and next;
        2. `prefetching`: pages being prefetched for an agent just placed or resumed here: its
           first step comes next;
        3. `resuming`: pages of suspended page-bound agents the monitor would resume here, whose
           condition is close (children mostly done, pages mostly resident, room awaited), in
           the monitor's order, closest first (`monitor.ResumptionMonitor`, one read a beat);
        4. `history`: pages of the hosted page-bound agents that are idle, by the next use their
           own history here predicts (`PageDemand.order`): agents taking turns (the page used
           longest ago is needed next) and popular pages (short gaps) first; pages never used
           here last, together (no order known);
        5. `suspended`: pages of suspended agents the monitor would resume here only when asked
           (nothing says when): the first to go.
        Running agents' pages are held, not listed (`held`). Pure memory: no Redis read (the
        engine calls it under its lock, at every eviction)."""
        plan = _Plan()
        idle: dict[str, str] = {}  # page -> the first idle agent bound to it
        bound, running = self._bound_agents()
        for agent_id, agent in bound:
            pages = list(dict.fromkeys(agent.metadata.bound_pages))
            runs = self.runtime.runs_waiting(agent_id) if self.runtime is not None else 0
            if runs:
                why = f"{runs} run(s) claimed here, not begun"
                plan.add([SoonEntry(p, "run_waiting", 0.0, why, agent_id) for p in pages])
            else:
                idle.update((p, agent_id) for p in pages if p not in idle)
        for agent_id, pages in self._prefetching.items():
            why = "placed or resumed here: its first step comes next"
            plan.add([SoonEntry(p, "prefetching", 0.0, why, agent_id) for p in pages])
        later = [s for s in self._soon_suspended if s.close is not None and s.close <= 0.0]
        for soon in self._soon_suspended:
            if soon.close is None or soon.close > 0.0:
                plan.add([SoonEntry(soon.page_id, "resuming", None, soon.why)])
        unknown: list[SoonEntry] = []
        for page_id, estimate in self.demand.order(idle):
            entry = SoonEntry(page_id, "history", estimate.eta_s, estimate.basis, idle[page_id])
            if estimate.seen:
                plan.add([entry])
            else:
                unknown.append(entry)
        plan.add(unknown)
        for soon in later:
            plan.add([SoonEntry(soon.page_id, "suspended", None, soon.why)])
        # what a use is judged against (`using`): a running agent's pages keep the reason they
        # were named for before its run began (a list worked out meanwhile leaves them out)
        named = {page_id: self._named[page_id] for page_id in running if page_id in self._named}
        self._named = {**named, **{e.page_id: e.reason for e in plan.entries}}
        return plan

    def _bound_agents(self) -> tuple[list[tuple[str, Agent]], set[str]]:
        """The hosted page-bound agents that are not running, and the pages of those that are
        (a running agent holds its pages: `held`)."""
        if self.runtime is None:
            return [], set()
        found, running = [], set()
        for agent_id in self.runtime.agent_ids:
            agent = self.runtime.get(agent_id)
            if agent.metadata.agent_type is not AgentType.VCM_BOUND:
                continue
            if agent.state is AgentState.RUNNING:
                running.update(agent.metadata.bound_pages)
            else:
                found.append((agent_id, agent))
        return found, running

    def info(self) -> dict[str, Any]:
        """For the heartbeat (`GET /v1/replicas`): the first `SHOWN_ENTRIES` of the needed-soon
        list, with reasons and estimates, and how the uses since the start compared with it."""
        return {
            "needed_soon": [entry.as_dict() for entry in self.soon_entries()[:SHOWN_ENTRIES]],
            "needed_soon_uses": dict(sorted(self.soon_uses.items())),
        }

    async def refresh_needed_soon(self) -> None:
        """Read which pages the suspended page-bound agents the monitor would resume here need:
        the resource monitor works it out once per round from what it reads anyway (an agent goes
        to the replica holding most of its pages, so one with a page resident or swapped here
        counts) and leaves it in one entry for this replica; a heartbeat reads that one entry
        (none while the engine holds no page), whatever the number of suspended agents."""
        assert self.engine is not None and self.registry is not None
        if not self.engine.resident_pages() and not self.engine.swapped_pages():
            self._soon_suspended = ()
            return
        self._soon_suspended = tuple(await self.registry.needed_soon_entries(self.replica_id))

    def prefetch(self, agent: Agent) -> Coroutine[Any, Any, None] | None:
        """What to fetch before a page-bound agent's first step here: its bound pages (None for
        any other agent; the runtime asks when it hosts an agent, placed or resumed, and its first
        run waits for the fetch), so that step does not fault."""
        metadata = agent.metadata
        if self.engine is None or metadata.agent_type is not AgentType.VCM_BOUND or not metadata.bound_pages:
            return None
        return self._prefetch(agent.agent_id, list(dict.fromkeys(metadata.bound_pages)))

    async def _prefetch(self, agent_id: str, pages: list[str]) -> None:
        """Bring the pages into this engine. Never waits behind pages in use, never evicts one
        another agent needs soon (`engine.prefetch`, which reads `needed_soon` under its
        reservation lock: a prefetch started just before for another agent counts): when they do
        not fit now, the step faults them in as it would have without. A prefetch that evicted
        the page prefetched for the agent placed just before (16 workers on 4 slots) would only
        move the fault to that agent's first step."""
        assert self.engine is not None
        self._prefetching[agent_id] = pages
        for page_id in pages:  # its first step comes next: a use, as far as the history goes
            self.demand.record(page_id, ahead=True)
        try:
            swapped = set(self.engine.swapped_pages())
            brought = await self.engine.prefetch(pages, self.fetch)
        finally:
            self._prefetching.pop(agent_id, None)
            for page_id in pages:
                self.demand.release(page_id)
        if brought:
            self.counts["prefetched"] += len(brought)
            self.counts["swap_ins"] += sum(1 for p in brought if p in swapped)
            self.counts["loads"] += sum(1 for p in brought if p not in swapped)
            metrics.PAGES_PREFETCHED.inc(len(brought))
            await self.sync()
            log.info("agent %s: prefetched pages %s on %s", agent_id, brought[:5], self.replica_id)

    async def fetch(self, page_id: str) -> Page:
        """A page's text, from the page table (what the engine loads)."""
        assert self.table is not None
        return await self.table.content(page_id)

    @contextlib.asynccontextmanager
    async def using(self, page_ids: list[str], holder: str | None = None) -> AsyncIterator[list[str]]:
        """The pages resident and pinned for the block, all or none (faults counted, the page
        table told); yields the ids faulted in."""
        assert self.engine is not None
        swapped = set(self.engine.swapped_pages())
        named = self._named  # the list as it stood before this use (its own fault rewrites it)
        async with self.engine.using_pages(page_ids, self.fetch, holder=holder) as faulted:
            self._accessed.update(page_ids)
            self.counts["hits"] += len(page_ids) - len(faulted)
            self.counts["faults"] += len(faulted)
            self.counts["swap_ins"] += sum(1 for p in faulted if p in swapped)
            self.counts["loads"] += sum(1 for p in faulted if p not in swapped)
            self._note_uses(page_ids, faulted, named)
            if faulted:
                await self.sync()
            try:
                yield faulted
            finally:
                for page_id in page_ids:
                    self.demand.release(page_id)

    def _note_uses(self, page_ids: list[str], faulted: list[str], named: dict[str, str]) -> None:
        """Record the uses in the pages' history, and count each one that begins a use (not the
        next step of the same run) by whether the needed-soon list named the page just before
        and whether it was resident (`metrics.NEEDED_SOON_USES`): how good the prediction is."""
        for page_id in page_ids:
            if not self.demand.record(page_id):
                continue
            reason = named.get(page_id, "none")
            outcome = "fault" if page_id in faulted else "hit"
            metrics.NEEDED_SOON_USES.labels(reason, outcome).inc()
            self.soon_uses[f"{'unnamed' if reason == 'none' else 'named'}_{outcome}"] += 1

    async def evict(self, page_id: str) -> bool:
        """Evict a page from the engine (counted, the page table told); whether it was there."""
        assert self.engine is not None
        evicted = await self.engine.evict_page(page_id)
        self.counts["evictions"] += int(evicted)
        await self.sync()
        return evicted

    async def sync(self) -> None:
        """Make the page table say what this engine holds."""
        assert self.engine is not None and self.table is not None
        swapped = self.engine.swapped_pages()
        await self.table.reconcile(self.replica_id, self.engine.resident_pages(), swapped)

    async def touch_accessed(self) -> None:
        """Tell the page table which pages were used since the last call (their last access)."""
        if self._accessed and self.table is not None:
            accessed, self._accessed = self._accessed, set()
            await self.table.touch(sorted(accessed))
