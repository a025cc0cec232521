"""Actions (discovery, schemas, validation), hooks (order, pointcuts) and blueprints."""

from __future__ import annotations

import threading
from typing import Annotated

import pytest
from agent_kit import CounterCapability, counter_blueprint
from pydantic import Field

from colony.agents import (
    ActionResult,
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    HookContext,
    HookType,
    LocalAgentRuntime,
    Pointcut,
    ScriptedActionPolicy,
    action_executor,
    hook_handler,
    hookable,
)
from colony.agents.actions import ActionDispatcher
from colony.blackboard import Blackboard
from colony.errors import BlueprintError


@pytest.fixture
def agent(bb: Blackboard) -> Agent:
    agent = Agent(AgentMetadata(agent_id="actor"), bb)
    agent.add_capability(CounterCapability(agent))
    return agent


def test_actions_are_discovered_with_schemas(agent: Agent) -> None:
    names = [a.name for a in agent.dispatcher.all_actions()]
    assert names == ["add", "explode", "reset", "wait_for_children"]
    planning = [a.name for a in agent.dispatcher.planning_actions()]
    assert "reset" not in planning and "add" in planning
    add = agent.dispatcher.get("add")
    schema = add.json_schema()
    assert schema["description"] == "Add `amount` to the running total."
    assert schema["parameters"]["required"] == ["amount"]
    assert schema["parameters"]["properties"]["amount"]["type"] == "integer"
    assert schema["parameters"]["properties"]["note"]["default"] == ""
    assert add.action_type is ActionType.ANALYZE and add.capability == "CounterCapability"


async def test_hidden_action_is_still_callable(agent: Agent) -> None:
    await agent.dispatcher.dispatch("add", {"amount": 3})
    result = await agent.dispatcher.dispatch("reset")
    assert result.success
    assert agent.get_capability("CounterCapability").total == 0


async def test_bad_parameters_give_a_failed_result_naming_the_field(agent: Agent) -> None:
    result = await agent.dispatcher.dispatch("add", {"amount": "lots"})
    assert not result.success and "amount" in result.error
    missing = await agent.dispatcher.dispatch("add", {})
    assert not missing.success and "amount" in missing.error and "required" in missing.error.lower()
    extra = await agent.dispatcher.dispatch("add", {"amount": 1, "bogus": 2})
    assert not extra.success and "bogus" in extra.error
    unknown = await agent.dispatcher.dispatch("fly")
    assert not unknown.success and "unknown action 'fly'" in unknown.error
    boom = await agent.dispatcher.dispatch("explode")
    assert not boom.success and "RuntimeError: kaboom" in boom.error


async def test_include_and_exclude_actions(bb: Blackboard) -> None:
    agent = Agent(AgentMetadata(agent_id="picky"), bb)
    agent.add_capability(
        CounterCapability(agent), include_actions=["add", "reset"], exclude_actions=["reset"]
    )
    assert [a.name for a in agent.dispatcher.all_actions()] == ["add"]
    await agent.remove_capability("CounterCapability")
    assert agent.dispatcher.all_actions() == [] and agent.get_capability("CounterCapability") is None


def test_policy_restricts_planning_to_used_capabilities(agent: Agent) -> None:
    policy = ScriptedActionPolicy([], agent)
    agent.action_policy = policy
    assert {a.name for a in policy.planning_actions()} == {"add", "explode", "wait_for_children"}
    policy.disable_agent_capabilities(["CounterCapability"])
    assert policy.planning_actions() == []
    policy.use_agent_capabilities(["CounterCapability"])
    assert len(policy.planning_actions()) == 3


class Target:
    """A plain object with a hookable method, using its own registry."""

    def __init__(self, registry, log: list[str]) -> None:
        self.hooks = registry
        self.log = log

    @hookable
    async def work(self, x: int) -> int:
        self.log.append("method")
        return x * 2


