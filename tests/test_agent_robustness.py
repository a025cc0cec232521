"""A run that fails inside an agent ends failed with its reason and the agent serves the next one;
settings come from the host; the context ring, claims and ended agents' keys are kept right.
Real redis-server; failures are injected into the agent's own code (persist raising once)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agent_kit import count_calls, counter_blueprint
from redis.exceptions import TimeoutError as RedisTimeoutError

from colony.agents import Agent, AgentHandle, AgentMetadata, AgentState, LocalAgentRuntime, RunStatus
from colony.agents.base import build_agent
from colony.agents.models import AgentRun
from colony.agents.run_capability import TRIES_WHILE_UP, AgentRunCapability
from colony.agents.runtime import MAX_OUTAGE_REDOS
from colony.agents.state.ring import ContextRing
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, transaction
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings, load_settings
from colony.errors import BlackboardUnavailable, BlueprintTampered, InvalidArgument
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import RUNS_NAMESPACE, echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.wire.run_events import CANCELLED, COMPLETED, FAILED, terminal_event


def handle_for(runtime: LocalAgentRuntime, agent_id: str) -> AgentHandle:
    caller = Agent(AgentMetadata(agent_id="caller", colony_id=runtime.colony_id), runtime.blackboard)
    return AgentHandle(agent_id, owner=caller)


def fail_persist_once(
    agent: Agent, when: Callable[[AgentRun], bool], times: int = 1, error: Exception | None = None
) -> dict[str, int]:
    """Make the agent's next `times` persists that match `when` raise as a Redis outage would
    (or raise `error`)."""
    original, fired = agent.persist, {"count": 0}

    async def flaky(**kwargs: Any) -> None:
        run = agent.current_run
        if fired["count"] < times and run is not None and when(run):
            fired["count"] += 1
            raise error or BlackboardUnavailable("commit", "redis://test", TimeoutError("injected"))
        await original(**kwargs)

    agent.persist = flaky  # type: ignore[method-assign]
    return fired


async def run_event_kinds(board: Blackboard, agent: Agent) -> list[str]:
    """The kinds of the stored events of the agent's current run's request, in order."""
    request_id = agent.current_run.request_id if agent.current_run else None
    assert request_id
    events = [e async for e in board.iter_query(AgentRunProtocol.event_pattern(request_id))]
    return [e.key.rsplit(".", 1)[-1] for e in sorted(events, key=lambda e: e.key)]


AnswerCommit = Callable[[Callable[..., Awaitable[Any]], Any, list[Any]], Awaitable[Any]]


def on_answer_commits(board: Blackboard, monkeypatch: pytest.MonkeyPatch, handle: AnswerCommit) -> None:
    """Route `board`'s answer commits (a commit that writes a result, sent with the retirement
    that follows it in its round trip: `Transaction.followed_by`) through `handle(run, redis,
    calls)`, where `run(redis, calls)` sends them; the commit's payload is `calls[0][2][0]`."""
    real = transaction.run_scripts

    async def routed(redis: Any, calls: list[Any], **kwargs: Any) -> Any:
        def run(redis: Any, calls: list[Any]) -> Awaitable[Any]:
            return real(redis, calls, **kwargs)

        first_keys, first_args = calls[0][1], calls[0][2]
        if first_keys[0] == board.keyspace.events_key and ":result:" in str(first_args[0]):
            return await handle(run, redis, calls)
        return await run(redis, calls)

    monkeypatch.setattr(transaction, "run_scripts", routed)


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 10) -> Any:
    """Poll `check` until it returns something truthy (that value), at most `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)


async def stored_lifecycle(agent: Agent) -> str:
    entry = await agent.blackboard.read(AgentStateProtocol.key("lifecycle"))
    assert entry is not None
    return entry.value["state"]


async def test_a_run_whose_end_could_not_be_saved_is_redone_and_the_agent_serves_on(
    runtime: LocalAgentRuntime,
) -> None:
    """The save of the run's end times out (the run is done in memory): the agent is restored from
    its last checkpoint, the step redone, and the run stored once, succeeded."""
    agent = await runtime.spawn(echo_blueprint(f"fin{uuid.uuid4().hex[:6]}"))
    fired = fail_persist_once(agent, lambda run: run.input == "bad" and run.done)
    handle = handle_for(runtime, agent.agent_id)
    bad = await handle.run("bad", namespace=RUNS_NAMESPACE, timeout=10)
    assert fired["count"] == 1
    assert bad.status is RunStatus.SUCCEEDED and bad.output == "bad", bad.error
    restored = runtime.get(agent.agent_id)
    assert restored is not agent  # the copy whose memory was ahead of Redis went
    assert await until(lambda: stored_lifecycle(restored)) == "idle"
    stored = await restored.blackboard.read(AgentStateProtocol.run_key(restored.current_run.run_id))
    assert stored is not None and stored.value["status"] == "succeeded"
    good = await handle.run("good", namespace=RUNS_NAMESPACE, timeout=10)
    assert good.status is RunStatus.SUCCEEDED and good.output == "good"


async def test_a_run_that_cannot_begin_fails_and_the_agent_serves_on(
    runtime: LocalAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beginning whose save keeps failing while Redis answers (every restored copy too): after
    MAX_OUTAGE_REDOS restores and TRIES_WHILE_UP tries it is not an outage, the run fails with the
    reason, its run never begun, and the agent serves the next run."""
    agent = await runtime.spawn(echo_blueprint(f"beg{uuid.uuid4().hex[:6]}"))
    handle = handle_for(runtime, agent.agent_id)
    first = await handle.run("first", namespace=RUNS_NAMESPACE, timeout=10)
    assert first.status is RunStatus.SUCCEEDED
    original, fired = Agent.persist, {"count": 0}

    async def failing(self: Agent, **kwargs: Any) -> None:
        run = self.current_run
        if self.agent_id == agent.agent_id and run is not None and run.input == "bad" and not run.done:
            fired["count"] += 1
            raise BlackboardUnavailable("commit", "redis://test", TimeoutError("injected"))
        await original(self, **kwargs)

    monkeypatch.setattr(Agent, "persist", failing)
    bad = await handle.run("bad", namespace=RUNS_NAMESPACE, timeout=30)
    assert bad.status is RunStatus.FAILED and "injected" in (bad.error or "")
    assert fired["count"] == MAX_OUTAGE_REDOS + TRIES_WHILE_UP
    serving = runtime.get(agent.agent_id)
    assert serving.current_run is not None and serving.current_run.input == "first"  # never began
    good = await handle.run("good", namespace=RUNS_NAMESPACE, timeout=10)
    assert good.status is RunStatus.SUCCEEDED and good.output == "good"


