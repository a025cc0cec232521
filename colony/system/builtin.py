"""Built-in agents `echo` (returns its input) and `ask` (answers a question with the replica's
engine, streaming its tokens as run events). `colony.system.catalog` lists every built-in."""

from __future__ import annotations

import contextlib
from typing import Any

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ScriptedActionPolicy,
    action_executor,
)
from colony.blackboard import Blackboard
from colony.errors import AgentUsageError
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine

RUNS_NAMESPACE = "runs"  # the namespace HTTP runs are served in


class EchoCapability(AgentCapability):
    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def echo(self, value: Any = None) -> Any:
        """Return the value unchanged."""
        return value


class AskCapability(AgentCapability):
    """Answers questions with the engine of the replica hosting the agent."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        engine: InferenceEngine | None = None,
        max_tokens: int = 256,
        system_prompt: str = "You are a helpful assistant. Answer briefly and accurately.",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.engine = engine
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt

    @action_executor(action_type=ActionType.ANALYZE)
    async def ask(self, question: str) -> str:
        """Answer a question; the answer's tokens stream to the requester as `token` events."""
        if self.engine is None:
            raise AgentUsageError("the ask agent runs on an engine replica (no engine was injected)")
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=self.system_prompt),
                ChatMessage(role="user", content=question),
            ],
            max_tokens=self.max_tokens,
        )
        return await stream_reply(self.agent, self.engine, request)


async def stream_reply(agent: Agent | None, engine: InferenceEngine, request: InferenceRequest) -> str:
    """Generate `request` on `engine`, each piece of text streamed to the run's requester as a
    `token` event; the whole text, stripped."""
    parts: list[str] = []
    # aclosing: a run failing mid-stream (e.g. its event cannot be stored) ends the stream, and
    # with it the engine's hold on its slot, at once rather than when it is collected
    async with contextlib.aclosing(engine.stream(request)) as chunks:
        async for chunk in chunks:
            if chunk.text:
                parts.append(chunk.text)
                if agent is not None:
                    await agent.emit_run_event("token", {"text": chunk.text})
    return "".join(parts).strip()


def echo_blueprint(agent_id: str = "echo") -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="echo"),
        capabilities=[EchoCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "echo", "parameters": {"value": "$input"}}]
        ),
    )


def ask_blueprint(agent_id: str = "ask", max_tokens: int = 256) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="ask"),
        capabilities=[
            AskCapability.bind(max_tokens=max_tokens),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "ask", "parameters": {"question": "$input.question"}}]
        ),
    )
