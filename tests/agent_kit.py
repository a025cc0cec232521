"""Capabilities and helpers shared by the agent tests (a module, so blueprints pickle by reference)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from colony.agents import (
    ActionResult,
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    ScriptedActionPolicy,
    action_executor,
    event_handler,
)
from colony.blackboard import Blackboard, BlackboardEvent


class Finding(BaseModel):
    finding_id: str
    text: str

    def blackboard_key(self) -> str:
        return f"finding:{self.finding_id}"


class CounterCapability(AgentCapability):
    """Keeps a running total; its state survives suspension through get_state/set_state."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        delay: float = 0.0,
        capability_key: str | None = None,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.total = 0
        self.delay = delay

    @action_executor(action_type=ActionType.ANALYZE)
    async def add(self, amount: int, note: str = "") -> int:
        """Add `amount` to the running total.

        Returns the new total.
        """
        await asyncio.sleep(self.delay)
        self.total += amount
        return self.total

    @action_executor(exclude_from_planning=True)
    async def reset(self) -> None:
        """Set the total back to zero (programmatic only)."""
        self.total = 0

    @action_executor()
    async def explode(self) -> None:
        """Always fails."""
        raise RuntimeError("kaboom")

    @action_executor(action_type=ActionType.AGENT_MONITOR)
    async def wait_for_children(self, ids: list[str]) -> ActionResult:
        """Block until the given child agents finish."""
        return ActionResult(
            success=False, blocked=True, blocked_reason="waiting for children", blocking_agent_ids=ids
        )

    def get_state(self) -> dict[str, Any]:
        return {"total": self.total}

    def set_state(self, state: dict[str, Any]) -> None:
        self.total = int(state.get("total", 0))


class NoteWatcher(AgentCapability):
    """Turns `note:*` writes on its scope into policy context."""

    @event_handler(pattern="note:*")
    async def on_note(self, event: BlackboardEvent) -> dict[str, Any]:
        return {"note": event.key, "version": event.version}


def counter_blueprint(
    agent_id: str,
    steps: list[dict[str, Any]],
    *,
    delay: float = 0.0,
    serve_namespace: str | None = None,
    extra: list[Any] | None = None,
) -> AgentBlueprint:
    capabilities = [CounterCapability.bind(delay=delay), *(extra or [])]
    if serve_namespace:
        capabilities.append(AgentRunCapability.bind(namespace=serve_namespace))
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="counter"),
        capabilities=capabilities,
        action_policy=ScriptedActionPolicy.bind(steps=steps),
    )


class TokenCapability(AgentCapability):
    """Streams the words of a text as `token` events, as `ask` streams a model's tokens, with a
    pause before each (`delay`) so a test can kill the host mid-stream."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.delay = delay

    @action_executor(action_type=ActionType.ANALYZE)
    async def speak(self, text: str) -> str:
        """Stream `text` word by word as `token` events; returns it."""
        for i, word in enumerate(text.split(" ")):
            await asyncio.sleep(self.delay)
            if self.agent is not None:
                await self.agent.emit_run_event("token", {"text": word if i == 0 else f" {word}"})
        return text


def speaker_blueprint(agent_id: str, *, delay: float, serve_namespace: str) -> AgentBlueprint:
    """Adds 1 (a checkpointed step), then streams its input text as tokens (the step a restart redoes)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="speaker"),
        capabilities=[
            CounterCapability.bind(),
            TokenCapability.bind(delay=delay),
            AgentRunCapability.bind(namespace=serve_namespace),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {"action": "add", "parameters": {"amount": 1}},
                {"action": "speak", "parameters": {"text": "$input"}},
            ]
        ),
    )


def count_calls(owner: Any, name: str) -> dict[str, int]:
    """Wrap the async method `name` of `owner` so that its calls are counted (in the returned
    dict's "count"); the calls go through unchanged."""
    original, calls = getattr(owner, name), {"count": 0}

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls["count"] += 1
        return await original(*args, **kwargs)

    setattr(owner, name, counted)
    return calls


def assert_failed(result: Any, *words: str) -> None:
    """An action result that failed, its error naming each of `words`."""
    assert not result.success, result
    for word in words:
        assert word in result.error, result.error