async def test_hook_order_before_around_method_around_after() -> None:
    from colony.agents.hooks import HookRegistry

    log: list[str] = []
    registry = HookRegistry()
    target = Target(registry, log)
    pc = Pointcut.pattern("Target.work")

    def before(ctx: HookContext) -> None:
        log.append("before")
        ctx.args = (ctx.args[0] + 1,)

    async def around_outer(ctx: HookContext, proceed) -> int:
        log.append("around-outer:before")
        result = await proceed()
        log.append("around-outer:after")
        return result

    async def around_inner(ctx: HookContext, proceed) -> int:
        log.append("around-inner:before")
        result = await proceed()
        log.append("around-inner:after")
        return result

    def after(ctx: HookContext, result: int) -> int:
        log.append("after")
        return result + 100

    registry.register(pc, HookType.AFTER, after)
    registry.register(pc, HookType.AROUND, around_outer)
    registry.register(pc, HookType.AROUND, around_inner)
    registry.register(pc, HookType.BEFORE, before)
    assert await target.work(1) == (1 + 1) * 2 + 100
    assert log == [
        "before",
        "around-outer:before",
        "around-inner:before",
        "method",
        "around-inner:after",
        "around-outer:after",
        "after",
    ]


async def test_priority_and_short_circuit() -> None:
    from colony.agents.hooks import HookRegistry

    log: list[str] = []
    registry = HookRegistry()
    target = Target(registry, log)
    registry.register(Pointcut.pattern("*.work"), HookType.BEFORE, lambda ctx: log.append("low"), priority=0)
    registry.register(Pointcut.pattern("*.work"), HookType.BEFORE, lambda ctx: log.append("high"), priority=5)

    async def cached(ctx: HookContext, proceed) -> int:
        return -1  # never calls proceed: the method does not run

    registry.register(Pointcut.pattern("Target.*"), HookType.AROUND, cached)
    assert await target.work(3) == -1
    assert log == ["high", "low"]


def test_pointcut_matching_and_combinators() -> None:
    class Base:
        pass

    class Child(Base):
        pass

    a, b = Child(), Base()
    assert Pointcut.pattern("Base.run*").matches(a, "run_step")  # via the MRO
    assert not Pointcut.pattern("Child.run*").matches(b, "run_step")
    assert Pointcut.for_class(Child).matches(a, "x") and not Pointcut.for_class(Child).matches(b, "x")
    assert Pointcut.for_instance(a, "go").matches(a, "go") and not Pointcut.for_instance(a, "go").matches(
        a, "stop"
    )
    both = Pointcut.pattern("*.run_step") & Pointcut.for_class(Child)
    assert both.matches(a, "run_step") and not both.matches(b, "run_step")
    either = Pointcut.for_instance(b) | Pointcut.for_class(Child)
    assert either.matches(a, "z") and either.matches(b, "z")
    assert (~Pointcut.for_class(Child)).matches(b, "z") and not (~Pointcut.for_class(Child)).matches(a, "z")


class Auditor(AgentCapability):
    """Registers hooks through hook_handler(): every dispatch and run_step is logged."""

    def __init__(self, agent=None, scope_id=None, *, blackboard=None) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.seen: list[str] = []

    @hook_handler("ActionDispatcher.dispatch", HookType.BEFORE)
    def before_dispatch(self, ctx: HookContext) -> None:
        self.seen.append(f"dispatch:{ctx.args[0]}")

    @hook_handler(Pointcut.pattern("Agent.run_step"), HookType.AFTER)
    async def after_step(self, ctx: HookContext, result: object) -> None:
        self.seen.append("step")


async def test_capability_hooks_fire_on_their_agent_only(runtime: LocalAgentRuntime) -> None:
    steps = [{"action": "add", "parameters": {"amount": 1}}, {"action": "add", "parameters": {"amount": 2}}]
    watched = await runtime.spawn(counter_blueprint("watched", steps, extra=[Auditor.bind()]))
    other = await runtime.spawn(counter_blueprint("other", steps))
    await watched.run(None)
    await other.run(None)
    assert watched.get_capability("Auditor").seen == ["dispatch:add", "step", "dispatch:add", "step"]
    await watched.remove_capability("Auditor")
    assert len(watched.hooks) == 0


def test_bind_rejects_unknown_and_unpicklable_kwargs() -> None:
    with pytest.raises(BlueprintError, match=r"unknown argument\(s\) \['delai'\]"):
        CounterCapability.bind(delai=1.0)
    with pytest.raises(BlueprintError, match=r"argument 'delay'.*cannot be pickled"):
        CounterCapability.bind(delay=threading.Lock())
    with pytest.raises(BlueprintError, match="'steps'"):
        ScriptedActionPolicy.bind(steps=[threading.Lock()])


