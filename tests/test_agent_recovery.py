"""Nothing is lost when agents are dropped at awkward moments: queued requests, in-flight runs,
requests sent while the agent is down, runs dropped before their first step, Redis outages."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentHandle, AgentMetadata, AgentRun, LocalAgentRuntime
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings

STEPS = [
    {"action": "add", "parameters": {"amount": "$input"}},
    {"action": "add", "parameters": {"amount": 1}},
]


def handle_for(runtime: LocalAgentRuntime, bb: Blackboard, child: str) -> AgentHandle:
    return AgentHandle(child, owner=Agent(AgentMetadata(agent_id="parent", colony_id=runtime.colony_id), bb))


async def test_request_sent_while_idle_agent_is_down_is_served(
    runtime: LocalAgentRuntime, bb: Blackboard
) -> None:
    await runtime.spawn(counter_blueprint("idle-child", STEPS, serve_namespace="ns"))
    await runtime.drop("idle-child")
    pending = asyncio.create_task(handle_for(runtime, bb, "idle-child").run(1, namespace="ns", timeout=10))
    await asyncio.sleep(0.3)  # the request lands while nobody listens
    await runtime.resume("idle-child")
    assert (await pending).output == 2


async def test_queued_request_survives_a_drop(runtime: LocalAgentRuntime, bb: Blackboard) -> None:
    await runtime.spawn(counter_blueprint("busy-child", STEPS, serve_namespace="ns", delay=0.3))
    handle = handle_for(runtime, bb, "busy-child")
    first = asyncio.create_task(handle.run(1, namespace="ns", timeout=15))
    await asyncio.sleep(0.15)  # two concurrent submissions land in either order: keep them apart
    second = asyncio.create_task(handle.run(10, namespace="ns", timeout=15))
    await asyncio.sleep(0.4)  # first past a step, second claimed and queued
    await runtime.drop("busy-child")
    await runtime.resume("busy-child")
    results = sorted([(await first).output, (await second).output])
    assert results == [2, 13]  # 1+1, then the counter (2) + 10 + 1


async def test_new_request_waits_for_the_restored_run(runtime: LocalAgentRuntime, bb: Blackboard) -> None:
    await runtime.spawn(counter_blueprint("resumed-child", STEPS, serve_namespace="ns", delay=0.3))
    handle = handle_for(runtime, bb, "resumed-child")
    first = asyncio.create_task(handle.run(1, namespace="ns", timeout=15))
    await asyncio.sleep(0.5)
    await runtime.drop("resumed-child")
    await runtime.resume("resumed-child")  # the restored run goes on in the runtime's driver
    third = asyncio.create_task(handle.run(10, namespace="ns", timeout=15))
    assert (await first).output == 2
    assert (await third).output == 13


async def test_stream_numbering_continues_after_restore(runtime: LocalAgentRuntime, bb: Blackboard) -> None:
    await runtime.spawn(counter_blueprint("stream-child", STEPS * 2, serve_namespace="ns", delay=0.2))
    handle = handle_for(runtime, bb, "stream-child")
    events: list[Any] = []

    async def collect() -> None:
        async for event in handle.run_streamed(1, namespace="ns", timeout=15):
            events.append(event)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.5)
    await runtime.drop("stream-child")
    await runtime.resume("stream-child")
    await task
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.event_type for e in events] == ["started", "step", "step", "step", "step", "completed"]


async def test_run_dropped_before_its_first_step_starts_clean(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(
        counter_blueprint("fresh", [{"action": "add", "parameters": {"amount": "$input"}}])
    )
    assert (await agent.run(5)).output == 5
    await agent.begin_run(100)  # policy reset for the new run, then the replica dies
    await runtime.drop("fresh")
    restored = await runtime.resume("fresh")
    run = await runtime.wait_for_run("fresh", restored.current_run.run_id, timeout=10)
    assert isinstance(run, AgentRun) and run.output == 105 and run.steps == 1


async def test_event_handlers_survive_a_redis_restart(tmp_path) -> None:
    server = EmbeddedRedis(tmp_path / "outage")
    info = server.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:outage", settings=settings)
    runtime = LocalAgentRuntime(board, colony_id="outage", settings=load_settings())
    try:
        await runtime.spawn(counter_blueprint("steady", STEPS, serve_namespace="ns"))
        handle = AgentHandle("steady", owner=Agent(AgentMetadata(agent_id="p", colony_id="outage"), board))
        assert (await handle.run(1, namespace="ns", timeout=10)).output == 2
        os.kill(info.pid, signal.SIGKILL)  # Redis dies ...
        await asyncio.sleep(1.5)
        server.stop()
        restarted = EmbeddedRedis(tmp_path / "outage", server.settings.model_copy(update={"port": info.port}))
        restarted.start()  # ... and comes back on the same port with its AOF
        async with asyncio.timeout(20):
            while True:
                try:
                    run = await handle.run(10, namespace="ns", timeout=5)
                    break
                except Exception:
                    await asyncio.sleep(0.5)
        assert run.output == 13
    finally:
        await runtime.shutdown()
        await client.aclose()
        EmbeddedRedis(tmp_path / "outage").stop()


def test_blueprint_catches_missing_required_arguments_and_bad_agent_class() -> None:
    from colony.agents import AgentBlueprint, AgentRunCapability, ScriptedActionPolicy
    from colony.errors import BlueprintError

    with pytest.raises(BlueprintError, match="'steps'"):
        ScriptedActionPolicy.bind()
    with pytest.raises(BlueprintError, match="'namespace'"):
        AgentRunCapability.bind()
    with pytest.raises(BlueprintError, match="Agent subclass"):
        AgentBlueprint(agent_class=int)


async def test_capabilities_changed_at_run_time_are_restored(runtime: LocalAgentRuntime) -> None:
    from agent_kit import CounterCapability, NoteWatcher

    from colony.errors import AgentUsageError

    agent = await runtime.spawn(counter_blueprint("morphing", STEPS, extra=[NoteWatcher.bind()]))
    with pytest.raises(AgentUsageError, match="attach_capability"):
        agent.add_capability(NoteWatcher(agent, capability_key="Other"))
    await agent.remove_capability("NoteWatcher")
    from colony.agents import Blueprint

    extra: Blueprint = CounterCapability.bind(capability_key="Spare", delay=0.0)
    await agent.attach_capability(extra, include_actions=[])
    await runtime.drop("morphing")
    restored = await runtime.resume("morphing")
    assert set(restored.capabilities) == {"CounterCapability", "Spare"}
    assert [a.capability for a in restored.dispatcher.all_actions() if a.name == "add"] == [
        "CounterCapability"
    ]
