"""Meta-actions (issue 37, deliverable 1) on a real control plane: two replica hosts on a real
redis-server with the resumption monitor. A model-planned parent (StructuredActionPolicy; a scripted
engine stands in for the model: only its choice of action matters here) delegates to a catalog agent:
it is suspended while its one-shot child works and resumed when the child stops, and the same call,
made again, returns the child's answer. A call redone under the same run places no second child;
fan-out bounds refuse with a clear result; a slow child is cancelled."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentBlueprint, AgentMetadata, AgentRunCapability, RunStatus
from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings, ServeSettings
from colony.inference import InferenceRequest
from colony.inference.scripted import ScriptedEngine
from colony.planning import CodeGenerationActionPolicy, StructuredActionPolicy
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.collaborate import CollaborationCapability
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost


def slow_worker(agent_id: str) -> AgentBlueprint:
    """A catalog agent (the `agents:` setting names it) whose run takes 20 steps of 0.3 s."""
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 20
    return counter_blueprint(agent_id, steps, delay=0.3, serve_namespace=RUNS_NAMESPACE)


def brief_worker(agent_id: str) -> AgentBlueprint:
    """A catalog agent whose run takes 8 steps of 0.25 s."""
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 8
    return counter_blueprint(agent_id, steps, delay=0.25, serve_namespace=RUNS_NAMESPACE)


def planner(decisions: list[dict[str, Any]], programs: list[str] | None = None) -> Any:
    """The engine's replies: to planning prompts, `decisions` in order (then `finish`); to a code
    planner's, `programs` in order (then one that finishes)."""
    left, code = list(decisions), list(programs or [])

    def reply(request: InferenceRequest) -> str:
        if request.response_format is None:
            if "Python program" in request.messages[0].content:
                return code.pop(0) if code else '```python\nrun("finish", answer="done")\n```'
            return "ok"
        return json.dumps(left.pop(0) if left else {"action": "finish", "parameters": {"answer": "done"}})

    return reply


def parent_blueprint(agent_id: str, policy: Any = None, **options: Any) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="coordinator"),
        capabilities=[
            CollaborationCapability.bind(**options),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=policy or StructuredActionPolicy.bind(max_tokens=64),
    )


class Colony:
    def __init__(
        self, redis_url: str, decisions: list[dict[str, Any]], programs: list[str] | None = None
    ) -> None:
        self.settings = ColonySettings(
            redis_url=redis_url,
            colony_id=f"col{uuid.uuid4().hex[:8]}",
            serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
            agents={"slow": "test_collaborate:slow_worker", "brief": "test_collaborate:brief_worker"},
        )
        self.engine = ScriptedEngine(planner(decisions, programs))
        self.hosts = {n: ReplicaHost(self.settings, n, engine=self.engine) for n in ("ra", "rb")}
        self.control: ControlPlane | None = None
        self.states: dict[str, list[str]] = {}  # states seen of the agents `run` waited on

    async def start(self) -> None:
        self.client = create_redis(self.settings.redis_url, self.settings.blackboard)
        board = Blackboard(self.client, "colony:collaborate", settings=self.settings.blackboard)
        self.control = ControlPlane(board, self.hosts, self.settings)
        for host in self.hosts.values():
            host.spawner = self.control.place
            await host.start(board)
        self.control.start()

    async def close(self) -> None:
        assert self.control is not None
        await self.control.close()
        for host in self.hosts.values():
            await host.close()
        await self.client.aclose()

    def hosted(self, agent_id: str) -> Agent | None:
        for host in self.hosts.values():
            if host.runtime is not None and agent_id in host.runtime.agent_ids:
                return host.runtime.get(agent_id)
        return None

    async def run(self, agent_id: str, task: str, timeout: float = 30, policy: Any = None) -> Any:
        """Start a run of the placed agent and wait for its end (it may move while suspended)."""
        assert self.control is not None
        await self.control.place(parent_blueprint(agent_id, policy=policy))
        agent = self.hosted(agent_id)
        assert agent is not None and agent.host is not None
        run = await agent.host.start_run(agent_id, {"task": task})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = (await self.records()).get(agent_id)
            if record is not None and record.state not in self.states.setdefault(agent_id, []):
                self.states[agent_id].append(record.state)
            current = self.hosted(agent_id)
            ended = current.current_run if current is not None else None
            if ended is not None and ended.done and ended.run_id == run.run_id:
                return ended
            await asyncio.sleep(0.1)
        raise AssertionError(f"run of {agent_id} did not end in {timeout} s")

    async def records(self) -> dict[str, Any]:
        assert self.control is not None
        return {r.agent_id: r for r in await self.control.registry.list()}


@pytest.fixture
async def colony_of(redis_url: str) -> AsyncIterator[Any]:
    made: list[Colony] = []

    async def build(decisions: list[dict[str, Any]], programs: list[str] | None = None) -> Colony:
        colony = Colony(redis_url, decisions, programs)
        await colony.start()
        made.append(colony)
        return colony

    yield build
    for colony in made:
        await colony.close()


