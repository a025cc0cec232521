"""Which resident page to evict when an engine needs room: the eviction policy interface.

Engines call `touch` when a page is loaded or used, `forget` when it leaves, and `victim` (through
`unpinned_victim`, which leaves out pages in use) to pick the page to evict. The cluster's engines
and `benchmarks/affinity_sim.py` use these classes, so the simulator measures the policy the cluster runs.

- `LRUEviction`: least recently used (what prefix caches such as SGLang's radix cache do).
- `FrequencyEviction` (default): LFU with dynamic aging (LFU-DA). A page's priority is its use
  count plus the cache's age, the priority of the last page evicted; the lowest goes. Pages many
  agents keep coming back to stay resident through bursts of one-off pages, which LRU lets flush
  them, and the aging lets a once-popular page fall out when its demand stops.

Needed soon (agent-aware eviction, as in KVFlow): a cache that only looks back at past uses evicts
the page a queued or suspended agent is about to use as readily as one nobody will ask for again,
and that agent then faults it straight back in. Colony knows who will run next (queued runs,
suspended agents' resumption conditions, bound pages), so `unpinned_victim` takes the pages
needed soon and picks its victim among the others first. When every evictable page is needed
soon, what is known of their order decides (`NeededSoon`: tiers of pages, soonest first): the
victim comes from the last tier that holds one, so the page needed last goes, which is Belady's
choice (farthest next use) over what is known; within a tier, whose order is not known, the
policy chooses. That matters where agents take turns in a cycle longer than the cache holds:
there the page just used is the one needed last, and a look only at past uses (LRU, LFU) evicts
the page needed next instead. It is a preference, never a pin: a load never waits because the
only free slots hold pages needed soon.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from colony.errors import InvalidArgument


class EvictionPolicy(ABC):
    name: str = "policy"

    @abstractmethod
    def touch(self, page_id: str) -> None:
        """The page was loaded or used."""

    @abstractmethod
    def forget(self, page_id: str) -> None:
        """The page left the cache (evicted or dropped)."""

    @abstractmethod
    def victim(self, candidates: Iterable[str]) -> str:
        """The page to evict among `candidates` (resident pages); the caller evicts it and calls
        `evicted`."""

    def evicted(self, page_id: str) -> None:
        """`victim`'s choice was evicted (policies with aging advance their clock here)."""
        self.forget(page_id)

    def unpinned_victim(
        self, candidates: Iterable[str], pinned: Collection[str] = (), needed_soon: Any = ()
    ) -> str | None:
        """The policy's victim among the candidates that are not pinned (in use by a request or a
        page-bound step: evicting one would pull its KV cache from under it); None when every
        candidate is pinned, and the caller waits for an unpin. Pages `needed_soon` (by a queued
        or suspended agent; anything `NeededSoon.of` takes) are passed over while any other
        candidate is free; when none is, the victim comes from the last of its tiers that holds
        one (the page needed last), chosen by the policy within that tier."""
        free = [page_id for page_id in candidates if page_id not in pinned]
        if not free:
            return None
        soon = NeededSoon.of(needed_soon)
        spare = [page_id for page_id in free if page_id not in soon]
        if spare:
            return self.victim(spare)
        last = max(soon.tier_of(page_id) for page_id in free)
        return self.victim([page_id for page_id in free if soon.tier_of(page_id) == last])


