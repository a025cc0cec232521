"""No repeated events after a replica death (issue 12 item 5).

A run whose host dies mid-step goes on elsewhere from its last checkpoint and redoes that step. What
its checkpointed steps emitted stands and is not emitted again; what the interrupted step had emitted
is superseded, and one `restarted` event says so. Precisely, for a stream with a `restarted` event R:
events with seq <= R.data.supersedes_after stand; those between it and R are the abandoned attempt's;
after R come only the redone step's own events (attempt R.data.attempt) and what follows it: no second
`started`, no `step` event for a step already reported. `colony run` shows each token once.

Hosts die as in tests/test_agent_recovery.py: a LocalAgentRuntime drops its agents without any
goodbye (state stays in Redis) and a new runtime restores them from Redis.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from agent_kit import speaker_blueprint

from colony.agents import Agent, AgentHandle, AgentMetadata, LocalAgentRuntime
from colony.agents.hooks import HookType, Pointcut
from colony.blackboard import Blackboard, BlackboardScope
from colony.blackboard.protocol import AgentRunProtocol
from colony.config import load_settings
from colony.run_display import RunDisplay, answer_already_shown
from colony.wire.run_events import TERMINAL_EVENTS

TEXT = "alpha bravo charlie delta kilo foxtrot golf hotel india juliet"
WORDS = TEXT.split(" ")
NS = "ns"


def hosts(bb: Blackboard) -> tuple[str, LocalAgentRuntime, LocalAgentRuntime]:
    colony = f"c{uuid.uuid4().hex[:10]}"
    return (
        colony,
        LocalAgentRuntime(bb, colony_id=colony, settings=load_settings()),
        LocalAgentRuntime(bb, colony_id=colony, settings=load_settings()),
    )


def run_board(runtime: LocalAgentRuntime, agent_id: str) -> Blackboard:
    scope = AgentRunProtocol.namespaced_scope(runtime.agent_board(agent_id).scope_id, NS)
    return runtime.blackboard.scoped(scope)


async def stored_events(board: Blackboard, request_id: str) -> list[dict[str, Any]]:
    """The request's stored events, in seq order (as the SSE stream hands them out)."""
    tags = {"all_of": [AgentRunProtocol.request_tag(request_id)]}
    entries = [e async for e in board.iter_query(AgentRunProtocol.event_pattern(request_id), tags=tags)]
    return sorted((e.value for e in entries), key=lambda v: v["seq"])


async def wait_until(board: Blackboard, request_id: str, done: Any, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not done(await stored_events(board, request_id)):  # noqa: ASYNC110 - polls Redis
            await asyncio.sleep(0.02)


async def answered(handle: AgentHandle, request_id: str, timeout: float = 15.0) -> Any:
    """The request's run once answered and its terminal event stored (it follows the result)."""
    async with asyncio.timeout(timeout):
        while (run := await handle.result(request_id, namespace=NS)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    board = handle._board(NS, BlackboardScope.AGENT)
    await wait_until(board, request_id, lambda ev: bool(ev) and ev[-1]["event_type"] in TERMINAL_EVENTS)
    return run


def tokens(events: list[dict[str, Any]], attempt: int | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == "token" and (attempt is None or e["attempt"] == attempt)]


def shown_by_cli(events: list[dict[str, Any]]) -> tuple[str, RunDisplay]:
    display = RunDisplay()
    out = "".join(display.feed(e) for e in events) + display.end()
    return out, display


def assert_each_word_shown_once(out: str) -> None:
    for word in WORDS:
        assert out.count(word) == 1, (word, out)


async def submit(runtime: LocalAgentRuntime, bb: Blackboard) -> tuple[AgentHandle, str]:
    owner = Agent(AgentMetadata(agent_id="parent", colony_id=runtime.colony_id), bb)
    handle = AgentHandle("speaker", owner=owner)
    return handle, await handle.submit(TEXT, namespace=NS)


async def test_a_step_redone_after_its_host_died_is_announced_once_and_not_repeated(bb: Blackboard) -> None:
    _, first, second = hosts(bb)
    try:
        await first.spawn(speaker_blueprint("speaker", delay=0.05, serve_namespace=NS))
        handle, request_id = await submit(first, bb)
        board = run_board(first, "speaker")
        await wait_until(board, request_id, lambda ev: len(tokens(ev)) >= 4)
        await first.shutdown()  # the host dies mid-stream: no goodbye, state stays in Redis
        restored = await second.resume("speaker")
        run = await answered(handle, request_id)
        assert run.output == TEXT
        events = await stored_events(board, request_id)
    finally:
        await first.shutdown()
        await second.shutdown()

    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1))  # strictly increasing, none reused or skipped
    restarts = [e for e in events if e["event_type"] == "restarted"]
    assert len(restarts) == 1
    restart = restarts[0]
    step_one = next(e for e in events if e["event_type"] == "step" and e["data"]["step"] == 1)
    # what stands: the request's start and its checkpointed first step; superseded: the tokens of the
    # step the host died in
    assert restart["data"]["supersedes_after"] == step_one["seq"]
    assert restart["data"]["attempt"] == 2 and restart["data"]["step"] == 2
    before, after = events[: restart["seq"] - 1], events[restart["seq"] :]
    standing = [e for e in before if e["seq"] <= restart["data"]["supersedes_after"]]
    superseded = [e for e in before if e["seq"] > restart["data"]["supersedes_after"]]
    assert [e["event_type"] for e in standing] == ["started", "step"]
    assert superseded and all(
        e["event_type"] == "token" and e["attempt"] == 1 and e["during_step"] == 1 for e in superseded
    )
    assert restart["data"]["superseded"] == len(superseded)
    # after it: only the redone step's own output (the whole text, once) and what follows
    assert [e["event_type"] for e in after] == ["token"] * len(WORDS) + ["step", "completed"]
    assert "".join(e["data"]["text"] for e in tokens(after)) == TEXT
    assert all(e["attempt"] == 2 and e["during_step"] == 1 for e in tokens(after))
    assert [e["data"]["step"] for e in events if e["event_type"] == "step"] == [1, 2]
    assert restored.capabilities["CounterCapability"].total == 1  # the checkpointed step was not redone

    out, display = shown_by_cli(events)
    assert_each_word_shown_once(out)
    assert out.count("run restarted (attempt 2)") == 1
    assert display.shown == TEXT
    assert answer_already_shown(run.output, display.shown, same_terminal=True)  # printed once


