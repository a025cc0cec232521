"""PageDemand: each page's own history of uses on one replica, and when it will be used next.

What orders the pages of idle page-bound agents (`ReplicaPages.needed_soon`, docs/vcm.md) without
any future knowledge: only the times this replica used each page. Per page it keeps the end of the
latest use and an estimate of the idle gap between uses (an exponentially weighted moving average,
`ALPHA`, with the mean absolute deviation of the gaps beside it). Uses closer together than
`BURST_GAP_SECONDS` (the steps of one run) are one use, so the gap measured is the one between runs.

The next use is then estimated two ways, weighted by how regular the gaps have been (their
deviation over their mean, against a Poisson process's):

- regular gaps (agents taking turns in a session or a team, a cycle): the page's phase counts, the
  next use comes at `last + interval`, so the page used longest ago is needed next;
- irregular gaps (independent requests, Zipf-popular pages: a Poisson process's gaps deviate from
  their mean by 2/e of it on average, `POISSON_DEVIATION`): the time since the last use says
  nothing, the expected wait is the mean gap, so popular pages (short gaps) come first.

A gap going on longer than the mean counts as a sample already (the page may have slowed down or
stopped: its estimate grows with the wait, and a page whose demand stopped sinks to the end rather
than staying due for ever). A page used once has no gap yet: it comes after every page with an
estimate, the most recently used first; a page never used, last. The first gap leaves how regular
the gaps are half way between the two until more come. At most `MAX_PAGES` pages are tracked, the
least recently used dropped first. Pure: no I/O, the clock injectable, so it is unit-tested with
explicit times.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_PAGES = 4096  # pages tracked per replica (least recently used dropped first)
ALPHA = 0.1  # weight of a new gap in the moving averages (about the last 10 gaps count)
BURST_GAP_SECONDS = 0.5  # uses closer than this are one use (the steps of one run)
# the mean absolute deviation of a Poisson process's gaps, over their mean (2/e): gaps this
# irregular say nothing of the phase
POISSON_DEVIATION = 2 / math.e


@dataclass(slots=True)
class _History:
    last: float  # the end of the latest use (its start while it lasts)
    interval: float | None = None  # the moving average of the idle gaps between uses
    deviation: float = 0.0  # the moving average of |gap - interval|
    uses: int = 1  # uses seen (bursts, not steps)
    ahead: bool = False  # the latest use so far is only a prefetch (its step is still to come)


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a page will be used next, and what that rests on. `eta_s`: seconds from now (0: due
    now), None where the history gives no interval (a page used once, or never)."""

    eta_s: float | None
    basis: str
    seen: bool = True  # False for a page with no history here


class PageDemand:
    """The use history of pages on one replica; see the module docstring."""

    def __init__(
        self,
        *,
        max_pages: int = MAX_PAGES,
        alpha: float = ALPHA,
        burst_gap: float = BURST_GAP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_pages = max(1, max_pages)
        self.alpha = alpha
        self.burst_gap = burst_gap
        self.clock = clock
        self._pages: OrderedDict[str, _History] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, page_id: object) -> bool:
        return page_id in self._pages

    def record(self, page_id: str, at: float | None = None, *, ahead: bool = False) -> bool:
        """The page is being used: a request or a step starts on it, or (`ahead`) a prefetch for
        the agent about to run. A use within `burst_gap` of the last one continues it. Whether
        this use begins one (not the next step of a run, nor a prefetch: the step after a
        prefetch does), which is what a prediction is judged on."""
        now = self.clock() if at is None else at
        history = self._pages.get(page_id)
        if history is None:
            self._pages[page_id] = _History(last=now, ahead=ahead)
            while len(self._pages) > self.max_pages:
                self._pages.popitem(last=False)
            return not ahead
        self._pages.move_to_end(page_id)
        if history.ahead and not ahead:  # the step a prefetch was for, however long its load took
            history.last, history.ahead = max(history.last, now), False
            return True
        gap = now - history.last
        if gap <= self.burst_gap:
            history.last = max(history.last, now)
            return False
        if history.interval is None:  # one gap: how regular they are is not known yet (half way)
            history.interval, history.deviation = gap, gap * POISSON_DEVIATION / 2
        else:
            history.deviation += self.alpha * (abs(gap - history.interval) - history.deviation)
            history.interval += self.alpha * (gap - history.interval)
        history.last = now
        history.uses += 1
        history.ahead = ahead
        return not ahead

    def release(self, page_id: str, at: float | None = None) -> None:
        """The use ended (the answer came back): the gap to the next use counts from here, so a
        long generation is not taken for a short gap."""
        history = self._pages.get(page_id)
        if history is not None:
            history.last = max(history.last, self.clock() if at is None else at)

    def estimate(self, page_id: str, now: float | None = None) -> Estimate:
        """The page's next use (see the module docstring for the rule)."""
        history = self._pages.get(page_id)
        if history is None:
            return Estimate(None, "no use seen here", seen=False)
        now = self.clock() if now is None else now
        since = max(0.0, now - history.last)
        if history.interval is None:
            return Estimate(None, f"used once, {since:.1f}s ago")
        interval, deviation = history.interval, history.deviation
        if since > interval:  # the gap going on is longer than usual: it counts as one already
            deviation += self.alpha * (since - interval - deviation)
            interval += self.alpha * (since - interval)
        irregular = min(1.0, deviation / interval / POISSON_DEVIATION) if interval > 0 else 0.0
        eta = (1.0 - irregular) * max(0.0, interval - since) + irregular * interval
        told = f"gap {interval:.1f}s +/- {deviation:.1f}s over {history.uses} uses, last {since:.1f}s ago"
        return Estimate(eta, told)

    def order(self, page_ids: Iterable[str], now: float | None = None) -> list[tuple[str, Estimate]]:
        """The pages, soonest next use first: those with an estimate by it, then those used once,
        most recent first, then those never used here, by id (their order unknown)."""
        now = self.clock() if now is None else now
        ranked: list[tuple[tuple[int, float, str], str, Estimate]] = []
        for page_id in dict.fromkeys(page_ids):
            estimate = self.estimate(page_id, now)
            if estimate.eta_s is not None:
                key = (0, estimate.eta_s, page_id)
            elif estimate.seen:
                key = (1, now - self._pages[page_id].last, page_id)
            else:
                key = (2, 0.0, page_id)
            ranked.append((key, page_id, estimate))
        ranked.sort(key=lambda item: item[0])
        return [(page_id, estimate) for _, page_id, estimate in ranked]
