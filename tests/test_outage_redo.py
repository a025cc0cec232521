"""Issue 12 (review findings): a Redis outage or pause that cuts into a run at any point, from its
beginning to its last save, never fails it and never leaves a second record of it: the runtime
restores the agent from Redis, which knows what was stored, and the run goes on or is served again."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from test_agent_robustness import fail_persist_once, handle_for

from colony.agents import AgentState, LocalAgentRuntime, RunStatus
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlackboardUnavailable
from colony.system.builtin import RUNS_NAMESPACE, echo_blueprint


def _injected() -> BlackboardUnavailable:
    return BlackboardUnavailable("commit", "redis://test", TimeoutError("injected"))


async def test_the_save_of_the_last_step_cut_short_is_redone(runtime: LocalAgentRuntime) -> None:
    """The run is already done in memory when its last save times out."""
    agent = await runtime.spawn(echo_blueprint(f"fin{uuid.uuid4().hex[:6]}"))
    fired = fail_persist_once(agent, lambda run: run.done and run.status is RunStatus.SUCCEEDED)
    run = await handle_for(runtime, agent.agent_id).run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert fired["count"] == 1
    assert run.status is RunStatus.SUCCEEDED and run.output == "x", run.error


async def test_a_timeout_entering_running_does_not_fail_the_run(runtime: LocalAgentRuntime) -> None:
    """The commit that stores the run's beginning and RUNNING (one transaction) times out before
    Redis applied it: the run is begun again, not failed."""
    agent = await runtime.spawn(echo_blueprint(f"beg{uuid.uuid4().hex[:6]}"))
    original, fired = agent.persist, {"n": 0}
    transitions: list[AgentState] = []
    transition = agent.transition

    async def flaky(**kwargs: Any) -> None:
        if kwargs.get("enter") is AgentState.RUNNING and not fired["n"]:
            fired["n"] += 1
            raise _injected()
        await original(**kwargs)

    async def counted(new_state: AgentState, reason: str | None = None) -> None:
        transitions.append(new_state)
        await transition(new_state, reason)

    agent.persist = flaky  # type: ignore[method-assign]
    agent.transition = counted  # type: ignore[method-assign]
    run = await handle_for(runtime, agent.agent_id).run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert fired["n"] == 1 and run.status is RunStatus.SUCCEEDED, run.error
    # RUNNING and IDLE came with the run's first and last persist, no transition of their own
    assert AgentState.RUNNING not in transitions and AgentState.IDLE not in transitions, transitions


async def test_a_beginning_stored_though_its_answer_was_lost_leaves_one_run(
    runtime: LocalAgentRuntime,
) -> None:
    """Redis applied the run's first save but the answer timed out (a pause): the run is driven on
    from what Redis holds, not begun a second time beside a record left `running` for ever."""
    agent = await runtime.spawn(echo_blueprint(f"orp{uuid.uuid4().hex[:6]}"))
    original, fired = agent.persist, {"n": 0}

    async def flaky(**kwargs: Any) -> None:
        run = agent.current_run
        if run is not None and not run.done and run.steps == 0 and not fired["n"]:
            fired["n"] += 1
            await original(**kwargs)  # applied
            raise _injected()  # ... but its answer was lost
        await original(**kwargs)

    agent.persist = flaky  # type: ignore[method-assign]
    run = await handle_for(runtime, agent.agent_id).run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert run.status is RunStatus.SUCCEEDED
    board = runtime.agent_board(agent.agent_id)
    runs = [e async for e in board.iter_query(AgentStateProtocol.pattern("run"))]
    states = [(e.value["status"], e.value.get("request_id")) for e in runs]
    assert [s for s, _ in states] == ["succeeded"], states  # one record of it, ended


async def test_an_outage_inside_the_policy_is_redone_not_a_failed_run(runtime: LocalAgentRuntime) -> None:
    """A Redis outage while the policy works (its action-log commit, a read of an action) is redone
    from the last checkpoint like one in the persist; the run does not fail with "action policy
    failed" (the chaos faults caught it once pools ran several runs at once)."""
    agent = await runtime.spawn(echo_blueprint(f"pol{uuid.uuid4().hex[:6]}"))
    policy = agent.action_policy
    assert policy is not None
    original, fired = policy.execute_iteration, {"n": 0}

    async def flaky(state):  # type: ignore[no-untyped-def]
        if not fired["n"]:
            fired["n"] += 1
            raise _injected()
        return await original(state)

    policy.execute_iteration = flaky  # type: ignore[method-assign]
    run = await handle_for(runtime, agent.agent_id).run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert fired["n"] == 1
    assert run.status is RunStatus.SUCCEEDED and run.output == "x", run.error


async def test_a_restored_copy_cut_short_while_its_restore_finishes_is_restored_again(
    runtime: LocalAgentRuntime,
) -> None:
    """A restore after an outage hosts the new copy before it is done; an outage that cuts that
    new copy short meanwhile restores it again once the first restore ends (it used to be taken
    for the restore under way, which had already dropped the copy it was for: the new copy was
    left as it was, holding whatever the outage cut short)."""
    agent = await runtime.spawn(echo_blueprint(f"two{uuid.uuid4().hex[:6]}"))
    activate, hosted, finish = runtime._activate, asyncio.Event(), asyncio.Event()

    async def slow_activate(copy: Any) -> None:
        await activate(copy)  # the new copy is hosted ...
        hosted.set()
        await finish.wait()  # ... and its restore not yet done

    runtime._activate = slow_activate  # type: ignore[method-assign]
    assert runtime.redo_after_outage(agent, "first")
    await asyncio.wait_for(hosted.wait(), 10)
    second = runtime.get(agent.agent_id)
    assert second is not agent
    runtime._activate = activate  # type: ignore[method-assign]
    assert runtime.redo_after_outage(second, "second")  # the new copy's own outage
    finish.set()
    await asyncio.wait_for(asyncio.gather(*runtime._redo_tasks.values()), 10)
    third = runtime.get(agent.agent_id)
    assert third is not second and third is not agent
    run = await handle_for(runtime, agent.agent_id).run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert run.status is RunStatus.SUCCEEDED and run.output == "x", run.error


async def test_a_stop_during_two_restores_after_outages_brings_neither_back(
    runtime: LocalAgentRuntime,
) -> None:
    """Stopped while a second restore waits for the first: both are called off, the agent stays
    stopped."""
    agent = await runtime.spawn(echo_blueprint(f"stp{uuid.uuid4().hex[:6]}"))
    activate, hosted, finish = runtime._activate, asyncio.Event(), asyncio.Event()

    async def slow_activate(copy: Any) -> None:
        await activate(copy)
        hosted.set()
        await finish.wait()

    runtime._activate = slow_activate  # type: ignore[method-assign]
    assert runtime.redo_after_outage(agent, "first")
    await asyncio.wait_for(hosted.wait(), 10)
    runtime._activate = activate  # type: ignore[method-assign]
    assert runtime.redo_after_outage(runtime.get(agent.agent_id), "second")
    await runtime.stop(agent.agent_id)
    finish.set()
    await asyncio.sleep(0.3)
    assert not runtime.has(agent.agent_id) and not runtime._redo_tasks
    state = await runtime.agent_board(agent.agent_id).read(AgentStateProtocol.key("lifecycle"))
    assert state is not None and state.value["state"] == AgentState.STOPPED.value