class NeededSoon:
    """Pages needed soon, in tiers, soonest first: what is known of their order. A page counts in
    the first tier that names it. `of` makes one from what a replica host or a benchmark says:
    a set (or any set-like, such as a dict's keys) is one tier, its order unknown; any other
    iterable (a list, a tuple, a dict's keys in order) is read as a sequence: a page id in it is
    one tier, in that order (a queue whose order is known), and an iterable in it (a set, a list)
    is one tier (a group whose inner order is unknown). Made once, never changed."""

    __slots__ = ("_tier_of", "pages", "tiers")

    def __init__(self, tiers: Iterable[Iterable[str] | str] = ()) -> None:
        tier_of: dict[str, int] = {}
        kept: list[frozenset[str]] = []
        for tier in tiers:
            # each page looked up once: `frozenset - dict keys` would copy every earlier page per tier
            fresh = frozenset(p for p in ([tier] if isinstance(tier, str) else tier) if p not in tier_of)
            if fresh:
                tier_of.update(dict.fromkeys(fresh, len(kept)))
                kept.append(fresh)
        self.tiers: tuple[frozenset[str], ...] = tuple(kept)
        self.pages: frozenset[str] = frozenset(tier_of)
        self._tier_of = tier_of

    def tier_of(self, page_id: str) -> int:
        """The place of the page's tier, soonest first (past the last for a page not needed soon)."""
        return self._tier_of.get(page_id, len(self.tiers))

    @classmethod
    def of(cls, soon: Any) -> NeededSoon:
        if isinstance(soon, NeededSoon):
            return soon
        if isinstance(soon, AbstractSet):
            return cls([soon])
        if isinstance(soon, str):
            return cls([soon])
        return cls(soon)

    def __contains__(self, page_id: object) -> bool:
        return page_id in self.pages

    def __iter__(self) -> Iterator[str]:
        """Every page, tier by tier (in no particular order within a tier)."""
        for tier in self.tiers:
            yield from sorted(tier)

    def __len__(self) -> int:
        return len(self.pages)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NeededSoon):
            return NotImplemented
        return other.tiers == self.tiers

    def __hash__(self) -> int:
        return hash(self.tiers)

    def __repr__(self) -> str:
        return f"NeededSoon({[sorted(t) for t in self.tiers]})"


@dataclass(frozen=True, slots=True)
class SoonEntry:
    """One page needed soon, as a replica works it out (`ReplicaPages.soon_entries`): why
    (`reason`: run_waiting, prefetching, resuming, history, suspended), the estimated seconds to
    its next use where one is known (`eta_s`), what the estimate rests on (`basis`, for people),
    and the agent it is needed by (None where the page's own history speaks)."""

    page_id: str
    reason: str
    eta_s: float | None = None
    basis: str = ""
    agent_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        eta = None if self.eta_s is None else round(self.eta_s, 3)
        return {
            "page_id": self.page_id,
            "reason": self.reason,
            "eta_s": eta,
            "basis": self.basis,
            "agent_id": self.agent_id,
        }


class LRUEviction(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._clock = itertools.count()
        self._last: dict[str, int] = {}

    def touch(self, page_id: str) -> None:
        self._last[page_id] = next(self._clock)

    def forget(self, page_id: str) -> None:
        self._last.pop(page_id, None)

    def victim(self, candidates: Iterable[str]) -> str:
        return min(candidates, key=lambda p: (self._last.get(p, -1), p))


class FrequencyEviction(EvictionPolicy):
    name = "lfu-da"

    def __init__(self) -> None:
        self._clock = itertools.count()
        self._age = 0.0
        self._uses: dict[str, int] = {}
        self._priority: dict[str, float] = {}
        self._last: dict[str, int] = {}

    def touch(self, page_id: str) -> None:
        uses = self._uses.get(page_id, 0) + 1
        self._uses[page_id] = uses
        self._priority[page_id] = self._age + uses
        self._last[page_id] = next(self._clock)

    def forget(self, page_id: str) -> None:
        self._uses.pop(page_id, None)
        self._priority.pop(page_id, None)
        self._last.pop(page_id, None)

    def victim(self, candidates: Iterable[str]) -> str:
        # lowest priority; among equals the least recently used
        return min(candidates, key=lambda p: (self._priority.get(p, self._age), self._last.get(p, -1), p))

    def evicted(self, page_id: str) -> None:
        self._age = max(self._age, self._priority.get(page_id, self._age))
        self.forget(page_id)


POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUEviction, "lfu-da": FrequencyEviction}


def eviction_policy(name: str) -> EvictionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidArgument(f"unknown eviction policy {name!r}; choose one of {sorted(POLICIES)}") from None
