"""Policies end to end: StructuredActionPolicy on the real SmolLM2 model, CodeGenerationActionPolicy
on the scripted engine (its program runs in the sandbox), streams resolved on the agent's side."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
import pytest_asyncio

from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    LocalAgentRuntime,
    RunStatus,
    action_executor,
    event_handler,
)
from colony.blackboard import Blackboard
from colony.config import EngineSettings, load_settings
from colony.inference.embedded import EmbeddedEngine
from colony.inference.scripted import ScriptedEngine
from colony.planning import (
    ActionKeySubstringFilter,
    CodeGenerationActionPolicy,
    ConsciousnessStream,
    ConversationFormatter,
    EventContextKeyFilter,
    JSONStreamFormatter,
    StructuredActionPolicy,
    SuccessfulActionFilter,
)


class TicketDesk(AgentCapability):
    """A support-ticket workflow: open, then assign, then close; one step is possible at a time."""

    def __init__(
        self, agent: Agent | None = None, scope_id: str | None = None, *, blackboard: Blackboard | None = None
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.stage = "new"
        self.log: list[str] = []

    def available_actions(self) -> set[str]:
        return {"new": {"open_ticket"}, "open": {"assign_ticket"}, "assigned": {"close_ticket"}}.get(
            self.stage, set()
        )

    @action_executor()
    async def open_ticket(self, title: str) -> str:
        """Open a ticket for the customer's problem, with a short title."""
        self.stage = "open"
        self.log.append("open")
        return f"ticket opened: {title}"

    @action_executor()
    async def assign_ticket(self, team: Literal["billing", "shipping", "technical"]) -> str:
        """Assign the open ticket to the team that handles it."""
        self.stage = "assigned"
        self.log.append("assign")
        return f"ticket assigned to {team}"

    @action_executor()
    async def close_ticket(self, resolution: str) -> str:
        """Close the ticket with a one-line resolution."""
        self.stage = "closed"
        self.log.append("close")
        return f"ticket closed: {resolution}"

    def get_state(self) -> dict[str, Any]:
        return {"stage": self.stage, "log": self.log}

    def set_state(self, state: dict[str, Any]) -> None:
        self.stage, self.log = state.get("stage", "new"), list(state.get("log", []))


def streams() -> list[Any]:
    return [
        ConsciousnessStream.bind(
            name="conversation",
            formatter=ConversationFormatter.bind(),
            event_filter=EventContextKeyFilter("user_chat_message"),
            action_filter=SuccessfulActionFilter(ActionKeySubstringFilter("ticket", "respond_to_user")),
        ),
        ConsciousnessStream.bind(
            name="activity",
            formatter=JSONStreamFormatter.bind(section_title="## Activity"),
            action_filter=ActionKeySubstringFilter(""),
        ),
    ]


def blueprint(agent_id: str, policy: Any, capability: Any) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=agent_id, action_policy_blueprints={"consciousness_streams": streams()}
        ),
        capabilities=[capability],
        action_policy=policy,
    )


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(EngineSettings(page_slots=1), data_dir=tmp_path_factory.mktemp("planning"))
    await engine.start()
    yield engine
    await engine.close()