async def test_two_host_deaths_make_attempts_two_and_three(bb: Blackboard) -> None:
    _, first, second = hosts(bb)
    third = LocalAgentRuntime(bb, colony_id=first.colony_id, settings=load_settings())
    try:
        await first.spawn(speaker_blueprint("speaker", delay=0.05, serve_namespace=NS))
        handle, request_id = await submit(first, bb)
        board = run_board(first, "speaker")
        await wait_until(board, request_id, lambda ev: len(tokens(ev)) >= 5)
        await first.shutdown()
        await second.resume("speaker")
        await wait_until(board, request_id, lambda ev: len(tokens(ev, attempt=2)) >= 3)
        await second.shutdown()
        await third.resume("speaker")
        run = await answered(handle, request_id)
        events = await stored_events(board, request_id)
    finally:
        for host in (first, second, third):
            await host.shutdown()

    assert run.output == TEXT
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    restarts = [e for e in events if e["event_type"] == "restarted"]
    assert [r["data"]["attempt"] for r in restarts] == [2, 3]
    # the second restart supersedes only the second attempt's tokens (the first's already were)
    assert restarts[1]["data"]["supersedes_after"] == restarts[0]["seq"]
    assert restarts[1]["data"]["superseded"] == len(tokens(events, attempt=2))
    assert [e["event_type"] for e in events].count("started") == 1
    assert "".join(e["data"]["text"] for e in tokens(events, attempt=3)) == TEXT

    out, display = shown_by_cli(events)
    assert_each_word_shown_once(out)
    assert display.shown == TEXT and display.attempt == 3


async def test_a_restart_that_takes_nothing_back_is_not_announced(bb: Blackboard) -> None:
    """The host dies in the first step (nothing streamed yet): the stream reads as an uninterrupted one."""
    _, first, second = hosts(bb)
    try:
        agent = await first.spawn(speaker_blueprint("speaker", delay=0.05, serve_namespace=NS))
        counter = agent.capabilities["CounterCapability"]
        counter.delay = 0.5  # type: ignore[attr-defined]
        handle, request_id = await submit(first, bb)
        board = run_board(first, "speaker")
        await wait_until(board, request_id, lambda ev: [e["event_type"] for e in ev] == ["started"])
        await asyncio.sleep(0.2)  # inside the first step
        await first.shutdown()
        await second.resume("speaker")
        run = await answered(handle, request_id)
        events = await stored_events(board, request_id)
    finally:
        await first.shutdown()
        await second.shutdown()
    assert run.output == TEXT
    kinds = [e["event_type"] for e in events]
    assert kinds == ["started", "step", *["token"] * len(WORDS), "step", "completed"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["attempt"] for e in events} == {1}


