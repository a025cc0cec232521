"""Lifecycle states and transitions; runs; blocked results; drop-and-restore mid-run."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentMetadata, AgentState, LocalAgentRuntime, ResumptionKind, RunStatus
from colony.agents.models import LEGAL_TRANSITIONS, check_transition
from colony.blackboard import Blackboard
from colony.config import load_settings
from colony.errors import AgentNotFound, IllegalStateTransition


def test_transition_table_is_total_and_terminal_states_are_final() -> None:
    assert set(LEGAL_TRANSITIONS) == set(AgentState)
    assert len(AgentState) == 9
    assert LEGAL_TRANSITIONS[AgentState.STOPPED] == frozenset()
    assert LEGAL_TRANSITIONS[AgentState.FAILED] == frozenset()
    assert AgentState.RUNNING in LEGAL_TRANSITIONS[AgentState.SUSPENDED]


@pytest.mark.parametrize("current,new", list(itertools.product(AgentState, AgentState)))
def test_every_pair_is_either_legal_or_raises(current: AgentState, new: AgentState) -> None:
    if new in LEGAL_TRANSITIONS[current]:
        check_transition(current, new)
    else:
        with pytest.raises(IllegalStateTransition, match=f"from {current.value} to {new.value}"):
            check_transition(current, new)


async def test_transitions_are_persisted_as_blackboard_events(bb: Blackboard) -> None:
    agent = Agent(AgentMetadata(agent_id="life-1"), bb)
    await agent.initialize()
    events = await agent.blackboard.subscribe("agent:lifecycle").start()
    path = [
        AgentState.RUNNING,
        AgentState.WAITING,
        AgentState.SUSPENDED,
        AgentState.RUNNING,
        AgentState.IDLE,
        AgentState.UNLOADED,
        AgentState.LOADED,
        AgentState.STOPPED,
    ]
    for state in path:
        await agent.transition(state, reason=f"to {state.value}")
    seen = []
    for _ in path:
        event = await events.next(timeout=2)
        entry_version = event.version
        seen.append(entry_version)
    assert seen == list(range(2, 2 + len(path)))
    stored = await agent.blackboard.read("agent:lifecycle")
    assert stored.value["state"] == "stopped" and stored.value["previous"] == "loaded"
    with pytest.raises(IllegalStateTransition):
        await agent.transition(AgentState.RUNNING)
    assert (await agent.blackboard.read("agent:lifecycle")).version == stored.version


async def test_every_legal_transition_works_on_a_live_agent(bb: Blackboard) -> None:
    for n, (current, targets) in enumerate(LEGAL_TRANSITIONS.items()):
        for m, new in enumerate(sorted(targets)):
            agent = Agent(AgentMetadata(agent_id=f"t-{n}-{m}"), bb)
            await agent.initialize()
            agent.stored.state = current  # placed directly in `current` to test one edge
            await agent.transition(new)
            assert agent.state is new
            assert (await agent.blackboard.read("agent:lifecycle")).value["state"] == new.value


async def test_run_drives_policy_and_records_the_run(runtime: LocalAgentRuntime) -> None:
    steps = [
        {"action": "add", "parameters": {"amount": "$input"}},
        {"action": "add", "parameters": {"amount": 2}},
    ]
    agent = await runtime.spawn(counter_blueprint("runner", steps))
    run = await agent.run(40)
    assert run.status is RunStatus.SUCCEEDED and run.output == 42 and run.steps == 2
    assert agent.state is AgentState.IDLE
    stored = await agent.blackboard.read(f"agent:run:{run.run_id}")
    assert stored.value["output"] == 42 and stored.value["status"] == "succeeded"
    second = await agent.run(0)
    assert second.run_id != run.run_id and second.output == 44


async def test_failed_action_fails_the_run_with_its_message(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(counter_blueprint("failing", [{"action": "explode"}]))
    run = await agent.run(None)
    assert run.status is RunStatus.FAILED
    assert "kaboom" in run.error


async def test_blocked_result_names_both_children_and_suspends(runtime: LocalAgentRuntime) -> None:
    steps = [{"action": "wait_for_children", "parameters": {"ids": ["agent-abc", "agent-def"]}}]
    agent = await runtime.spawn(counter_blueprint("parent-1", steps))
    await runtime.start_run("parent-1", None)
    board = agent.blackboard
    async with asyncio.timeout(5):
        while (await board.read("agent:lifecycle")).value["state"] != "suspended":  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    suspension = (await board.read("agent:suspension")).value
    assert suspension["condition"]["kind"] == ResumptionKind.CHILDREN_COMPLETED.value
    assert suspension["condition"]["agent_ids"] == ["agent-abc", "agent-def"]
    assert suspension["condition"]["reason"] == "waiting for children"
    with pytest.raises(AgentNotFound):
        runtime.get("parent-1")  # suspended agents are dropped from the replica


async def test_dropped_mid_run_agent_finishes_like_its_twin(runtime: LocalAgentRuntime) -> None:
    steps = [{"action": "add", "parameters": {"amount": n}} for n in (5, 7, 11, 13, 17, 19)]
    twin = await runtime.spawn(counter_blueprint("twin", steps, delay=0.05))
    twin_run = await twin.run(None)

    await runtime.spawn(counter_blueprint("victim", steps, delay=0.05))
    run = await runtime.start_run("victim", None)
    board = runtime.get("victim").blackboard
    async with asyncio.timeout(5):
        while (await board.read(f"agent:run:{run.run_id}")).value["steps"] < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await runtime.drop("victim")  # the object is gone; nothing was saved on the way out
    with pytest.raises(AgentNotFound):
        runtime.get("victim")
    restored = await runtime.resume("victim")
    assert restored.agent_id == "victim"
    assert restored.current_run.run_id == run.run_id and 2 <= restored.current_run.steps < 6
    finished = await runtime.wait_for_run("victim", run.run_id, timeout=10)
    assert finished.status is RunStatus.SUCCEEDED
    assert finished.output == twin_run.output == sum((5, 7, 11, 13, 17, 19))
    assert finished.steps == twin_run.steps == 6


async def test_suspend_and_resume_keep_capability_and_policy_state(runtime: LocalAgentRuntime) -> None:
    steps = [{"action": "add", "parameters": {"amount": 1}} for _ in range(4)]
    agent = await runtime.spawn(counter_blueprint("sleeper", steps, delay=0.05))
    run = await runtime.start_run("sleeper", None)
    await asyncio.sleep(0.12)
    await runtime.suspend("sleeper")
    stored = await agent.blackboard.read("agent:lifecycle")
    assert stored.value["state"] == "suspended"
    resumed = await runtime.resume("sleeper")
    assert resumed is not agent and resumed.state is AgentState.RUNNING
    assert resumed.get_capability("CounterCapability").total == resumed.action_policy.index
    done = await runtime.wait_for_run("sleeper", run.run_id, timeout=10)
    assert done.output == 4


async def test_restore_of_unknown_agent_is_a_clear_error(bb: Blackboard) -> None:
    with pytest.raises(AgentNotFound, match="no restorable agent"):
        await Agent.restore("ghost", bb, settings=load_settings())
