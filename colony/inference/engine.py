"""The one interface every inference engine implements, and the factory that picks one.

Pins: a page in use (by an in-flight request, or held by whoever runs a page-bound step) is pinned,
and an engine that evicts on its own never chooses a pinned page: evicting it would pull the KV
cache from under the request that just loaded it. A load that finds every slot pinned waits for an
unpin, at most `pin_wait_seconds`, then fails with ResourceExhausted (the caller places the work
elsewhere or retries later).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence

from colony import metrics
from colony.config import ColonySettings, EngineSettings
from colony.errors import PageNotResident, ResourceExhausted
from colony.inference.models import (
    ChatMessage,
    EngineStats,
    InferenceRequest,
    InferenceResponse,
    Page,
    PageLoad,
    StreamChunk,
    Usage,
)


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

    # -- pins --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def pinned(self, page_ids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the pages against eviction for the duration of the block (they need not be resident
        yet: a page pinned before it is loaded is protected from the moment it is)."""
        ids = list(dict.fromkeys(page_ids))
        self._pins.update(ids)
        try:
            yield
        finally:
            self._pins.subtract(ids)
            for page_id in ids:
                if self._pins[page_id] <= 0:
                    del self._pins[page_id]
            waiters, self._pin_waiters = self._pin_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def pinned_pages(self) -> set[str]:
        """Pages in use now (never eviction victims)."""
        return set(self._pins)

    def page_capacity(self) -> int | None:
        """How many pages the engine holds at once (None: no fixed number of slots)."""
        return None

    def _unpin_waiter(self) -> asyncio.Future[None]:
        """A future resolved at the next unpin: take it before looking for a free slot, so an unpin
        that happens while looking is not missed."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pin_waiters.append(waiter)
        return waiter

    async def _await_unpin(self, waiter: asyncio.Future[None], deadline: float, page_id: str) -> None:
        """Wait for an unpin until `deadline` (loop time); ResourceExhausted once it has passed."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)
                return
        raise ResourceExhausted(
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
        self._record_usage(response.usage, response.timings.ttft)
        return response

    def _record_usage(self, usage: Usage, ttft: float) -> None:
        self._stats.requests += 1
        self._stats.prompt_tokens += usage.prompt_tokens
        self._stats.cached_tokens += usage.cached_tokens
        self._stats.completion_tokens += usage.completion_tokens
        self._stats.ttft_seconds_total += ttft
        metrics.INFERENCE_REQUESTS.labels(self.kind, "ok").inc()
        metrics.INFERENCE_TOKENS.labels(self.kind, "prompt").inc(usage.prompt_tokens)
        metrics.INFERENCE_TOKENS.labels(self.kind, "cached").inc(usage.cached_tokens)
        metrics.INFERENCE_TOKENS.labels(self.kind, "completion").inc(usage.completion_tokens)
        metrics.INFERENCE_TTFT_SECONDS.labels(self.kind).observe(ttft)

    def _page_op(self, op: str) -> None:
        metrics.INFERENCE_PAGE_OPS.labels(self.kind, op).inc()


def create_engine(settings: EngineSettings | ColonySettings) -> InferenceEngine:
    """The engine the settings name (imports heavy packages only for the kind chosen)."""
    colony_settings = settings if isinstance(settings, ColonySettings) else None
    engine = settings.engine if isinstance(settings, ColonySettings) else settings
    if engine.kind == "embedded":
        from colony.inference.embedded import EmbeddedEngine

        data_dir = colony_settings.data_dir if colony_settings else None
        return EmbeddedEngine(engine, data_dir=data_dir)
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
