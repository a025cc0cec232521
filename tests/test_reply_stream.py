"""stream_reply's token events: coalesced while a write is in flight, never delayed, in order, the
text unchanged; a failed write fails the reply and closes the engine stream; a cancel stops both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from colony.agents import reply_stream
from colony.agents.base import Agent
from colony.agents.reply_stream import MAX_TOKEN_EVENT_CHARS, TokenCoalescer, stream_reply
from colony.errors import BlackboardUnavailable
from colony.inference import InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.inference.models import ChatMessage, StreamChunk

REQUEST = InferenceRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=64)


class PieceEngine:
    """Streams `pieces`, `gap` seconds apart; notes when each was handed out and whether the
    stream was closed, and can fail after `fail_after` pieces."""

    def __init__(self, pieces: list[str], gap: float = 0.0, fail_after: int | None = None) -> None:
        self.pieces, self.gap, self.fail_after = pieces, gap, fail_after
        self.handed: list[float] = []
        self.closed = False

    async def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        try:
            for i, piece in enumerate(self.pieces):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("the engine broke")
                await asyncio.sleep(self.gap)
                self.handed.append(time.monotonic())
                yield StreamChunk(text=piece)
            yield StreamChunk(finish_reason="stop")
        finally:
            self.closed = True


class Sink:
    """Stands in for the agent's run events: each `token` write takes `delay` seconds; records
    what was written and when each write began; can fail its `fail_on`-th write (1-based)."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        self.delay, self.fail_on = delay, fail_on
        self.texts: list[str] = []
        self.began: list[float] = []
        self.in_flight = 0
        self.cancelled = 0

    async def emit_run_event(self, event_type: str, data: Any = None) -> bool:
        assert event_type == "token"
        self.began.append(time.monotonic())
        self.in_flight += 1
        try:
            if len(self.began) == self.fail_on:
                raise BlackboardUnavailable("write", "redis://nowhere")
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        self.texts.append(data["text"])
        return True


@pytest.fixture(autouse=True)
def coalescing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply_stream, "COALESCE_TOKEN_EVENTS", True)


def words(n: int) -> list[str]:
    return [f" w{i}" for i in range(n)]


async def reply(sink: Sink, engine: PieceEngine) -> str:
    return await stream_reply(cast(Agent, sink), cast(InferenceEngine, engine), REQUEST)


async def test_a_slow_sink_gets_far_fewer_events_with_the_same_text_and_the_first_at_once() -> None:
    pieces = words(60)
    sink, engine = Sink(delay=0.03), PieceEngine(pieces, gap=0.002)
    text = await reply(sink, engine)
    assert text == "".join(pieces).strip()
    assert "".join(sink.texts) == "".join(pieces)  # in order, nothing lost or repeated
    assert len(sink.texts) <= len(pieces) // 4, len(sink.texts)  # one per piece before
    assert sink.texts[0] == pieces[0]  # the first piece alone, not held for company
    assert sink.began[0] - engine.handed[0] < 0.02  # and written as soon as it came
    assert sink.in_flight == 0 and engine.closed  # every event stored before the reply returns


async def test_a_fast_sink_still_gets_one_event_per_piece() -> None:
    pieces = words(12)
    sink, engine = Sink(delay=0.0), PieceEngine(pieces, gap=0.005)
    await reply(sink, engine)
    assert sink.texts == pieces


async def test_events_are_bounded_in_size() -> None:
    pieces = [f"{i:04d}" for i in range(200)]  # 800 characters, generated faster than written
    sink = Sink(delay=0.02)
    tokens = TokenCoalescer(lambda text: sink.emit_run_event("token", {"text": text}), max_chars=40)
    for piece in pieces:
        await tokens.add(piece)
    await tokens.flush()
    assert "".join(sink.texts) == "".join(pieces)
    assert all(len(text) <= 40 for text in sink.texts) and len(sink.texts) >= 800 // 40
    assert MAX_TOKEN_EVENT_CHARS >= 256  # a slow Redis still sends sizeable events, not token by token


async def test_a_failed_write_fails_the_reply_and_closes_the_engine_stream() -> None:
    pieces = words(200)
    sink, engine = Sink(delay=0.01, fail_on=2), PieceEngine(pieces, gap=0.002)
    with pytest.raises(BlackboardUnavailable):
        await reply(sink, engine)
    assert engine.closed and len(engine.handed) < len(pieces)  # stopped early, not read to the end
    assert sink.texts == [pieces[0]] and sink.in_flight == 0


async def test_an_engine_failure_lets_the_write_in_flight_finish_and_sends_nothing_more() -> None:
    pieces = words(20)
    sink, engine = Sink(delay=0.05), PieceEngine(pieces, gap=0.001, fail_after=10)
    with pytest.raises(RuntimeError, match="the engine broke"):
        await reply(sink, engine)
    assert engine.closed and sink.cancelled == 0 and sink.in_flight == 0
    assert sink.texts == [pieces[0]]  # the first write completed; what waited behind it is dropped


async def test_a_cancelled_reply_cancels_its_write_and_closes_the_engine_stream() -> None:
    sink, engine = Sink(delay=10.0), PieceEngine(words(50), gap=0.002)
    task = asyncio.create_task(reply(sink, engine))
    await asyncio.sleep(0.05)  # the first write began at once and sleeps; pieces gather behind it
    assert len(sink.began) == 1 and sink.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.closed and sink.cancelled == 1 and sink.in_flight == 0 and sink.texts == []


async def test_no_agent_streams_nothing_and_returns_the_text() -> None:
    engine = PieceEngine([" a", " b"])
    assert await stream_reply(None, cast(InferenceEngine, engine), REQUEST) == "a b"


async def test_a_failed_last_write_fails_the_reply_too() -> None:
    pieces = words(3)
    sink, engine = Sink(delay=0.0, fail_on=2), PieceEngine(pieces, gap=0.0)
    with pytest.raises(BlackboardUnavailable):  # the last write fails: found by the final flush
        await reply(sink, engine)
    assert engine.closed and sink.in_flight == 0


async def test_a_failed_write_surfaces_at_the_next_piece() -> None:
    sink, engine = Sink(delay=0.0, fail_on=1), PieceEngine(words(5), gap=0.01, fail_after=3)
    with pytest.raises(BlackboardUnavailable):  # not the engine's later failure: the run fails on its write
        await reply(sink, engine)
    assert len(engine.handed) == 2 and engine.closed  # the second piece found the failure


async def test_with_coalescing_off_every_piece_is_its_own_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply_stream, "COALESCE_TOKEN_EVENTS", False)
    pieces = words(10)
    sink, engine = Sink(delay=0.01), PieceEngine(pieces)
    assert await reply(sink, engine) == "".join(pieces).strip()
    assert sink.texts == pieces and engine.closed
