"""AgentHandle over Redis (owned and detached), capability modes, publish, event handlers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agent_kit import CounterCapability, Finding, NoteWatcher, counter_blueprint

from colony.agents import (
    Agent,
    AgentHandle,
    AgentMetadata,
    CapabilityMode,
    LocalAgentRuntime,
    RunStatus,
)
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.config import load_settings
from colony.errors import AgentUsageError, RunTimeout

STEPS = [
    {"action": "add", "parameters": {"amount": "$input"}},
    {"action": "add", "parameters": {"amount": 1}},
]


async def test_parent_gets_child_output_over_redis(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(counter_blueprint("child-1", STEPS, serve_namespace="compliance"))
    parent = await runtime.spawn(counter_blueprint("parent-1", []))
    handle = AgentHandle("child-1", owner=parent)
    run = await handle.run(41, namespace="compliance", timeout=10)
    assert run.status is RunStatus.SUCCEEDED and run.output_data == 42 and run.agent_id == "child-1"
    again = await handle.run(0, namespace="compliance", timeout=10)
    assert again.output == 43 and again.run_id != run.run_id
    request_keys = [
        e.key
        async for e in parent.blackboard.scoped(
            AgentRunProtocol.namespaced_scope(runtime.get("child-1").scope_id, "compliance")
        ).iter_query("request:run:*")
    ]
    assert len(request_keys) == 2


async def test_detached_handle_from_plain_code(runtime: LocalAgentRuntime, bb: Blackboard) -> None:
    await runtime.spawn(counter_blueprint("child-2", STEPS, serve_namespace="jobs"))
    child_scope = runtime.get("child-2").metadata
    handle = AgentHandle("child-2", blackboard=bb)
    handle_board = handle._board("jobs", BlackboardScope.AGENT)
    assert handle_board.scope_id.endswith(":agent:child-2:namespace:jobs")
    # the detached handle addresses the default colony; point it at the runtime's colony
    handle.owner = None
    parent = Agent(AgentMetadata(agent_id="outside", colony_id=child_scope.colony_id), bb)
    owned = AgentHandle("child-2", owner=parent)
    assert (await owned.run(1, namespace="jobs", timeout=10)).output == 2


async def test_a_handle_without_owner_or_blackboard_says_what_it_needs(
    runtime: LocalAgentRuntime, redis_url: str
) -> None:
    """Settings are injected, not looked up (docs/architecture.md): a handle with neither an owner
    nor a blackboard no longer connects through the environment's settings; it says what to give
    it, and one given a blackboard built from explicit settings reaches the child."""
    default_runtime = LocalAgentRuntime(runtime.blackboard, settings=load_settings())
    try:
        await default_runtime.spawn(
            counter_blueprint(f"child-env-{time.time_ns()}", STEPS, serve_namespace="env")
        )
        agent_id = default_runtime.agent_ids[0]
        with pytest.raises(AgentUsageError, match=r"owner= .* or blackboard="):
            await AgentHandle(agent_id).run(10, namespace="env", timeout=10)
        board = Blackboard.connect("detached", load_settings(redis_url=redis_url))
        run = await AgentHandle(agent_id, blackboard=board).run(10, namespace="env", timeout=10)
        assert run.output == 11
        await board.redis.aclose()
    finally:
        await default_runtime.shutdown()


async def test_silent_child_times_out_on_time(bb: Blackboard) -> None:
    handle = AgentHandle("nobody-home", blackboard=bb)
    started = time.monotonic()
    with pytest.raises(RunTimeout, match="nobody-home") as info:
        await handle.run({"q": 1}, namespace="compliance", timeout=1)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - started < 1.5


async def test_namespace_is_required(bb: Blackboard) -> None:
    with pytest.raises(ValueError, match="namespace is required"):
        await AgentHandle("x", blackboard=bb).run(1, namespace="", timeout=1)


async def test_run_streamed_yields_events_in_order(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(counter_blueprint("child-3", STEPS, serve_namespace="stream"))
    parent = await runtime.spawn(counter_blueprint("parent-3", []))
    events = [
        e async for e in AgentHandle("child-3", owner=parent).run_streamed(5, namespace="stream", timeout=10)
    ]
    assert [e.event_type for e in events] == ["started", "step", "step", "completed"]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[-1].data["output"] == 6
    assert events[1].data["action"]["output"] == 5


async def test_failing_child_run_reports_failure(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(counter_blueprint("child-4", [{"action": "explode"}], serve_namespace="ns"))
    parent = await runtime.spawn(counter_blueprint("parent-4", []))
    handle = AgentHandle("child-4", owner=parent)
    run = await handle.run(None, namespace="ns", timeout=10)
    assert run.status is RunStatus.FAILED and "kaboom" in run.error
    events = [e.event_type async for e in handle.run_streamed(None, namespace="ns", timeout=10)]
    assert events[-1] == "failed"


async def test_capability_modes(bb: Blackboard) -> None:
    agent = Agent(AgentMetadata(agent_id="moder"), bb)
    local = CounterCapability(agent)
    remote = CounterCapability(agent, "child-x")
    shared = NoteWatcher(agent, "game-7", scope=BlackboardScope.COLONY)
    detached = NoteWatcher(None, "moder", blackboard=bb)
    assert local.mode is CapabilityMode.LOCAL and local.scope_id == agent.scope_id
    assert remote.mode is CapabilityMode.REMOTE and remote.scope_id.endswith(":agent:child-x")
    assert shared.mode is CapabilityMode.SHARED
    assert shared.scope_id == scope_id(BlackboardScope.COLONY, namespace="game-7")
    assert detached.mode is CapabilityMode.DETACHED and detached.scope_id == agent.scope_id


async def test_publish_and_result_future(bb: Blackboard) -> None:
    agent = Agent(AgentMetadata(agent_id="pub"), bb)
    cap = CounterCapability(agent)
    entry = await cap.publish(Finding(finding_id="f1", text="leak"), tags={"analysis"})
    assert entry.key == "finding:f1" and entry.created_by == "pub" and entry.tags == {"analysis"}
    with pytest.raises(TypeError, match="blackboard_key"):
        await cap.publish({"no": "key"})
    watcher = CounterCapability(agent, "worker-9")  # remote: the parent side of a child
    future = await watcher.get_result_future("r-1")
    child_board = bb.scoped(watcher.scope_id)
    await child_board.write(AgentRunProtocol.result_key("r-1"), {"output": 7})
    assert await asyncio.wait_for(future, 5) == {"output": 7}
    already = await watcher.get_result_future("r-1")  # a result written before the call is found too
    assert already.result() == {"output": 7}
    queue: asyncio.Queue = asyncio.Queue()
    watcher.stream_events_to_queue(queue, "progress:*")
    await asyncio.sleep(0.05)
    await child_board.write("progress:1", 1)
    await child_board.write("other", 1)
    await child_board.write("progress:2", 2)
    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(2)]
    assert [e.key for e in got] == ["progress:1", "progress:2"]
    await watcher.close()


async def test_events_no_handler_matches_never_reach_the_feed(runtime: LocalAgentRuntime) -> None:
    """The handlers' key pattern filters in the shared reader: a scope busy with other keys (a run
    scope's claims, events and results beside its requests) costs the feed nothing, and its
    position moves with the events it handles."""
    agent = await runtime.spawn(counter_blueprint("quiet", STEPS, extra=[NoteWatcher.bind()]))
    name = next(n for n in agent.event_delivery.handlers)
    seen: list[str] = []
    handle = agent.event_delivery._handle

    async def counting(feed: str, handlers: Any, event: Any) -> None:
        seen.append(event.key)
        await handle(feed, handlers, event)

    agent.event_delivery._handle = counting  # type: ignore[method-assign]
    await asyncio.gather(*(agent.blackboard.write(f"other:{i}", i) for i in range(40)))
    last = await agent.blackboard.write("note:x", "x")
    async with asyncio.timeout(5):
        while not agent.context:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert seen == ["note:x"]
    assert agent.event_delivery.positions[name] == (await agent.blackboard.latest_event_id())
    assert last.version == 1


async def test_event_handlers_accumulate_context_for_the_policy(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(counter_blueprint("listener", STEPS, extra=[NoteWatcher.bind()]))
    await agent.blackboard.write("note:a", "x")
    await agent.blackboard.write("ignored", "y")
    await agent.blackboard.write("note:b", "z")
    async with asyncio.timeout(5):
        while len(agent.context) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert [c["note"] for c in agent.context] == ["note:a", "note:b"]
    state = agent._build_state(await agent.begin_run(1))
    assert [c["note"] for c in state.context] == ["note:a", "note:b"]
    assert {a["name"] for a in state.actions} == {"add", "explode", "wait_for_children"}