async def test_structured_policy_on_the_real_model_completes_three_actions(redis_url: str, model) -> None:
    from colony.blackboard import create_redis

    client = create_redis(redis_url)
    board = Blackboard(client, "test:planning")
    runtime = LocalAgentRuntime(
        board, colony_id="planning-structured", engine=model, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(
            blueprint(
                "ticket-agent",
                StructuredActionPolicy.bind(goals=["Handle the customer's request."]),
                TicketDesk.bind(),
            )
        )
        run = await agent.run("My parcel never arrived, please help.")
        assert run.status is RunStatus.SUCCEEDED, run.error
        desk = agent.get_capability("TicketDesk")
        assert desk.log == ["open", "assign", "close"]
        assert run.output.startswith("ticket closed")
        policy = agent.action_policy
        assert [c["action_key"] for c in policy.call_trace] == [
            "open_ticket",
            "assign_ticket",
            "close_ticket",
        ]
        conversation = next(s for s in policy.streams if s.name == "conversation").render()
        assert conversation.count("**You (Agent)**: ticket") == 3
        assert "ticket opened" in conversation and "ticket assigned" in conversation
        restored = await Agent.restore(
            "ticket-agent", board, colony_id="planning-structured", engine=model, settings=load_settings()
        )
        assert [s.name for s in restored.action_policy.streams] == ["conversation", "activity"]
        assert restored.action_policy.streams[0].render() == conversation  # streams are persisted state
    finally:
        await runtime.shutdown()
        await client.aclose()


class Calculator(AgentCapability):
    @action_executor()
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @action_executor()
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


async def test_codegen_policy_runs_programs_in_the_sandbox(redis_url: str) -> None:
    from colony.blackboard import create_redis

    programs = [
        "```python\nimport os\nrun('add', a=1, b=1)\n```",  # refused by the sandbox: the agent carries on
        "Here you go:\n```python\ns = run('add', a=2, b=3)\np = run('multiply', a=s, b=4)\n"
        "total = run('add', a=p, b=1)\nrun('finish', answer=f'result {total}')\n```",
    ]
    engine = ScriptedEngine(programs)
    client = create_redis(redis_url)
    board = Blackboard(client, "test:codegen")
    runtime = LocalAgentRuntime(board, colony_id="planning-codegen", engine=engine, settings=load_settings())
    try:
        agent = await runtime.spawn(
            blueprint(
                "coder", CodeGenerationActionPolicy.bind(goals=["Compute (2+3)*4+1."]), Calculator.bind()
            )
        )
        run = await agent.run("compute")
        assert run.status is RunStatus.SUCCEEDED and run.output == "result 21"
        trace = agent.action_policy.call_trace
        assert [(c["action_key"], c["success"]) for c in trace] == [
            ("program", False),
            ("add", True),
            ("multiply", True),
            ("add", True),
        ]
        assert "import of 'os' is not allowed" in trace[0]["error"]
        assert [c["parameters"] for c in trace[1:]] == [{"a": 2, "b": 3}, {"a": 5, "b": 4}, {"a": 20, "b": 1}]
        activity = next(s for s in agent.action_policy.streams if s.name == "activity").render()
        assert (
            activity.count("- add:") == 2
            and "- multiply: 20" in activity
            and "- program (failed)" in activity
        )
        second_prompt = engine.requests[1].messages[-1].content
        assert (
            "## Activity" in second_prompt and "not allowed" in second_prompt
        )  # the failure informs the plan
    finally:
        await runtime.shutdown()
        await client.aclose()


@pytest.mark.parametrize("allow_weak", [False, True], ids=["refused", "allowed"])
async def test_codegen_policy_refuses_weak_isolation_unless_allowed(redis_url: str, allow_weak: bool) -> None:
    from colony.blackboard import create_redis

    program = "```python\nrun('finish', answer=str(run('add', a=20, b=1)))\n```"
    engine = ScriptedEngine([program])
    client = create_redis(redis_url)
    board = Blackboard(client, f"test:codegen-weak-{allow_weak}")
    runtime = LocalAgentRuntime(
        board, colony_id=f"planning-codegen-weak-{allow_weak}", engine=engine, settings=load_settings()
    )
    planning = {"sandbox_isolation": "process", "allow_weak_sandbox": allow_weak}
    try:
        agent = await runtime.spawn(
            blueprint(
                f"weak-{allow_weak}",
                CodeGenerationActionPolicy.bind(goals=["Add."], planning=planning),
                Calculator.bind(),
            )
        )
        run = await agent.run("add")
        if allow_weak:
            assert run.status is RunStatus.SUCCEEDED and run.output == "21"
        else:
            assert run.status is RunStatus.FAILED
            assert "SandboxRefused" in run.error and "planning.allow_weak_sandbox" in run.error
            assert engine.requests == []  # refused before the model was even asked for code
    finally:
        await runtime.shutdown()
        await client.aclose()


async def test_codegen_policy_takes_planning_from_the_hosts_settings(redis_url: str) -> None:
    """A replica's settings (--config / Serve args) reach the policy; load_settings() here says 'auto'."""
    from colony.blackboard import create_redis
    from colony.config import ColonySettings

    settings = ColonySettings(
        secret="s" * 32, planning={"sandbox_isolation": "process", "allow_weak_sandbox": False}
    )
    engine = ScriptedEngine(["```python\nrun('finish', answer=str(run('add', a=20, b=1)))\n```"])
    client = create_redis(redis_url)
    board = Blackboard(client, "test:codegen-host-settings")
    runtime = LocalAgentRuntime(board, colony_id="codegen-host-settings", engine=engine, settings=settings)
    try:
        agent = await runtime.spawn(
            blueprint("hosted", CodeGenerationActionPolicy.bind(goals=["Add."]), Calculator.bind())
        )
        assert agent.action_policy.planning == settings.planning
        run = await agent.run("add")  # the host's settings force process isolation and refuse it
        assert run.status is RunStatus.FAILED and "planning.allow_weak_sandbox" in run.error
        assert engine.requests == []
    finally:
        await runtime.shutdown()
        await client.aclose()


async def test_codegen_policy_runs_under_bubblewrap_by_default() -> None:
    policy = CodeGenerationActionPolicy(planning={})
    assert await policy.check_isolation() == "bubblewrap"  # CI installs bubblewrap


class Inbox(AgentCapability):
    """Turns `msg:*` writes into user messages and `alert:*` writes into high-priority alerts."""

    @event_handler(pattern="msg:*")
    async def on_message(self, event: Any) -> dict[str, Any]:
        entry = await self.blackboard.read(event.key)
        return {"user_chat_message": {"message": entry.value}}

    @event_handler(pattern="alert:*")
    async def on_alert(self, event: Any) -> dict[str, Any]:
        return {"alert": {"key": event.key}}

    replied = False

    def available_actions(self) -> set[str]:
        return set() if self.replied else {"respond_to_user"}

    @action_executor()
    async def respond_to_user(self, text: str) -> str:
        """Reply to the user."""
        self.replied = True
        return text


async def test_event_driven_policy_waits_for_events_and_puts_priority_first(redis_url: str) -> None:
    import asyncio

    from colony.blackboard import create_redis

    replies = [{"action": "respond_to_user", "parameters": {"text": "hello!"}}]
    engine = ScriptedEngine(replies)
    client = create_redis(redis_url)
    board = Blackboard(client, "test:event-driven")
    runtime = LocalAgentRuntime(board, colony_id="planning-events", engine=engine, settings=load_settings())
    try:
        policy = StructuredActionPolicy.bind(
            wait_for_events=True, event_wait_seconds=5, priority_context_keys=["alert"], allow_finish=False
        )
        agent = await runtime.spawn(blueprint("listener", policy, Inbox.bind()))
        run_task = asyncio.create_task(agent.run("chat"))
        await asyncio.sleep(0.3)  # the policy is waiting for an event
        assert not run_task.done()
        await agent.blackboard.write("msg:1", "hi there")
        await agent.blackboard.write("alert:1", "disk full")
        run = await asyncio.wait_for(run_task, 10)
        assert run.status is RunStatus.SUCCEEDED
        conversation = agent.action_policy.streams[0].render()
        assert conversation == "## Conversation\n\n**User**: hi there\n**You (Agent)**: hello!"
        prompt = engine.requests[0].messages[-1].content
        assert "**User**: hi there" in prompt
        live = agent.action_policy
        agent.context.extend([{"user_chat_message": {"message": "later"}}, {"alert": {"key": "alert:2"}}])
        assert [next(iter(c)) for c in live._new_contexts()] == ["alert", "user_chat_message"]
    finally:
        await runtime.shutdown()
        await client.aclose()


async def test_codegen_policy_keeps_its_prompts_under_the_token_budget(redis_url: str) -> None:
    """The code-writing planner's prompt is fitted like the structured one's: its history is
    summarised (through the same model, recorded by the action log) once it passes the budget."""
    from colony.blackboard import create_redis
    from colony.config import ContextSettings
    from colony.inference.tokens import estimate_tokens
    from colony.planning.compaction import SUMMARISER_SYSTEM

    budget = 250
    prompts: list[str] = []

    def reply(request: Any) -> str:
        if request.messages[0].content == SUMMARISER_SYSTEM:
            return "Earlier the agent added small numbers, one addition per step."
        prompts.append(request.messages[-1].content)
        if len(prompts) >= 40:
            return "```python\nrun('finish', answer='done')\n```"
        return f"```python\nrun('add', a={len(prompts)}, b=1000000)\n```"

    settings = ContextSettings(token_budget=budget, keep_first_items=1, keep_recent_items=4)
    engine = ScriptedEngine(reply)
    client = create_redis(redis_url)
    board = Blackboard(client, "test:codegen-budget")
    runtime = LocalAgentRuntime(
        board, colony_id="planning-codegen-budget", engine=engine, settings=load_settings()
    )
    try:
        policy = CodeGenerationActionPolicy.bind(
            goals=["Add each number to a million."], max_tokens=64, context_settings=settings
        )
        agent = await runtime.spawn(blueprint("budgeted-coder", policy, Calculator.bind()))
        run = await agent.run("add them")
        assert run.status is RunStatus.SUCCEEDED and run.output == "done"
        assert len(prompts) == 40
        assert max(estimate_tokens(p) for p in prompts) <= budget
        assert any("<chat_history_summary>" in p and "one addition per step" in p for p in prompts[-5:])
    finally:
        await runtime.shutdown()
        await client.aclose()
