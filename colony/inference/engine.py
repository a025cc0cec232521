"""The one interface every inference engine implements, and the factory that picks one."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence

from colony import metrics
from colony.config import ColonySettings, EngineSettings
from colony.errors import PageNotResident
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
