"""A model's reply streamed to the run's requester: the one place `ask`, `assistant` and the
session agent turn an engine stream into `token` run events (docs/api.md, run events).

Each `token` event is a create-only write to Redis, which the API replica then relays through
Serve: one per text piece costs the API replica, Serve's proxy and Redis about as much CPU again
as the engine replica spends writing it. With COALESCE_TOKEN_EVENTS, pieces are coalesced
without waiting for anything: the first goes at once; while a write is in
flight, the pieces that come meanwhile gather and go as one event when it completes (at most
MAX_TOKEN_EVENT_CHARS each, in order). A fast sink therefore still sees one event per piece, a
busy one fewer, larger events; the text streamed is the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from colony import metrics
from colony.agents.base import Agent
from colony.inference import InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.inference.loops import LoopWatch

log = logging.getLogger(__name__)

# Off until the end-to-end first-token delay it showed is understood: with it on, `benchmarks/
# token_path.py`'s runs saw the first token reach the client ~40 ms later (one at a time, 2
# cores), though the first write itself is not delayed (tests/test_reply_stream.py); on, it cut
# the CPU the API relay, Serve's proxy and Redis spend per token by a third to a half. Issue 35.
COALESCE_TOKEN_EVENTS = False
# The most text one `token` event carries (a single longer piece goes whole): keeps an event (and
# so one SSE message) small when Redis falls behind the engine.
MAX_TOKEN_EVENT_CHARS = 1024


class TokenCoalescer:
    """Sends text pieces through `emit`, one write at a time: a piece added while none is in flight
    is sent at once; pieces added while one is gather and go together when it completes. A failed
    write is raised by the next `add` or by `flush`."""

    def __init__(self, emit: Callable[[str], Awaitable[Any]], max_chars: int = MAX_TOKEN_EVENT_CHARS) -> None:
        self._emit = emit
        self._max_chars = max_chars
        self._pending: list[str] = []
        self._pending_chars = 0
        self._writer: asyncio.Task[None] | None = None

    async def add(self, text: str) -> None:
        """Queue `text` to be sent; waits only when a full event is already waiting behind the
        write in flight (so the text held is bounded, as when every piece awaited its write)."""
        if self._writer is not None and self._writer.done():
            self._writer, done = None, self._writer
            done.result()  # a failed write fails the reply here
        if self._writer is not None and self._pending_chars >= self._max_chars:
            await self.flush()
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._writer is None:
            self._writer = asyncio.create_task(self._drain(), name="token-events")

    async def flush(self) -> None:
        """Wait until every piece added is sent (or raise the write that failed)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer

    async def close(self, *, cancel: bool) -> None:
        """Send nothing more (the reply failed or was cancelled). A write in flight is let finish
        (an engine error: the request's event numbering stays sure of what Redis holds) or, with
        `cancel` (the run itself is being cancelled), cancelled as any awaited write would be."""
        writer, self._writer = self._writer, None
        self._pending.clear()
        self._pending_chars = 0
        if writer is None:
            return
        if cancel:
            writer.cancel()
        try:
            await asyncio.wait({writer})  # never raises the write's own failure: the reply's is raised
        except BaseException:  # this task cancelled meanwhile: the write goes with it
            writer.cancel()
            raise
        finally:
            if writer.done() and not writer.cancelled():
                writer.exception()  # retrieved (asyncio would log it as never retrieved)

    async def _drain(self) -> None:
        while self._pending:
            taken, size = 0, 0
            while taken < len(self._pending) and (
                taken == 0 or size + len(self._pending[taken]) <= self._max_chars
            ):
                size += len(self._pending[taken])
                taken += 1
            text = "".join(self._pending[:taken])
            del self._pending[:taken]
            self._pending_chars -= size
            await self._emit(text)


USAGE_EVENT = "usage"


async def emit_usage(agent: Agent | None, usage: Any) -> None:
    """The engine's token counts of one model call, as the run's `usage` event (`{"prompt_tokens",
    "completion_tokens"}`): a run's events then add up to what its model calls cost (the OpenAI
    door's `usage` for an agent that reports none itself)."""
    if agent is None or usage is None:
        return
    prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    if isinstance(prompt, int) and isinstance(completion, int):
        await agent.emit_run_event(USAGE_EVENT, {"prompt_tokens": prompt, "completion_tokens": completion})


async def stream_reply(
    agent: Agent | None,
    engine: InferenceEngine,
    request: InferenceRequest,
    report: dict[str, Any] | None = None,
) -> str:
    """Generate `request` on `engine`, its text streamed to the run's requester as `token` events
    (coalesced while a write is in flight, see the module); the whole text, stripped. Every event
    is stored before this returns, so they precede the run's answer. A reply that starts to loop
    (colony.inference.loops) is stopped there: the text streamed so far is the reply. `report`
    gets the engine's `usage` and `finish_reason` from the last piece (`length`: cut at
    max_tokens; `loop`: stopped repeating itself); the usage is also the run's `usage` event."""
    parts: list[str] = []
    loops = LoopWatch()
    report = {} if report is None else report

    async def emit(text: str) -> None:
        assert agent is not None
        await agent.emit_run_event("token", {"text": text})

    tokens = TokenCoalescer(emit) if agent is not None and COALESCE_TOKEN_EVENTS else None
    try:
        # aclosing: a run failing mid-stream (e.g. its event cannot be stored) ends the stream, and
        # with it the engine's hold on its slot, at once rather than when it is collected
        async with contextlib.aclosing(engine.stream(request)) as chunks:
            async for chunk in chunks:
                if chunk.finish_reason is not None:
                    report["finish_reason"] = chunk.finish_reason
                if chunk.usage is not None:
                    report["usage"] = chunk.usage
                if chunk.text:
                    parts.append(chunk.text)
                    if tokens is not None:
                        await tokens.add(chunk.text)
                    elif agent is not None:
                        await emit(chunk.text)
                    if loops.feed(chunk.text):  # closing the stream ends the generation
                        metrics.REPLY_LOOPS_STOPPED.inc()
                        report["finish_reason"] = "loop"
                        log.info("a reply was stopped after %d pieces: it repeats itself", len(parts))
                        break
        if tokens is not None:
            await tokens.flush()
        if "usage" in report:
            await emit_usage(agent, report["usage"])
    except BaseException as exc:
        if tokens is not None:
            await tokens.close(cancel=not isinstance(exc, Exception))
        raise
    return "".join(parts).strip()