async def claimed_and_started(board: Blackboard) -> tuple[str, str]:
    """What a host that died right after emitting `started` leaves: the request, its claim (the
    bare agent id, as claims were written before copies were told apart), the `started` event."""
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    tag = AgentRunProtocol.request_tag(request_id)
    await board.write(AgentRunProtocol.request_key(request_id), {"input": TEXT}, tags={tag})
    await board.write(
        AgentRunProtocol.claim_key(request_id), "speaker", tags={tag, AgentRunProtocol.open_claims_tag()}
    )
    started = {"request_id": request_id, "event_type": "started", "data": {"input": TEXT}, "seq": 1}
    await board.write(AgentRunProtocol.event_key(request_id, "00001.started"), started, tags={tag})
    return request_id, tag


async def test_a_request_re_served_before_its_run_began_has_one_started_event(bb: Blackboard) -> None:
    """The host claimed the request and emitted `started`, then died before the run began."""
    _, first, second = hosts(bb)
    try:
        await first.spawn(speaker_blueprint("speaker", delay=0.0, serve_namespace=NS))
        await first.shutdown()
        board = run_board(first, "speaker")
        request_id, _tag = await claimed_and_started(board)
        await second.resume("speaker")
        handle = AgentHandle(
            "speaker", owner=Agent(AgentMetadata(agent_id="p", colony_id=first.colony_id), bb)
        )
        run = await answered(handle, request_id)
        events = await stored_events(board, request_id)
    finally:
        await second.shutdown()
    assert run.output == TEXT
    assert [e["event_type"] for e in events] == [
        "started",
        "step",
        *["token"] * len(WORDS),
        "step",
        "completed",
    ]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


async def test_a_run_that_ended_before_its_answer_is_answered_not_run_again(bb: Blackboard) -> None:
    """The run ended and was stored; the host died before the answer was: it is answered from the run."""
    _, first, second = hosts(bb)
    try:
        agent = await first.spawn(speaker_blueprint("speaker", delay=0.0, serve_namespace=NS))
        stuck = asyncio.Event()

        async def die_before_the_answer(ctx: Any, result: Any) -> None:
            if agent.current_run is not None and agent.current_run.done:
                stuck.set()
                await asyncio.Event().wait()  # until the host dies

        agent.hooks.register(
            Pointcut.for_instance(agent, "run_step"), HookType.AFTER, die_before_the_answer, priority=10
        )
        handle, request_id = await submit(first, bb)
        board = run_board(first, "speaker")
        await asyncio.wait_for(stuck.wait(), 10)
        run_id = agent.current_run.run_id if agent.current_run else None
        await agent.close()  # nothing of the host runs on: its request loop goes first, ...
        await first.shutdown()  # ... then its driver
        restored = await second.resume("speaker")
        run = await answered(handle, request_id)
        events = await stored_events(board, request_id)
    finally:
        await first.shutdown()
        await second.shutdown()
    assert run.output == TEXT and run.run_id == run_id  # the run that ended, not a second one
    kinds = [e["event_type"] for e in events]
    assert kinds.count("started") == 1 and kinds.count("token") == len(WORDS)
    assert kinds[-1] == "completed" and kinds.count("completed") == 1
    assert restored.capabilities["CounterCapability"].total == 1


async def test_a_run_answered_before_its_terminal_event_gets_it_after_a_restart(bb: Blackboard) -> None:
    """The host stored the result, then died before the terminal event that follows it."""
    _, first, second = hosts(bb)
    try:
        await first.spawn(speaker_blueprint("speaker", delay=0.0, serve_namespace=NS))
        await first.shutdown()
        board = run_board(first, "speaker")
        request_id, tag = await claimed_and_started(board)
        result = {"status": "succeeded", "output": TEXT, "error": None, "run_id": "r1", "steps": 2}
        await board.write(AgentRunProtocol.result_key(request_id), result, tags={tag}, created_by="speaker")
        await second.resume("speaker")
        handle = AgentHandle(
            "speaker", owner=Agent(AgentMetadata(agent_id="p", colony_id=first.colony_id), bb)
        )
        await answered(handle, request_id)
        events = await stored_events(board, request_id)
    finally:
        await second.shutdown()
    assert [(e["seq"], e["event_type"]) for e in events] == [(1, "started"), (2, "completed")]
    assert events[-1]["data"]["output"] == TEXT


