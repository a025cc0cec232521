"""A streamed reply that starts to loop is stopped there (colony.inference.loops): the engine's
stream is closed (generation ends), the text streamed so far is the reply, and every piece of it
was sent as a `token` event. Text that repeats symbols or a short refrain is not a loop."""

from __future__ import annotations

import time
from typing import cast

import pytest
from test_reply_stream import REQUEST, PieceEngine, Sink

from colony import metrics
from colony.agents.base import Agent
from colony.agents.reply_stream import stream_reply
from colony.inference.engine import InferenceEngine
from colony.inference.loops import LOOP_MAX_CHARS, LOOP_REPEATS, LoopWatch, looping

LOOP = "I'm a wonderful person with a loving family. "


def _pieces(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def test_a_looping_reply_is_stopped_and_what_was_streamed_is_the_reply() -> None:
    engine, sink = PieceEngine(_pieces("Well, let me think. " + LOOP * 13)), Sink()
    before = metrics.REPLY_LOOPS_STOPPED._value.get()
    text = await stream_reply(cast(Agent, sink), cast(InferenceEngine, engine), REQUEST)
    assert engine.closed and len(engine.handed) < len(engine.pieces)  # generation ended early
    assert text.count("wonderful person") == LOOP_REPEATS  # stopped on the third time round
    assert "".join(sink.texts).strip() == text  # the reply is exactly what was streamed
    assert metrics.REPLY_LOOPS_STOPPED._value.get() == before + 1


@pytest.mark.parametrize(
    "text",
    [
        "Here is the table:\n" + "|---" * 60 + "|\n",  # symbols, no words
        "ha " * 80,  # one word over and over
        "Step one: mix. Step two: bake. Step three: cool. Step four: serve. Done, enjoy it.",
        "The cat sat on the mat. The dog sat on the mat. The bird sat on the mat too.",
    ],
)
async def test_text_that_only_resembles_a_loop_streams_to_its_end(text: str) -> None:
    engine = PieceEngine(_pieces(text))
    assert await stream_reply(None, cast(InferenceEngine, engine), REQUEST) == text.strip()
    assert len(engine.handed) == len(engine.pieces)


def test_a_loop_is_seen_at_any_point_of_its_third_round_and_the_work_is_bounded() -> None:
    assert not looping(LOOP * 2)
    assert looping(LOOP * 3) and looping(LOOP * 3 + LOOP[:7])  # mid-sentence too
    watch, fed = LoopWatch(), "x" * 100_000
    started = time.perf_counter()
    for piece in _pieces(fed + LOOP * 3, 3):
        if watch.feed(piece):
            break
    else:
        raise AssertionError("the loop after 100k characters was not seen")
    assert time.perf_counter() - started < 5.0  # a bounded tail, whatever came before
    assert len(watch._tail) <= LOOP_MAX_CHARS * LOOP_REPEATS