async def test_a_delegating_planner_is_suspended_and_resumed_with_its_childs_answer(colony_of: Any) -> None:
    colony = await colony_of([{"action": "delegate", "parameters": {"agent": "echo", "task": "hello there"}}])
    done = await colony.run("boss", "say hello through echo")
    assert done.status is RunStatus.SUCCEEDED, done.error
    records = await colony.records()
    children = [a for a, r in records.items() if r.agent_id.startswith("boss-")]
    assert len(children) == 1, records
    assert records[children[0]].state == "stopped"  # one-shot: it stopped once it answered
    boss = colony.hosted("boss")
    assert boss is not None
    trace = boss.action_policy.call_trace  # type: ignore[attr-defined]
    delegated = [c for c in trace if c["action_key"] == "delegate"]
    assert len(delegated) >= 2 and "waiting for 1 of 1 agents" in delegated[0]["blocked"]  # then made again
    assert delegated[-1]["success"] and "hello there" in json.dumps(delegated[-1]["output_preview"])
    assert "suspended" in colony.states["boss"]  # it waited suspended, not polling
    runs = next(c for c in boss.capabilities.values() if isinstance(c, AgentRunCapability))
    assert runs.spans is not None and [s["kind"] for s in runs.spans.spans] == ["model"]  # `finish`
    assert runs.spans.spans[0]["channel"] == "model" and runs.spans.spans[0]["ms"] >= 0