def test_blueprints_build_local_instances_and_round_trip(bb: Blackboard) -> None:
    bp = CounterCapability.bind(delay=0.5)
    cap = bp.local_instance(scope_id="some-agent")  # no agent: detached, on that agent's scope
    assert isinstance(cap, CounterCapability) and cap.delay == 0.5 and cap.agent is None
    assert cap.scope_id == "tenant:default:colony:default:agent:some-agent"
    with pytest.raises(ValueError, match="detached capability needs a scope_id"):
        bp.local_instance()
    agent_bp = counter_blueprint("bp-agent", [{"action": "add", "parameters": {"amount": 1}}])
    again = AgentBlueprint.from_text(agent_bp.to_text())
    assert again.metadata.agent_id == "bp-agent" and again.capabilities[0] == agent_bp.capabilities[0]
    assert "action_policy_blueprints" not in again.metadata.model_dump_json()
    assert again.resources.cpu == 0.1


async def test_action_result_passthrough(agent: Agent) -> None:
    result = await agent.dispatcher.dispatch("wait_for_children", {"ids": ["a", "b"]})
    assert isinstance(result, ActionResult) and result.blocked and result.blocking_agent_ids == ["a", "b"]
    assert isinstance(agent.dispatcher, ActionDispatcher)


class _Bounded(AgentCapability):
    @action_executor(action_type=ActionType.MEMORY_WRITE)
    async def note(
        self, text: Annotated[str, Field(max_length=5)], times: Annotated[int, Field(ge=1, le=3)] = 1
    ) -> str:
        """Note `text` up to three times."""
        return text * times


async def test_annotated_bounds_reach_the_schema_and_are_enforced(bb: Blackboard) -> None:
    """Bounds declared with Annotated[..., Field(...)] are part of the planner's schema and refuse
    a call that breaks them (get_type_hints without include_extras used to drop them)."""
    agent = Agent(AgentMetadata(agent_id="bounded"), bb)
    agent.add_capability(_Bounded(agent))
    spec = agent.dispatcher.get("note")
    assert spec is not None
    properties = spec.json_schema()["parameters"]["properties"]
    assert properties["text"]["maxLength"] == 5 and properties["times"]["maximum"] == 3
    assert (await agent.dispatcher.dispatch("note", {"text": "abc", "times": 2})).output == "abcabc"
    long = await agent.dispatcher.dispatch("note", {"text": "abcdefgh"})
    assert not long.success and "text" in long.error
    many = await agent.dispatcher.dispatch("note", {"text": "a", "times": 9})
    assert not many.success and "times" in many.error


def test_action_schemas_are_made_once_and_handed_out_as_copies() -> None:
    """Every step's state lists the actions' schemas: pydantic's schema is built once per action
    method (not per step, nor per agent), and each caller gets its own copy to change."""
    from colony.agents.actions import _schema_text, discover_actions

    class Tool(AgentCapability):
        @action_executor()
        async def add(self, a: int, b: int = 2) -> int:
            """Add two numbers."""
            return a + b

    first, second = discover_actions(Tool(scope_id="a")), discover_actions(Tool(scope_id="b"))
    assert first[0].parameters is second[0].parameters  # one model for every instance
    built = _schema_text.cache_info().misses
    schema = first[0].json_schema()
    assert schema["parameters"]["required"] == ["a"]
    schema["parameters"]["required"].append("b")  # a caller's change stays its own
    assert second[0].json_schema()["parameters"]["required"] == ["a"]
    assert _schema_text.cache_info().misses <= built + 1


async def test_an_action_that_raises_is_logged_once_with_its_traceback(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """The failed result carries the type and message to the policy and the run's events; the log
    gets the traceback, once, where the exception is caught."""
    with caplog.at_level("WARNING", logger="colony.agents.actions"):
        result = await agent.dispatcher.dispatch("explode")
    assert not result.success and result.error == "explode failed: RuntimeError: kaboom"
    raised = [r for r in caplog.records if r.name == "colony.agents.actions"]
    assert len(raised) == 1 and "action explode raised" in raised[0].getMessage()
    assert raised[0].exc_info is not None and raised[0].exc_info[0] is RuntimeError
