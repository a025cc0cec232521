"""ReplicaPages: the page side of a `ReplicaHost` (docs/vcm.md).

It counts what the replica's engine does with pages (hits, faults, loads, swap-ins, evictions,
prefetches), keeps the page table in step with what the engine holds, fetches a page-bound agent's
pages before its first step here, and tells the engine which pages it must not evict (`held`) and
which it should keep while another can go (`needed_soon`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from colony import metrics
from colony.agents import Agent, AgentState, AgentType, LocalAgentRuntime
from colony.inference import InferenceEngine, Page
from colony.system.registry import AgentRegistry
from colony.vcm import PageTable
from colony.vcm.eviction import NeededSoon

log = logging.getLogger(__name__)


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
        self._soon_suspended: tuple[str, ...] = ()  # soonest first, as the monitor wrote them
        self._prefetching: dict[str, list[str]] = {}  # agent id -> pages being prefetched for it

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
        another page can go (`engine.pages_needed_soon`; a preference, never a pin), in tiers as
        far as their order is known, soonest first: those being prefetched for an agent just
        placed or resumed here (its first step comes next); those of the page-bound agents hosted
        here that are not running (their next run uses them; no order among them is known, so
        the policy chooses within that tier); then those of the suspended page-bound agents the
        monitor would resume here, one page a tier in its order (highest priority first,
        `refresh_needed_soon`). When every evictable page is needed soon, the last tier goes first."""
        prefetching: set[str] = set()
        for pages in self._prefetching.values():
            prefetching.update(pages)
        hosted: set[str] = set()
        if self.runtime is not None:
            for agent_id in self.runtime.agent_ids:
                agent = self.runtime.get(agent_id)
                metadata = agent.metadata
                if metadata.agent_type is AgentType.VCM_BOUND and agent.state is not AgentState.RUNNING:
                    hosted.update(metadata.bound_pages)
        return NeededSoon([prefetching, hosted, *([page] for page in self._soon_suspended)])

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
        self._soon_suspended = tuple(await self.registry.needed_soon(self.replica_id))

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
        try:
            swapped = set(self.engine.swapped_pages())
            brought = await self.engine.prefetch(pages, self.fetch)
        finally:
            self._prefetching.pop(agent_id, None)
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
        async with self.engine.using_pages(page_ids, self.fetch, holder=holder) as faulted:
            self._accessed.update(page_ids)
            self.counts["hits"] += len(page_ids) - len(faulted)
            self.counts["faults"] += len(faulted)
            self.counts["swap_ins"] += sum(1 for p in faulted if p in swapped)
            self.counts["loads"] += sum(1 for p in faulted if p not in swapped)
            if faulted:
                await self.sync()
            yield faulted

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
