"""The one interface every inference engine implements, and the factory that picks one.

Pins: a page in use (by an in-flight request, or held by whoever runs a page-bound step) is pinned,
and an engine that evicts on its own never chooses a pinned page: evicting it would pull the KV
cache from under the request that just loaded it. A load that finds every slot pinned waits for an
unpin, at most `pin_wait_seconds`, then fails with ResourceExhausted (the caller places the work
elsewhere or retries later).

Needed soon: pages that queued or suspended agents destined to this engine will use next are not
pinned (nobody uses them yet), but an engine that must evict passes them over while another page
can go (`pages_needed_soon`, set by the replica host; `colony.vcm.eviction`), and `prefetch`
brings such pages in before their agent runs, so its first step does not fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from colony import metrics
from colony.config import ColonySettings, EngineSettings
from colony.errors import PageNotResident, PageSlotsBusy
from colony.inference.models import (
    ChatMessage,
    EngineStats,
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Usage,
)
from colony.vcm.eviction import NeededSoon
from colony.vcm.page import Page

log = logging.getLogger(__name__)
PIN_POLL_SECONDS = 0.5  # a load waiting for a pinned slot looks again at least this often
# the page-bound agent whose pages are being brought in (its own held pages are not pinned for it)
_HOLDER: contextvars.ContextVar[str | None] = contextvars.ContextVar("colony_page_holder", default=None)
# set while a prefetch brings pages in: pages needed soon count as in use (never its victims), and
# it gives up (PageSlotsBusy) where a load would wait for room
_PREFETCH: contextvars.ContextVar[bool] = contextvars.ContextVar("colony_prefetch", default=False)


def render_page_prefix(pages: Sequence[Page]) -> str:
    """The system block a page (or pages, in the given order) becomes; identical at load and at use,
    so the tokens of a loaded page are a cached prefix of every request that names it."""
    return "\n\n".join(f"<page id={p.page_id}>\n{p.text}\n</page>" for p in pages)


def prefixed_messages(pages: Sequence[Page], request: InferenceRequest) -> list[ChatMessage]:
    messages = request.chat_messages()
    if not pages:
        return messages
    return [ChatMessage(role="system", content=render_page_prefix(pages)), *messages]


class InferenceEngine(ABC):
    """Generation plus page residency: pages are prefixes held in the engine's KV cache."""

    kind: str = "engine"

    def __init__(self) -> None:
        self._stats = EngineStats(engine=self.kind)
        self._pins: Counter[str] = Counter()
        self._pin_waiters: list[asyncio.Future[None]] = []
        self.pin_wait_seconds = 120.0  # how long a load waits for a pinned slot to be released
        # pages held by whoever hosts page-bound work next to this engine (the replica host's
        # running page-bound agents): never eviction victims while held
        # (holder id -> pages); a holder's own fault may still evict its own pages (see `using_pages`)
        self.page_holds: Callable[[], Mapping[str, Iterable[str]]] | None = None
        # pages queued or suspended agents destined here will need soon, in what is known of their
        # order (set by the replica host; anything `NeededSoon.of` takes): eviction passes them
        # over while another page can go, and gives up the one needed last when it must take one
        # of them; never a pin
        self.pages_needed_soon: Callable[[], Any] | None = None
        self._reserve_lock = asyncio.Lock()  # one multi-page reservation at a time

    # -- pins --------------------------------------------------------------------------------

    def _pin(self, ids: list[str]) -> None:
        self._pins.update(ids)

    def _unpin(self, ids: list[str]) -> None:
        self._pins.subtract(ids)
        for page_id in ids:
            if self._pins[page_id] <= 0:
                del self._pins[page_id]
        self.release_pins()

    @contextlib.asynccontextmanager
    async def pinned(self, page_ids: Iterable[str], *, lifetime: float | None = None) -> AsyncIterator[None]:
        """Hold the pages against eviction for the duration of the block (they need not be resident
        yet: a page pinned before it is loaded is protected from the moment it is). With `lifetime`
        the pin also ends after that many seconds, so a block that is never left (an abandoned
        stream) cannot hold a slot forever."""
        ids = list(dict.fromkeys(page_ids))
        self._pin(ids)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._unpin(ids)

        timer = asyncio.get_running_loop().call_later(lifetime, release) if lifetime is not None else None
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
            release()

    @contextlib.asynccontextmanager
    async def using_pages(
        self,
        page_ids: Iterable[str],
        fetch: Callable[[str], Awaitable[Page]] | None = None,
        *,
        holder: str | None = None,
    ) -> AsyncIterator[list[str]]:
        """Make every page resident and pin them all for the block, or wait holding none of them: a
        request naming several pages never sits on one slot while waiting for another (two such
        requests on a full cache would each wait for the other). Pages not resident are swapped in,
        or loaded from `fetch(page_id)`; yields the ids that had to be brought in. Waits for room at
        most `pin_wait_seconds`, then ResourceExhausted. `holder` (a page-bound agent's id) may
        evict the pages it holds itself (`page_holds`), never anyone else's."""
        ids = list(dict.fromkeys(page_ids))
        token = _HOLDER.set(holder)
        try:
            faulted = await self._reserve(ids, fetch)
        finally:
            _HOLDER.reset(token)
        try:
            yield faulted
        finally:
            self._unpin(ids)

    async def _reserve(self, ids: list[str], fetch: Callable[[str], Awaitable[Page]] | None) -> list[str]:
        if all(p in self.resident_pages() for p in ids):  # nothing to bring in: pin at once
            self._pin(ids)
            return []
        deadline = asyncio.get_running_loop().time() + self.pin_wait_seconds
        while True:
            waiter = self._unpin_waiter()
            try:
                async with self._reserve_lock:
                    missing = [p for p in ids if p not in self.resident_pages()]
                    if self._room_for(ids, len(missing)):
                        self._pin(ids)
                        try:
                            for page_id in missing:
                                await self._fault(page_id, fetch)
                        except BaseException:
                            self._unpin(ids)
                            raise
                        return missing
                    if _PREFETCH.get():  # decided under the lock, with the pages needed soon now
                        raise PageSlotsBusy(
                            f"{self.kind} engine: no room for pages {', '.join(missing)} beside the pages in "
                            "use and those needed soon; the prefetch gives up"
                        )
                await self._await_unpin(waiter, deadline, ", ".join(missing))
            finally:
                self._forget_waiter(waiter)

    def _room_for(self, ids: list[str], missing: int) -> bool:
        """Whether `missing` more pages fit beside the pages others use (free slots plus slots whose
        page nobody uses; the request's own resident pages are kept, not counted as room; for a
        prefetch, pages needed soon count as in use: `pinned_pages`)."""
        capacity = self.page_capacity()
        if capacity is None or missing == 0:
            return True
        resident = self.resident_pages()
        in_use = self.pinned_pages()
        evictable = sum(1 for p in resident if p not in in_use and p not in ids)
        return missing <= capacity - len(resident) + evictable

    async def _fault(self, page_id: str, fetch: Callable[[str], Awaitable[Page]] | None) -> None:
        if page_id in self.swapped_pages():
            await self.swap_in_page(page_id)
        elif fetch is not None:
            await self.load_page(await fetch(page_id))
        else:
            raise PageNotResident(
                f"page {page_id!r} is not loaded in this {self.kind} engine; load_page() it first"
            )

    def release_pins(self) -> None:
        """Wake the loads waiting for a pinned slot (a pin ended, or a page-bound agent left)."""
        waiters, self._pin_waiters = self._pin_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def pinned_pages(self) -> set[str]:
        """Pages in use now (never eviction victims): pinned by a request or a page-bound step, or
        held by a running page-bound agent hosted here, except (inside `using_pages(holder=...)`)
        the pages that holder itself holds: an agent bound to more pages than fit moves on from its
        own page to its next, and two such agents never wait on each other's held pages."""
        pinned = set(self._pins)
        if self.page_holds is not None:
            own = _HOLDER.get()
            for holder, pages in self.page_holds().items():
                if holder != own:
                    pinned.update(pages)
        if _PREFETCH.get():  # a prefetch evicts no page needed soon (see `prefetch`)
            pinned.update(self.needed_soon().pages)
        return pinned

    def needed_soon(self) -> NeededSoon:
        """The pages `pages_needed_soon` names now, in what it knows of their order (`NeededSoon`:
        tiers, soonest first; a set is one tier; empty without one). A preference only: if the
        callable fails, eviction goes on without it (logged) rather than failing the load."""
        if self.pages_needed_soon is None:
            return NeededSoon()
        try:
            return NeededSoon.of(self.pages_needed_soon())
        except Exception:
            log.warning("%s engine: pages_needed_soon failed; evicting without it", self.kind, exc_info=True)
            return NeededSoon()

    async def prefetch(
        self, page_ids: Iterable[str], fetch: Callable[[str], Awaitable[Page]] | None = None
    ) -> list[str]:
        """Bring pages in before the agent that needs them runs (swap-in, or a load of
        `fetch(page_id)`), without keeping them pinned; returns the ids brought in. A prefetch is
        a bet on the future, so it never waits behind pages in use: when they do not fit beside
        them now it brings in nothing (the agent's own step faults them in, as without prefetch); nor
        does it evict a page needed soon: with every evictable page needed soon, one agent's
        prefetch would only push out another's page, paid again at its turn. Both are decided
        under the reservation lock, where the pages needed soon are read again (a prefetch started
        just before, for another agent, may have filled the room this one saw), and hold for
        every load it makes (pages needed soon count as pinned for it: never its victims); where a
        load would wait, it gives up, keeping what it brought in so far."""
        ids = [p for p in dict.fromkeys(page_ids) if p not in self.resident_pages()]
        if not ids:
            return []
        token = _PREFETCH.set(True)
        try:
            if not self._room_for(ids, len(ids)):  # the quick answer; `_reserve` decides under its lock
                return []
            faulted = await self._reserve(ids, fetch)
        except PageSlotsBusy:
            return [p for p in ids if p in self.resident_pages()]
        finally:
            _PREFETCH.reset(token)
        self._unpin(ids)
        return faulted

    def page_capacity(self) -> int | None:
        """How many pages the engine holds at once (None: no fixed number of slots)."""
        return None

    def _unpin_waiter(self) -> asyncio.Future[None]:
        """A future resolved at the next unpin: take it before looking for a free slot, so an unpin
        that happens while looking is not missed; `_forget_waiter` it when done looking."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pin_waiters = [w for w in self._pin_waiters if not w.done()]
        self._pin_waiters.append(waiter)
        return waiter

    def _forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._pin_waiters.remove(waiter)
        waiter.cancel()

    async def _await_unpin(self, waiter: asyncio.Future[None], deadline: float, page_id: str) -> None:
        """Wait for an unpin until `deadline` (loop time); ResourceExhausted once it has passed.
        Returns at least every PIN_POLL_SECONDS so the caller looks again: a held page is released
        when its agent's run ends, which nobody announces."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining > 0 and not _PREFETCH.get():  # a prefetch never waits for room
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), min(remaining, PIN_POLL_SECONDS))
            return
        raise PageSlotsBusy(
            f"{self.kind} engine: every page slot holds a page in use (pinned) and none was released within "
            f"{self.pin_wait_seconds:g}s, so page {page_id!r} cannot be loaded here; retry later or use "
            "another replica (vcm.page_wait_seconds bounds the wait, engine.page_slots the slots)"
        )

    @abstractmethod
    async def generate(self, request: InferenceRequest) -> InferenceResponse: ...

    @abstractmethod
    def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]: ...

    @abstractmethod
    async def load_page(self, page: Page) -> PageLoad: ...

    @abstractmethod
    async def evict_page(self, page_id: str) -> bool: ...

    @abstractmethod
    def resident_pages(self) -> dict[str, int | None]:
        """Pages held now (page id -> slot, where the engine has slots)."""

    def swapped_pages(self) -> list[str]:
        """Pages held in a second (disk) tier; engines without one hold none."""
        return []

    async def swap_in_page(self, page_id: str) -> PageLoad:
        """Bring a swapped-out page back into the cache (engines with a disk tier override this)."""
        raise PageNotResident(f"{self.kind} engine has no swapped-out page {page_id!r}")

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model / open connections (idempotent; `generate` calls it when needed)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model / connections."""

    def stats(self) -> EngineStats:
        return self._stats.model_copy(update={"resident_pages": self.resident_pages()})

    def _record(self, response: InferenceResponse) -> InferenceResponse:
        self._record_usage(response.usage, response.timings.ttft, response.timings.total)
        return response

    def _record_usage(self, usage: Usage, ttft: float, total: float) -> None:
        """Count a finished request: this engine's stats (the replica's heartbeat carries them,
        latency histograms included) and this process's metrics (published for the cluster sums)."""
        ttft, total = max(0.0, ttft), max(0.0, total, ttft)
        stats = self._stats
        stats.requests += 1
        stats.prompt_tokens += usage.prompt_tokens
        stats.cached_tokens += usage.cached_tokens
        stats.completion_tokens += usage.completion_tokens
        stats.ttft_seconds_total += ttft
        stats.request_seconds_total += total
        stats.ttft_histogram[metrics.latency_bucket(ttft)] += 1
        stats.request_histogram[metrics.latency_bucket(total)] += 1
        metrics.INFERENCE_REQUESTS.labels(self.kind, "ok").inc()
        metrics.INFERENCE_TOKENS.labels(self.kind, "prompt").inc(usage.prompt_tokens)
        metrics.INFERENCE_TOKENS.labels(self.kind, "cached").inc(usage.cached_tokens)
        metrics.INFERENCE_TOKENS.labels(self.kind, "completion").inc(usage.completion_tokens)
        metrics.INFERENCE_TTFT_SECONDS.labels(self.kind).observe(ttft)
        metrics.INFERENCE_REQUEST_SECONDS.labels(self.kind).observe(total)

    def _record_page_load(self, load: PageLoad) -> None:
        """Count a page prefilled into the engine: what it cost (EngineStats.page_load_tokens)."""
        self._stats.page_loads += 1
        self._stats.page_load_tokens += max(0, load.prompt_tokens - load.cached_tokens)

    def _page_op(self, op: str) -> None:
        metrics.INFERENCE_PAGE_OPS.labels(self.kind, op).inc()


def create_engine(settings: EngineSettings | ColonySettings) -> InferenceEngine:
    """The engine the settings name (imports heavy packages only for the kind chosen)."""
    colony_settings = settings if isinstance(settings, ColonySettings) else None
    engine = settings.engine if isinstance(settings, ColonySettings) else settings
    if engine.kind == "embedded":
        from colony.inference.embedded import EmbeddedEngine

        data_dir = colony_settings.data_dir if colony_settings else None
        return EmbeddedEngine(engine, data_dir=data_dir, prompt_cache_mib=engine.prompt_cache_mib)
    if engine.kind == "openai":
        from colony.inference.openai_compat import OpenAICompatibleEngine

        return OpenAICompatibleEngine.from_settings(engine)
    if engine.kind == "vllm":
        from colony.inference.vllm_engine import VLLMEngine

        return VLLMEngine(engine)
    from colony.inference.scripted import ScriptedEngine

    return ScriptedEngine(delay=engine.scripted_delay_seconds)


def elapsed(start: float) -> float:
    return time.perf_counter() - start
