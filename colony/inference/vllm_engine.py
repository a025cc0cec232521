"""VLLMEngine: vLLM's async engine inside the replica process (GPU), prefix caching on.

vllm is imported only when the engine starts, so this module (and its request mapping, which
the tests check without vllm) loads anywhere. Structured output uses vLLM's structured-output
parameters (`StructuredOutputsParams`, or `GuidedDecodingParams` on older releases).

Residency: vLLM evicts prefix-cache blocks on its own. Without KV-cache events the engine keeps
a conservative account: pages in use (pinned) are resident, then the newest pages until their
summed tokens exceed the KV-cache capacity vLLM reports; the oldest beyond it are counted as
evicted. A load that would not fit beside the pinned pages waits for an unpin (bounded), so a page
in use is never counted out from under its request.
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from colony.config import EngineSettings
from colony.errors import EngineNotInstalled, EngineUnavailable, PageNotResident
from colony.inference.engine import InferenceEngine, elapsed, prefixed_messages, render_page_prefix
from colony.inference.models import (
    ChatMessage,
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Timings,
    Usage,
)
from colony.inference.openai_format import parse_output
from colony.vcm.page import Page


def sampling_options(request: InferenceRequest) -> dict[str, Any]:
    """Engine-neutral sampling options of a request (what SamplingParams is built from)."""
    options: dict[str, Any] = {"max_tokens": request.max_tokens, "temperature": request.temperature}
    if request.stop:
        options["stop"] = list(request.stop)
    if request.seed is not None:
        options["seed"] = request.seed
    if request.response_format is not None:
        options["json_schema"] = request.response_format
    return options


def build_sampling_params(vllm: Any, options: dict[str, Any]) -> Any:
    """vLLM SamplingParams for the options, using whichever structured-output API this vLLM has."""
    kwargs = {k: v for k, v in options.items() if k != "json_schema"}
    schema = options.get("json_schema")
    if schema is not None:
        sampling_module = importlib.import_module(f"{vllm.__name__}.sampling_params")
        if hasattr(sampling_module, "StructuredOutputsParams"):
            kwargs["structured_outputs"] = sampling_module.StructuredOutputsParams(json=schema)
        else:
            kwargs["guided_decoding"] = sampling_module.GuidedDecodingParams(json=schema)
    return vllm.SamplingParams(**kwargs)


def usage_of(output: Any) -> Usage:
    """Usage of a finished vLLM RequestOutput (cached tokens from `num_cached_tokens`)."""
    completion = output.outputs[0] if output.outputs else None
    return Usage(
        prompt_tokens=len(output.prompt_token_ids or []),
        cached_tokens=int(getattr(output, "num_cached_tokens", 0) or 0),
        completion_tokens=len(completion.token_ids) if completion is not None else 0,
    )


class VLLMEngine(InferenceEngine):
    kind = "vllm"

    def __init__(self, settings: EngineSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or EngineSettings(kind="vllm")
        if not self.settings.model:
            raise EngineUnavailable("engine.kind is 'vllm' but engine.model is unset (a model name or path)")
        self._stats.model = self.settings.model
        self._vllm: Any = None
        self._engine: Any = None
        self._tokenizer: Any = None
        self._pages: OrderedDict[str, tuple[Page, int]] = OrderedDict()  # page -> prefix tokens, load order
        self._capacity_tokens: int | None = None
        self._load_lock = asyncio.Lock()  # a load checks the room beside the pinned pages, then fills it

    async def start(self) -> None:
        if self._engine is not None:
            return
        try:
            vllm = importlib.import_module("vllm")
        except ImportError:
            raise EngineNotInstalled(
                "the vllm engine needs vllm and a GPU: pip install 'colony[gpu]'"
            ) from None
        args = vllm.AsyncEngineArgs(
            model=self.settings.model,
            enable_prefix_caching=True,
            gpu_memory_utilization=self.settings.gpu_memory_utilization,
            max_model_len=self.settings.max_model_len,
        )
        self._vllm = vllm
        self._engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self._tokenizer = await _maybe_await(self._engine.get_tokenizer())
        self._capacity_tokens = await self._kv_capacity()

    async def _kv_capacity(self) -> int | None:
        try:
            config = await _maybe_await(self._engine.get_vllm_config())
            cache = config.cache_config
            return int(cache.num_gpu_blocks) * int(cache.block_size)
        except Exception:
            return None  # unknown: every loaded page counts as resident

    async def close(self) -> None:
        if self._engine is not None and hasattr(self._engine, "shutdown"):
            self._engine.shutdown()
        self._engine = None

    def _prompt(self, messages: list[ChatMessage]) -> str:
        return str(
            self._tokenizer.apply_chat_template(
                [m.model_dump() for m in messages], tokenize=False, add_generation_prompt=True
            )
        )

    def _pages_of(self, request: InferenceRequest) -> list[Page]:
        missing = [p for p in request.page_ids if p not in self.resident_pages()]
        if missing:
            raise PageNotResident(f"pages {missing} are not loaded in this engine; load_page() them first")
        return [self._pages[p][0] for p in request.page_ids]

    async def _run(self, prompt: str, options: dict[str, Any]) -> AsyncIterator[Any]:
        params = build_sampling_params(self._vllm, options)
        async for output in self._engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            yield output

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        await self.start()
        prompt = self._prompt(prefixed_messages(self._pages_of(request), request))
        started = time.perf_counter()
        first: float | None = None
        final = None
        async for output in self._run(prompt, sampling_options(request)):
            if first is None and output.outputs and output.outputs[0].token_ids:
                first = elapsed(started)
            final = output  # consume to the end: the last output is the finished one
        assert final is not None
        text = final.outputs[0].text
        return self._record(
            InferenceResponse(
                text=text,
                parsed=parse_output(text, request.response_format),
                usage=usage_of(final),
                timings=Timings(ttft=first or elapsed(started), total=elapsed(started)),
                finish_reason=final.outputs[0].finish_reason,
                model=self.settings.model,
            )
        )

    async def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        await self.start()
        prompt = self._prompt(prefixed_messages(self._pages_of(request), request))
        sent = 0
        started = time.perf_counter()
        first: float | None = None
        async for output in self._run(prompt, sampling_options(request)):
            text = output.outputs[0].text
            if first is None and output.outputs[0].token_ids:
                first = elapsed(started)
            yield StreamChunk(text=text[sent:], finish_reason=output.outputs[0].finish_reason)
            sent = len(text)
            if output.finished:
                usage = usage_of(output)
                self._record_usage(usage, first or elapsed(started), elapsed(started))
                yield StreamChunk(usage=usage)

    async def load_page(self, page: Page) -> PageLoad:
        """Prefill the page (max_tokens=1, generator consumed to the end) so its blocks are cached.
        Pages in use (pinned) are never counted out to make room: when the page does not fit beside
        them the load waits for an unpin (`pin_wait_seconds`), then fails with ResourceExhausted."""
        await self.start()
        prompt = self._prompt([ChatMessage(role="system", content=render_page_prefix([page]))])
        needed = self._count_tokens(prompt)
        deadline = asyncio.get_running_loop().time() + self.pin_wait_seconds
        while True:
            waiter = self._unpin_waiter()
            try:
                async with self._load_lock:
                    if self._fits_beside_pinned(page.page_id, needed):
                        return await self._prefill(page, prompt)
                await self._await_unpin(waiter, deadline, page.page_id)
            finally:
                self._forget_waiter(waiter)

    def _count_tokens(self, prompt: str) -> int:
        return len(self._tokenizer.encode(prompt))

    def _fits_beside_pinned(self, page_id: str, tokens: int) -> bool:
        if self._capacity_tokens is None:
            return True
        pinned = self.pinned_pages()
        used = sum(t for pid, (_page, t) in self._pages.items() if pid in pinned and pid != page_id)
        return used + tokens <= self._capacity_tokens

    async def _prefill(self, page: Page, prompt: str) -> PageLoad:
        started = time.perf_counter()
        final = None
        async for output in self._run(prompt, {"max_tokens": 1, "temperature": 0.0}):
            final = output
        tokens = len(final.prompt_token_ids) if final is not None else 0
        self._pages.pop(page.page_id, None)
        self._pages[page.page_id] = (page, tokens)
        self._page_op("load")
        evicted = [pid for pid in list(self._pages) if pid not in self.resident_pages()]
        for pid in evicted:
            del self._pages[pid]
        load = PageLoad(page_id=page.page_id, prompt_tokens=tokens, seconds=elapsed(started), evicted=evicted)
        self._record_page_load(load)
        return load

    async def evict_page(self, page_id: str) -> bool:
        """Stop counting the page as resident (vLLM frees its blocks under pressure)."""
        self._page_op("evict")
        return self._pages.pop(page_id, None) is not None

    def resident_pages(self) -> dict[str, int | None]:
        """The pages in use (pinned: never counted out), then the newest pages whose summed prefix
        tokens fit the rest of the KV cache."""
        if self._capacity_tokens is None:
            return dict.fromkeys(self._pages)
        pinned = self.pinned_pages()
        resident: dict[str, int | None] = {pid: None for pid in self._pages if pid in pinned}
        used = sum(self._pages[pid][1] for pid in resident)
        for page_id, (_page, tokens) in reversed(self._pages.items()):
            if page_id in resident:
                continue
            used += tokens
            if used > self._capacity_tokens:
                break
            resident[page_id] = None
        return resident


async def _maybe_await(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value