async def test_a_run_whose_begin_timed_out_once_is_begun_again(runtime: LocalAgentRuntime) -> None:
    """One blackboard timeout before the run began (e.g. Redis paused by SIGSTOP, answering again
    by the time the agent looks) is retried, not the run's failure."""
    agent = await runtime.spawn(echo_blueprint(f"beg{uuid.uuid4().hex[:6]}"))
    handle = handle_for(runtime, agent.agent_id)
    fired = fail_persist_once(agent, lambda run: run.input == "flaky" and not run.done)
    run = await handle.run("flaky", namespace=RUNS_NAMESPACE, timeout=20)
    assert fired["count"] == 1 and run.status is RunStatus.SUCCEEDED and run.output == "flaky"


async def test_an_event_write_that_times_out_is_written_again_not_the_runs_failure(
    runtime: LocalAgentRuntime,
) -> None:
    """An event write caught by a Redis pause waits until Redis answers and is written again (the
    same key: idempotent): the run succeeds and the event is stored once."""
    agent = await runtime.spawn(echo_blueprint(f"evt{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    board, original, fired = capability.blackboard, capability.blackboard.write, {"count": 0}

    async def flaky(key: str, *args: Any, **kwargs: Any) -> Any:
        if key.endswith(".started") and not fired["count"]:
            fired["count"] += 1
            await original(key, *args, **kwargs)  # applied, but its answer is lost
            raise BlackboardUnavailable("write", "redis://test", TimeoutError("injected"))
        return await original(key, *args, **kwargs)

    board.write = flaky  # type: ignore[method-assign]
    handle = handle_for(runtime, agent.agent_id)
    run = await handle.run("x", namespace=RUNS_NAMESPACE, timeout=20)
    assert fired["count"] == 1 and run.status is RunStatus.SUCCEEDED and run.output == "x"
    assert await run_event_kinds(board, agent) == ["started", "step", "completed"]
    request_id = agent.current_run.request_id if agent.current_run else None
    assert request_id
    # ... and streamed once (what GET /v1/runs/{id}/events replays: one stream entry per write)
    subscription = await board.subscribe(f"*{request_id}*", from_id="0").start()
    streamed = []
    while (event := await subscription.next(timeout=0.5)) is not None:
        found = AgentRunProtocol.identify(event.key)
        if event.op == "write" and found is not None and found[0] == "event":
            streamed.append(event.key.rsplit(".", 1)[-1])
    subscription.close()
    assert streamed == ["started", "step", "completed"]


async def test_a_driver_failure_without_a_handle_is_stored_and_the_agent_stays_usable(
    runtime: LocalAgentRuntime,
) -> None:
    """A failure that is not an outage (here: the save of the run's end raises a bug's error) fails
    the run with the reason, stored; an outage there is redone instead (the second run)."""
    agent = await runtime.spawn(echo_blueprint(f"drv{uuid.uuid4().hex[:6]}"))
    fail_persist_once(agent, lambda run: run.done, error=RuntimeError("injected"))
    run = await runtime.start_run(agent.agent_id, "x")
    failed = await runtime.wait_for_run(agent.agent_id, run.run_id, timeout=10)
    assert failed.status is RunStatus.FAILED and "injected" in (failed.error or "")
    assert await stored_lifecycle(agent) == "idle"
    fail_persist_once(agent, lambda run: run.done and run.input == "y")
    again = await runtime.start_run(agent.agent_id, "y")
    done = await runtime.wait_for_run(agent.agent_id, again.run_id, timeout=10)
    assert done.status is RunStatus.SUCCEEDED and done.output == "y"
    assert runtime.get(agent.agent_id) is not agent  # redone by a copy restored from Redis


@pytest.mark.parametrize("hosted", [True, False])
async def test_a_step_that_cannot_be_saved_fails_the_run_hosted_or_not(bb: Blackboard, hosted: bool) -> None:
    colony_id = f"c{uuid.uuid4().hex[:8]}"
    steps = [
        {"action": "add", "parameters": {"amount": "$input"}},
        {"action": "add", "parameters": {"amount": 1}},
    ]
    blueprint = counter_blueprint(f"stp{uuid.uuid4().hex[:6]}", steps, serve_namespace="jobs")
    runtime = LocalAgentRuntime(bb, colony_id=colony_id, settings=load_settings())
    if hosted:
        agent = await runtime.spawn(blueprint)
    else:  # an agent started by plain code: the capability itself runs it
        metadata = blueprint.metadata.model_copy(update={"colony_id": colony_id})
        agent = build_agent(blueprint.model_copy(update={"metadata": metadata}), bb, settings=load_settings())
        await agent.initialize(blueprint)
        await agent.start()
    try:
        fail_persist_once(agent, lambda run: run.input == 5 and run.steps == 1 and not run.done)
        handle = handle_for(runtime, agent.agent_id)
        cut = await handle.run(5, namespace="jobs", timeout=10)
        if hosted:  # the runtime redoes the step from the last checkpoint: the run succeeds, once
            assert cut.status is RunStatus.SUCCEEDED and cut.output == 6, cut.error
        else:  # no runtime drives it: the run fails, with the reason
            assert cut.status is RunStatus.FAILED and "injected" in (cut.error or "")
        good = await handle.run(1, namespace="jobs", timeout=10)
        assert good.status is RunStatus.SUCCEEDED
        if hosted:  # the redone step's +1 counted once: 6, then +1 +1
            assert good.output == 8
    finally:
        await runtime.shutdown()
        await agent.close()


async def test_a_step_an_outage_keeps_cutting_short_fails_after_the_redos(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redo after an outage is bounded: a step whose save keeps failing (every restored copy
    too) fails the run after MAX_OUTAGE_REDOS redos, and the agent serves the next run."""
    colony_id = f"c{uuid.uuid4().hex[:8]}"
    steps = [
        {"action": "add", "parameters": {"amount": "$input"}},
        {"action": "add", "parameters": {"amount": 1}},
    ]
    blueprint = counter_blueprint(f"stp{uuid.uuid4().hex[:6]}", steps, serve_namespace="jobs")
    runtime = LocalAgentRuntime(bb, colony_id=colony_id, settings=load_settings())
    original, fired = Agent.persist, {"count": 0}

    async def failing(self: Agent, **kwargs: Any) -> None:
        run = self.current_run
        mine = self.agent_id == blueprint.metadata.agent_id
        if mine and run and run.input == 5 and run.steps == 1 and not run.done:
            fired["count"] += 1
            raise BlackboardUnavailable("commit", "redis://test", TimeoutError("injected"))
        await original(self, **kwargs)

    monkeypatch.setattr(Agent, "persist", failing)
    agent = await runtime.spawn(blueprint)
    try:
        handle = handle_for(runtime, agent.agent_id)
        cut = await handle.run(5, namespace="jobs", timeout=20)
        assert cut.status is RunStatus.FAILED and "injected" in (cut.error or "")
        assert fired["count"] == MAX_OUTAGE_REDOS + 1
        good = await handle.run(1, namespace="jobs", timeout=10)
        assert good.status is RunStatus.SUCCEEDED
    finally:
        await runtime.shutdown()


async def test_a_request_failed_before_it_is_served_numbers_its_events_from_one(
    runtime: LocalAgentRuntime,
) -> None:
    agent = await runtime.spawn(echo_blueprint(f"seq{uuid.uuid4().hex[:6]}"))
    handle = handle_for(runtime, agent.agent_id)
    assert (await handle.run("ok", namespace=RUNS_NAMESPACE, timeout=10)).status is RunStatus.SUCCEEDED
    board = handle._board(RUNS_NAMESPACE, BlackboardScope.AGENT)
    request_id = f"req_{uuid.uuid4().hex[:12]}"
    # a request whose value is not an object: serving it raises before it is adopted
    await board.write(AgentRunProtocol.request_key(request_id), "not an object")
    await until(lambda: board.read(AgentRunProtocol.result_key(request_id)))
    events = [e async for e in board.iter_query(AgentRunProtocol.event_pattern(request_id))]
    assert [e.value["seq"] for e in events] == [1] and events[0].value["event_type"] == FAILED
    assert (await handle.run("after", namespace=RUNS_NAMESPACE, timeout=10)).output == "after"


async def test_an_answered_claim_expires_even_when_the_group_expiry_fails(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(echo_blueprint(f"clm{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    board = capability.blackboard
    original = board.expire

    async def expire_fails(*args: Any, **kwargs: Any) -> int:
        raise BlackboardUnavailable("expire", "redis://test", TimeoutError("injected"))

    board.expire = expire_fails  # type: ignore[method-assign]
    handle = handle_for(runtime, agent.agent_id)
    request_id = await handle.submit("x", namespace=RUNS_NAMESPACE)
    await until(lambda: handle.result(request_id, namespace=RUNS_NAMESPACE))

    async def served() -> bool:
        return capability.active_request is None

    await until(served)
    board.expire = original  # type: ignore[method-assign]
    claim = board.keyspace.entry_key(AgentRunProtocol.claim_key(request_id))
    await asyncio.sleep(0.1)
    assert 0 < await board.redis.pttl(claim) <= capability.retention_seconds * 1000


async def test_persist_keeps_context_appended_while_it_commits(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(echo_blueprint(f"ctx{uuid.uuid4().hex[:6]}"))
    agent.context.append({"a": 1})
    await agent.persist()
    board = agent.blackboard
    commit = board._commit

    async def commit_then_append(*args: Any, **kwargs: Any) -> Any:
        reply = await commit(*args, **kwargs)
        agent.context.append({"b": 2})  # an event handler adding context while the commit is in flight
        return reply

    board._commit = commit_then_append  # type: ignore[method-assign]
    await agent.persist()
    board._commit = commit  # type: ignore[method-assign]
    await agent.persist()
    assert await board.ring(AgentStateProtocol.key("context")) == [{"a": 1}, {"b": 2}]


def test_context_ring_position_marking_and_typed_errors() -> None:
    ring = ContextRing(4)
    ring.extend([{"n": 0}, {"n": 1}])
    position = len(ring)
    ring.append({"n": 2})
    ring.mark_persisted(position)
    assert ring.pending() == [{"n": 2}]
    with pytest.raises(InvalidArgument, match="cap >= 1"):
        ContextRing(0)
    with pytest.raises(InvalidArgument, match="no step"):
        ring[0:2:2]


def test_terminal_event_of_each_status() -> None:
    assert terminal_event(RunStatus.SUCCEEDED) == COMPLETED
    assert terminal_event(RunStatus.CANCELLED) == CANCELLED
    assert terminal_event(RunStatus.FAILED) == FAILED
    assert (terminal_event("succeeded"), terminal_event("cancelled")) == (COMPLETED, CANCELLED)
    assert terminal_event(None) == terminal_event("bogus") == FAILED


async def pttl(agent: Agent, name: str) -> int:
    return await agent.blackboard.redis.pttl(
        agent.blackboard.keyspace.entry_key(AgentStateProtocol.key(name))
    )


async def test_a_failed_agent_is_retired_when_stopped(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(echo_blueprint(f"fld{uuid.uuid4().hex[:6]}"))
    await agent.transition(AgentState.FAILED, "test")
    await runtime.stop(agent.agent_id)
    assert await pttl(agent, "lifecycle") > 0 and await pttl(agent, "blueprint") > 0


async def test_a_refused_agent_is_failed_and_its_state_retired(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(echo_blueprint(f"ref{uuid.uuid4().hex[:6]}"))
    await runtime.suspend(agent.agent_id)
    await agent.blackboard.write(AgentStateProtocol.key("blueprint"), "not a signed blueprint")
    with pytest.raises(BlueprintTampered):
        await runtime.resume(agent.agent_id)
    assert await stored_lifecycle(agent) == "failed"
    for name in ("lifecycle", "metadata", "blueprint"):
        assert await pttl(agent, name) > 0, name
    capability_key = AgentStateProtocol.capability_state_key(next(iter(agent.capabilities)))
    raw = agent.blackboard.keyspace.entry_key(capability_key)
    assert await agent.blackboard.redis.pttl(raw) > 0


@pytest.mark.parametrize("ended", [AgentState.STOPPED, AgentState.FAILED])
async def test_an_ended_agent_recreated_under_its_name_is_fresh_and_lasting(
    runtime: LocalAgentRuntime, ended: AgentState
) -> None:
    name = f"re{uuid.uuid4().hex[:6]}"
    agent = await runtime.spawn(echo_blueprint(name))
    handle = handle_for(runtime, name)
    assert (await handle.run("one", namespace=RUNS_NAMESPACE, timeout=10)).status is RunStatus.SUCCEEDED
    if ended is AgentState.FAILED:
        await agent.transition(AgentState.FAILED, "test")
    await runtime.stop(name)
    assert await pttl(agent, "lifecycle") > 0
    fresh = await runtime.resume(name)  # what ReplicaHost.ensure_agent does for a known agent
    assert fresh is not agent and fresh.state is AgentState.INITIALIZED
    for key in ("blueprint", "metadata", "lifecycle"):
        assert await pttl(fresh, key) == -1, key
    events = fresh.blackboard.keyspace.events_key
    assert await fresh.blackboard.redis.pttl(events) == -1
    run = await handle.run("two", namespace=RUNS_NAMESPACE, timeout=10)
    assert run.status is RunStatus.SUCCEEDED and run.output == "two"
    ring = fresh.blackboard.keyspace.ring_key(AgentStateProtocol.key("context"))
    assert await fresh.blackboard.redis.pttl(ring) in (-1, -2)  # no expiry left from the old agent
    await runtime.stop(name)
    again = await runtime.spawn(echo_blueprint(name))  # spawning over an ended agent works too
    assert again.state is AgentState.INITIALIZED and await pttl(again, "lifecycle") == -1


async def test_replica_settings_reach_the_agent_side_and_a_stray_env_var_is_harmless(
    bb: Blackboard, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"set{uuid.uuid4().hex[:8]}",
        runs={"retention_seconds": 7, "max_events_per_run": 40},
    )
    host = ReplicaHost(settings, "replica-s", engine=ScriptedEngine())
    await host.start(bb)
    try:
        await host.ensure_agent(echo_blueprint())
        # what Kubernetes injects for a Service named `colony`: load_settings() refuses it
        monkeypatch.setenv("COLONY_SERVICE_HOST", "10.0.0.1")
        assert host.runtime is not None and host.registry is not None
        agent = host.runtime.get("echo")
        capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
        assert agent.retention_seconds == 7
        assert (capability.retention_seconds, capability.max_events) == (7, 40)
        runs = RunService(
            bb, host.registry, colony_id=settings.colony_id, retention_seconds=60, settings=load_settings()
        )
        record = await runs.submit("echo", "hi")

        async def ended() -> Any:
            view = await runs.get(record.run_id)
            return view if view.status in ("succeeded", "failed") else None

        view = await until(ended)
        assert view.status == "succeeded", view.error
    finally:
        await host.close()


async def test_a_run_begun_while_the_last_one_is_still_ending_is_driven_to_its_end(
    runtime: LocalAgentRuntime,
) -> None:
    """Whoever sees a run stored done may begin the next at once, while the agent is still ending
    the last one (its end's commit applied, its answer not yet back): that next run is driven,
    never left `running` (the chaos test once lost the run begun right after a redone one)."""
    agent = await runtime.spawn(counter_blueprint("edge", [{"action": "add", "parameters": {"amount": 1}}]))
    held, release = asyncio.Event(), asyncio.Event()
    persist = agent.persist

    async def slow_end(**kwargs: Any) -> None:
        await persist(**kwargs)
        run = agent.current_run
        if run is not None and run.done and not release.is_set():
            held.set()
            await release.wait()  # the first run's end is stored; its caller has not seen it yet

    agent.persist = slow_end  # type: ignore[method-assign]
    first = await runtime.start_run("edge", 1)
    await asyncio.wait_for(held.wait(), 10)
    assert (await runtime.wait_for_run("edge", first.run_id, timeout=10)).status is RunStatus.SUCCEEDED
    second = asyncio.create_task(runtime.start_run("edge", 2))
    await asyncio.sleep(0.2)  # begun as far as it can go before the first run has ended
    release.set()
    run = await asyncio.wait_for(second, 10)
    ended = await runtime.wait_for_run("edge", run.run_id, timeout=10)
    assert ended.status is RunStatus.SUCCEEDED and ended.output == 2
    for _ in range(100):  # and the agent goes IDLE after it (its end is stored first)
        if agent.state is AgentState.IDLE:
            break
        await asyncio.sleep(0.05)
    assert agent.state is AgentState.IDLE


async def test_a_run_whose_end_fails_after_the_next_began_fails_alone(runtime: LocalAgentRuntime) -> None:
    """The end of run 1 fails with an error that is not an outage (a read-only replica) while run 2
    waits to begin: run 1 is stored failed, and run 2, begun meanwhile, is driven to its end (its
    agent is not turned IDLE under it by run 1's failure). A review found it lost run 2."""
    from redis.exceptions import ReadOnlyError

    agent = await runtime.spawn(counter_blueprint("edge2", [{"action": "add", "parameters": {"amount": 1}}]))
    persist, fired = agent.persist, {"n": 0}

    async def flaky(**kwargs: Any) -> None:
        run = agent.current_run
        if kwargs.get("enter") is AgentState.IDLE and run is not None and run.input == 1 and not fired["n"]:
            fired["n"] += 1
            await asyncio.sleep(0.2)  # the end's commit in flight (its lock held) ...
            raise ReadOnlyError("You can't write against a read only replica.")  # ... refused
        await persist(**kwargs)

    agent.persist = flaky  # type: ignore[method-assign]
    first = await runtime.start_run("edge2", 1)
    while not (agent.current_run is first and first.done):  # noqa: ASYNC110 - as a server polls it
        await asyncio.sleep(0.01)
    second = await asyncio.wait_for(runtime.start_run("edge2", 2), 10)  # waits for the end's lock
    ended = await runtime.wait_for_run("edge2", second.run_id, timeout=10)
    assert fired["n"] == 1
    assert ended.status is RunStatus.SUCCEEDED and ended.output == 2
    failed = await runtime.wait_for_run("edge2", first.run_id, timeout=10)
    assert failed.status is RunStatus.FAILED and "read only" in (failed.error or "")


@pytest.mark.parametrize("resent", ["claim:", "result:", ".completed"])
async def test_a_create_only_write_the_redis_client_sent_twice_is_the_agents_own(
    runtime: LocalAgentRuntime, resent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py sends a command again on a new connection when the first one's answer was lost
    (its own retry, inside one call): the first was applied, so the second finds the key there and
    the call raises a conflict. A claim, result or event this copy wrote itself is recognised as its
    own (its value): the request is served, answered and its stream ended, not left to no one."""
    agent = await runtime.spawn(echo_blueprint(f"rsn{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    board, fired = capability.blackboard, {"count": 0}
    write_script, commit_script = board._write, board._commit

    def sent_twice(script: Any, names: Callable[[list[str]], str]) -> Any:
        async def call(*, keys: list[str], args: list[str]) -> Any:
            reply = await script(keys=keys, args=args)
            if resent in names(args) and not fired["count"]:
                fired["count"] += 1
                return await script(keys=keys, args=args)  # the re-send, answered
            return reply

        call.sha, call.script = script.sha, script.script  # type: ignore[attr-defined]  # pipelined by SHA
        return call

    async def answer_sent_twice(run: Callable[..., Awaitable[Any]], redis: Any, calls: list[Any]) -> Any:
        replies = await run(redis, calls)
        if resent in calls[0][2][0] and not fired["count"]:
            fired["count"] += 1
            return await run(redis, calls)  # the re-send, answered
        return replies

    board._write = sent_twice(write_script, lambda args: args[0])  # type: ignore[method-assign]
    board._commit = sent_twice(commit_script, lambda args: args[0])  # type: ignore[method-assign]
    on_answer_commits(board, monkeypatch, answer_sent_twice)  # the answer's commit goes so
    handle = handle_for(runtime, agent.agent_id)
    run = await handle.run("twice", namespace=RUNS_NAMESPACE, timeout=15)
    assert fired["count"] == 1 and run.status is RunStatus.SUCCEEDED and run.output == "twice"
    assert await run_event_kinds(board, agent) == ["started", "step", "completed"]


@pytest.mark.parametrize("requester_first", [False, True])
async def test_the_last_step_event_result_and_terminal_event_are_one_commit(
    runtime: LocalAgentRuntime, requester_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer of a run goes in one commit: its last `step` event, its result and its terminal
    event (one round trip where three went). A result the requester wrote first (a cancel, a
    timeout) still stands: the step event is stored, no terminal event of the agent follows."""
    agent = await runtime.spawn(echo_blueprint(f"one{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    board = capability.blackboard
    answers: list[str] = []

    async def watched(run: Callable[..., Awaitable[Any]], redis: Any, calls: list[Any]) -> Any:
        payload = calls[0][2][0]
        answers.append(payload)
        if requester_first and len(answers) == 1:
            request_id = re.search(r"req-[0-9a-f]+", payload).group(0)  # type: ignore[union-attr]
            await board.write(
                AgentRunProtocol.result_key(request_id),
                {"status": "cancelled", "output": None, "error": "by the requester"},
                created_by="api",
            )
        return await run(redis, calls)

    on_answer_commits(board, monkeypatch, watched)
    handle = handle_for(runtime, agent.agent_id)
    request_id = await handle.submit("once", namespace=RUNS_NAMESPACE)
    async with asyncio.timeout(15):
        while (result := await board.read(AgentRunProtocol.result_key(request_id))) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # whatever the agent writes after it
    events = [e async for e in board.iter_query(AgentRunProtocol.event_pattern(request_id))]
    kinds = [e.key.rsplit(".", 1)[-1] for e in sorted(events, key=lambda e: e.key)]
    assert ".step" in answers[0] and ".completed" in answers[0]
    if requester_first:
        assert result.value["status"] == "cancelled" and kinds == ["started", "step"]
    else:
        assert len(answers) == 1 and result.value["status"] == "succeeded"
        assert result.value["output"] == "once"
        assert kinds == ["started", "step", "completed"]


async def test_a_fresh_request_is_adopted_without_reading_its_events_again(
    runtime: LocalAgentRuntime,
) -> None:
    """The read that starts serving a request also lists the request's stored events (one round
    trip): a fresh request has none, so its adoption reads nothing more; one with stored events
    (served again after a restart: here, events written before it is claimed) is read in full."""
    agent = await runtime.spawn(echo_blueprint(f"fre{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    reads = count_calls(capability.events, "stored")
    handle = handle_for(runtime, agent.agent_id)
    run = await handle.run("fresh", namespace=RUNS_NAMESPACE, timeout=15)
    assert run.status is RunStatus.SUCCEEDED and reads["count"] == 0
    # a request whose first attempt stored events (its `started`): read, and numbered after them
    board = capability.blackboard
    request_id = "req-0123456789ab"
    tag = AgentRunProtocol.request_tag(request_id)
    await board.write(
        AgentRunProtocol.event_key(request_id, "00001.started"),
        {"request_id": request_id, "event_type": "started", "seq": 1, "attempt": 1},
        tags={tag},
    )
    await board.write(
        AgentRunProtocol.request_key(request_id), {"input": "again", "requester": "test"}, tags={tag}
    )
    async with asyncio.timeout(15):
        while await board.read(AgentRunProtocol.result_key(request_id)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert reads["count"] == 1
    events = [e.key async for e in board.iter_query(AgentRunProtocol.event_pattern(request_id))]
    assert sorted(k.rsplit(":", 1)[-1] for k in events) == ["00001.started", "00002.step", "00003.completed"]


async def test_an_answer_applied_though_every_try_lost_its_reply_ends_the_stream_once(
    runtime: LocalAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's commit is applied but its reply is lost, and its tries give up while Redis
    answers: its writes go one at a time and each is recognised as stored (one terminal event, the
    run's own result), not followed by a second terminal event saying the result was not stored."""
    agent = await runtime.spawn(echo_blueprint(f"lst{uuid.uuid4().hex[:6]}"))
    capability = next(c for c in agent.capabilities.values() if isinstance(c, AgentRunCapability))
    board, lost = capability.blackboard, {"count": 0}

    async def reply_lost(run: Callable[..., Awaitable[Any]], redis: Any, calls: list[Any]) -> Any:
        if lost["count"] < TRIES_WHILE_UP:
            lost["count"] += 1
            if lost["count"] == 1:
                await run(redis, calls)  # applied (the retirement with it) ...
            raise RedisTimeoutError("injected: the reply was lost")  # ... its reply never came
        return await run(redis, calls)

    on_answer_commits(board, monkeypatch, reply_lost)
    handle = handle_for(runtime, agent.agent_id)
    run = await handle.run("lost", namespace=RUNS_NAMESPACE, timeout=20)  # its result is stored
    assert run.status is RunStatus.SUCCEEDED and run.output == "lost", run.error
    async with asyncio.timeout(15):  # the agent, meanwhile, still tries and then goes one at a time
        while lost["count"] < TRIES_WHILE_UP or capability.active_request is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # anything the agent would write after
    assert await run_event_kinds(board, agent) == ["started", "step", "completed"]


async def test_a_replica_shut_down_by_serve_lets_its_agents_go_before_its_thread_pool(bb: Blackboard) -> None:
    """Serve's graceful shutdown calls the replica's `__del__` and then shuts its thread pool down
    (the embedded engine's calls run there). The agents are let go in `__del__`, without a word:
    their state stays as it was, for the monitor to place them again, and no run of theirs is
    left to fail on the closed pool. Calls that reach the replica afterwards are refused."""
    from colony.errors import ReplicaUnavailable
    from colony.serve.app import EngineReplica

    settings = ColonySettings(colony_id=f"del{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-del", engine=ScriptedEngine())
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    assert host.runtime is not None and host.runtime.agent_ids == ["echo"]
    board = host.runtime.agent_board("echo")
    before = await board.read(AgentStateProtocol.key("lifecycle"))
    cls = EngineReplica.func_or_class
    replica = cls.__new__(cls)  # as Serve built it, without a replica context here
    replica.host, replica._lock, replica._closed = host, asyncio.Lock(), False
    closing = replica.__del__()
    assert closing is not None
    await closing  # what Serve awaits
    assert replica.__del__() is None  # the garbage collector's later call: nothing to await
    assert host.runtime.agent_ids == []
    after = await board.read(AgentStateProtocol.key("lifecycle"))
    assert before is not None and after is not None and after.version == before.version  # untouched
    with pytest.raises(ReplicaUnavailable):
        await replica.snapshot()