# -- colony run: what it shows of a stream with restarts ------------------------------------------


def _event(seq: int, kind: str, data: Any = None, attempt: int = 1) -> dict[str, Any]:
    return {"seq": seq, "event_type": kind, "data": data, "attempt": attempt, "id": f"1-{seq}"}


def _tokens(first_seq: int, pieces: list[str], attempt: int = 1) -> list[dict[str, Any]]:
    return [_event(first_seq + i, "token", {"text": p}, attempt) for i, p in enumerate(pieces)]


def _restart(seq: int, after: int, attempt: int = 2) -> dict[str, Any]:
    data = {"attempt": attempt, "supersedes_after": after, "superseded": seq - after - 1, "reason": "died"}
    return _event(seq, "restarted", data, attempt)


def test_cli_shows_only_what_a_redo_adds_beyond_the_text_shown() -> None:
    events = [
        _event(1, "started"),
        *_tokens(2, ["The", " capital"]),
        _restart(4, after=1),
        *_tokens(5, ["The", " capital", " is", " Paris."], attempt=2),
        _event(9, "step", {"step": 1, "action": {"success": True}}, 2),
        _event(10, "completed", {"output": "The capital is Paris."}, 2),
    ]
    display = RunDisplay()
    parts = [display.feed(e) for e in events]
    assert parts[1:3] == ["The", " capital"]
    assert parts[3].startswith("\n  run restarted (attempt 2): died;")
    assert parts[4:8] == ["", "", " is", " Paris."]  # the re-traced prefix is not shown again
    assert display.end() == ""
    assert display.shown == "The capital is Paris."
    assert answer_already_shown("The capital is Paris.", display.shown, same_terminal=True)


def test_cli_shows_a_redo_that_departs_from_the_text_shown_as_a_fresh_block() -> None:
    events = [
        *_tokens(2, ["The", " cat"]),
        _restart(4, after=1),
        *_tokens(5, ["The", " dog", " barks"], attempt=2),
    ]
    display = RunDisplay()
    out = "".join(display.feed(e) for e in events) + display.end()
    assert out.endswith(
        "the new attempt's text differs from the text above; here it is from its start:\nThe dog barks\n"
    )
    assert out.count("cat") == 1 and out.count("dog") == 1 and out.count("barks") == 1
    assert display.shown == "The dog barks"


def test_cli_says_when_a_redo_ends_inside_the_text_shown() -> None:
    events = [*_tokens(2, ["Paris", " is", " big"]), _restart(5, after=1), *_tokens(6, ["Paris"], 2)]
    display = RunDisplay()
    out = "".join(display.feed(e) for e in events) + display.end()
    assert out.count("Paris") == 1
    assert "partly an abandoned attempt's" in out
    assert not answer_already_shown("Paris", display.shown, same_terminal=True)  # so it is printed


def test_cli_keeps_text_of_checkpointed_steps_across_a_restart() -> None:
    """Tokens up to `supersedes_after` stand; a second restart takes back only the second attempt's."""
    events = [
        *_tokens(1, ["One."]),
        _event(2, "step", {"step": 1, "action": {"success": True}}),
        *_tokens(3, [" Two", " three"]),
        _restart(5, after=2),
        *_tokens(6, [" Two"], attempt=2),
        _restart(7, after=5, attempt=3),
        *_tokens(8, [" Two", " three", " four"], attempt=3),
    ]
    display = RunDisplay()
    out = "".join(display.feed(e) for e in events) + display.end()
    for word in ("One.", "Two", "three", "four"):
        assert out.count(word) == 1, (word, out)
    assert display.text == display.shown == "One. Two three four"
    assert display.attempt == 3


def test_cli_shows_streamed_text_without_control_characters() -> None:
    """Found by review: token text reached the terminal byte for byte (escape sequences, `\\r`), where
    every other text from the server is shown without control characters."""
    hostile = "\x1b[2K\r  utils.py:197  def parsedate(data):\n\x1b]0;pwned\x07 done\u202e"
    display = RunDisplay()
    out = "".join(display.feed(e) for e in _tokens(1, ["Fine.", hostile])) + display.end()
    assert out == "Fine.[2K  utils.py:197  def parsedate(data):\n]0;pwned done\n"
    assert not any(c in out for c in "\x1b\r\x07\u202e")
