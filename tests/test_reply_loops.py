"""A streamed reply that starts to loop is stopped there (colony.inference.loops): the engine's
stream is closed (generation ends), the text streamed so far is the reply, and every piece of it
was sent as a `token` event. Legitimate repetition (code, tables, CSV rows, JSON arrays, refrains,
a line the user asked for a few times) streams to its end."""

from __future__ import annotations

import json
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
    assert text.count("wonderful person") == LOOP_REPEATS  # stopped on the fifth time round
    assert "".join(sink.texts).strip() == text  # the reply is exactly what was streamed
    assert metrics.REPLY_LOOPS_STOPPED._value.get() == before + 1


LEGITIMATE = [
    "Here is the table:\n" + "|---" * 60 + "|\n",  # symbols, no words
    "ha " * 80,  # one word over and over
    "Step one: mix. Step two: bake. Step three: cool. Step four: serve. Done, enjoy it.",
    "```python\n" + "model.add(Dense(64, activation='relu'))\n" * 8 + "model.add(Dense(1))\n```\nThat is it.",
    "name,city,age\n" + "Ana,Oslo,34\n" * 8 + "Bo,Rome,40\n",
    json.dumps([{"id": 1, "ok": True}] * 8) + " is the list.",
    "We wish you a merry Christmas, " * 6 + "and a happy New Year.",
    "- TODO: write the docs\n" * 6 + "- ship it\n",
    "You asked for it four times. " + "Colony keeps agents where their pages are. " * 4 + "Done.",
]


@pytest.mark.parametrize("text", LEGITIMATE)
@pytest.mark.parametrize("size", [1, 4])
async def test_legitimate_repetition_streams_to_its_end(text: str, size: int) -> None:
    engine = PieceEngine(_pieces(text, size))
    assert await stream_reply(None, cast(InferenceEngine, engine), REQUEST) == text.strip()
    assert len(engine.handed) == len(engine.pieces)


@pytest.mark.parametrize(
    "text",
    [
        LOOP * 13,
        "我是一个很好的人\uff0c我有一个很爱我的家庭\u3002" * 13,  # no spaces between words
        ("This answer goes round and round, " * 9 + "and never ends. ") * 8,  # a long period
    ],
)
def test_loops_are_seen_in_any_script_and_at_any_point_of_a_round(text: str) -> None:
    watch = LoopWatch()
    assert any(watch.feed(piece) for piece in _pieces(text, 3))
    assert not looping(LOOP * (LOOP_REPEATS - 1)) and looping(LOOP * LOOP_REPEATS + LOOP[:7])


def test_a_fence_split_across_pieces_is_followed_and_the_work_is_bounded() -> None:
    watch = LoopWatch()
    for piece in ["``", "`py\n", "x = 1\n" * 3, "`", "``\n"]:  # a fence opened and closed, split
        watch.feed(piece)
    assert any(watch.feed(piece) for piece in _pieces(LOOP * LOOP_REPEATS, 4))  # outside: seen
    watch, fed = LoopWatch(), "x" * 100_000
    started = time.perf_counter()
    assert not any(watch.feed(piece) for piece in _pieces(fed, 3))
    assert any(watch.feed(piece) for piece in _pieces(LOOP * LOOP_REPEATS, 3))
    assert time.perf_counter() - started < 5.0  # a bounded tail, whatever came before
    assert len(watch._tail) <= LOOP_MAX_CHARS * LOOP_REPEATS