async def test_a_redone_call_finds_its_children_and_fan_out_is_bounded(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(parent_blueprint("lead", max_children_per_run=3))
    lead = colony.hosted("lead")
    assert lead is not None and lead.host is not None
    tools = lead.get_capability("collaborate")
    first = await tools.spawn(agent="echo", task="one", count=2)
    again = await tools.spawn(agent="echo", task="one", count=2)  # the same call, redone
    assert first == again and len(first["agents"]) == 2
    assert len([a for a in await colony.records() if a.startswith("lead-")]) == 2
    refused = await lead.dispatcher.dispatch("spawn", {"agent": "echo", "task": "two", "count": 2})
    assert not refused.success and "fan-out limit" in (refused.error or "")
    unknown = await lead.dispatcher.dispatch("spawn", {"agent": "session", "task": "x"})
    assert not unknown.success and "you may start" in (unknown.error or "")
    waited = await lead.dispatcher.dispatch("wait_for", {"agents": ["someone-else"]})
    assert not waited.success and "not agents you started" in (waited.error or "")


async def test_slow_children_are_cancelled(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(parent_blueprint("chief"))
    chief = colony.hosted("chief")
    assert chief is not None
    tools = chief.get_capability("collaborate")
    started = await tools.spawn(agent="slow", task="count", count=2)
    await asyncio.sleep(1.0)
    cancelled = await chief.dispatcher.dispatch("cancel_children", {})
    assert cancelled.success and cancelled.output["cancelled"] == started["agents"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        records = await colony.records()
        if all(records[a].state == "stopped" for a in started["agents"]):
            break
        await asyncio.sleep(0.2)
    records = await colony.records()
    assert all(records[a].state == "stopped" for a in started["agents"]), records
    answers = await tools._results(tools._children())
    assert {a["status"] for a in answers.values()} == {"cancelled"}


async def test_deliberate_returns_the_answers_side_by_side(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(parent_blueprint("panel"))
    panel = colony.hosted("panel")
    assert panel is not None
    first = await panel.dispatcher.dispatch(
        "deliberate", {"question": "which port?", "agent": "echo", "count": 2}
    )
    assert first.blocked and len(first.blocking_agent_ids) == 2
    deadline = time.monotonic() + 15
    answered = first
    while answered.blocked and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        answered = await panel.dispatcher.dispatch(
            "deliberate", {"question": "which port?", "agent": "echo", "count": 2}
        )
    assert answered.success and not answered.blocked, answered
    assert [a["agent"] for a in answered.output] == sorted(first.blocking_agent_ids)
    assert all(
        a["status"] == "succeeded" and a["output"]["question"] == "which port?" for a in answered.output
    )


async def test_refused_calls_keep_no_record_and_a_stopped_child_is_an_answer(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(
        parent_blueprint("keeper", max_children_per_run=2, max_children=2, restart_failed=False)
    )
    keeper = colony.hosted("keeper")
    assert keeper is not None
    tools = keeper.get_capability("collaborate")
    started = (await tools.spawn(agent="slow", task="count", count=2))["agents"]
    for n in range(70):  # refused calls (past the bound, or naming no catalog agent) keep nothing
        refused = await keeper.dispatcher.dispatch("spawn", {"agent": "slow", "task": f"x{n}"})
        assert not refused.success and "fan-out limit" in (refused.error or "")
    assert not (await keeper.dispatcher.dispatch("spawn", {"agent": "analyze", "task": "x"})).success
    assert len(tools.calls) == 1 and sorted(tools._children()) == started
    # a child stopped before it answered: wait_for reports it, it does not wait for ever
    for child in started:
        assert await colony.control.stop(child)
    waited = await keeper.dispatcher.dispatch("wait_for", {})
    assert waited.success and not waited.blocked, waited
    assert {a["status"] for a in waited.output.values()} == {"failed"}
    assert all("stopped without answering" in a["error"] for a in waited.output.values())


async def test_a_failed_child_is_restarted_once_and_its_retry_answers(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(parent_blueprint("mender"))
    mender = colony.hosted("mender")
    assert mender is not None
    started = (await mender.get_capability("collaborate").spawn(agent="brief", task="count"))["agents"]
    assert await colony.control.stop(started[0])  # it stops before answering: a failure
    waited = await mender.dispatcher.dispatch("wait_for", {})
    assert waited.blocked and waited.blocking_agent_ids == [f"{started[0]}-r"]
    deadline = time.monotonic() + 20
    while waited.blocked and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        waited = await mender.dispatcher.dispatch("wait_for", {})
    assert (await mender.dispatcher.dispatch("wait_for", {"agents": [f"{started[0]}-r"]})).success  # its name
    assert waited.success and list(waited.output) == started  # the retry answers for the child
    answer = waited.output[started[0]]
    assert answer["status"] == "succeeded" and answer["retried"] is True and answer["output"] == 8
    # once: a retry that fails too is the answer
    assert len(mender.get_capability("collaborate")._retries()) == 1


async def test_a_child_whose_replica_dies_is_placed_again_and_the_parent_gets_its_answer(
    colony_of: Any,
) -> None:
    colony = await colony_of([{"action": "delegate", "parameters": {"agent": "brief", "task": "count"}}])
    await colony.hosts["ra"].ensure_agent(parent_blueprint("survivor"))
    parent = colony.hosted("survivor")
    assert parent is not None and parent.host is not None
    run = await parent.host.start_run("survivor", {"task": "count with brief"})
    deadline = time.monotonic() + 10
    child = None
    while child is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        child = next((r for a, r in (await colony.records()).items() if a.startswith("survivor-")), None)
    assert child is not None and child.replica == "rb", child  # placed beside, on the empty replica
    await asyncio.sleep(0.5)  # it is at work
    await colony.hosts["rb"].close()  # its replica dies mid-run
    deadline = time.monotonic() + 40
    done = None
    seen_on: set[str] = set()  # where the child was hosted while the parent waited
    while time.monotonic() < deadline:
        held = (await colony.records()).get(child.agent_id)
        if held is not None and held.replica:
            seen_on.add(held.replica)
        current = colony.hosted("survivor")
        ended = current.current_run if current is not None else None
        if ended is not None and ended.run_id == run.run_id and ended.done:
            done = ended
            break
        await asyncio.sleep(0.2)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done
    trace = colony.hosted("survivor").action_policy.call_trace  # type: ignore[union-attr]
    assert [c["action_key"] for c in trace] == ["delegate", "delegate"] and "blocked" in trace[0]
    assert trace[1]["output_preview"] == '{"status": "succeeded", "output": 8, "error": null}'  # no retry
    assert "ra" in seen_on  # its run went on on the live replica


async def test_a_retry_that_cannot_start_leaves_the_failure_as_the_answer(colony_of: Any) -> None:
    colony = await colony_of([])
    assert colony.control is not None
    await colony.control.place(parent_blueprint("strict"))
    strict = colony.hosted("strict")
    assert strict is not None
    tools = strict.get_capability("collaborate")
    started = (await tools.spawn(agent="brief", task="count"))["agents"]
    assert await colony.control.stop(started[0])

    async def full(blueprint: Any) -> Any:
        raise RuntimeError("no replica has room")

    tools.spawner = full
    for _ in range(2):  # the same answer each time: no endless retrying
        waited = await strict.dispatcher.dispatch("wait_for", {})
        assert waited.success and not waited.blocked, waited
        answer = waited.output[started[0]]
        assert answer["status"] == "failed" and "no replica has room" in answer["not_restarted"]


async def test_a_code_writing_planner_waits_for_its_child_and_goes_on(colony_of: Any) -> None:
    """CodeGenerationActionPolicy: a program whose `delegate` comes back blocked stops there; the
    agent is suspended, resumed once the child stopped, and the call is made again (not the program)."""
    program = (
        '```python\nanswer = run("delegate", agent="echo", task="hello from code")\n'
        'run("finish", answer=answer)\n```'
    )
    colony = await colony_of([], [program])
    done = await colony.run(
        "coder", "delegate in code", policy=CodeGenerationActionPolicy.bind(max_tokens=64)
    )
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert "suspended" in colony.states["coder"]
    assert len([a for a in await colony.records() if a.startswith("coder-")]) == 1  # found again
    coder = colony.hosted("coder")
    assert coder is not None
    trace = coder.action_policy.call_trace  # type: ignore[attr-defined]
    assert [c["action_key"] for c in trace].count("delegate") >= 2 and "hello from code" in json.dumps(trace)
