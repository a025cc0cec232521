"""The `greeter` agent: a blueprint factory named in the `agents:` settings.

A factory is called with the agent id (the name under `agents:`) and returns an AgentBlueprint whose
metadata carries that id; an `AgentRunCapability` on the `runs` namespace is what lets
`POST /v1/runs` (and `colony run greeter`) reach it, as it does the built-ins.
"""

from __future__ import annotations

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
from colony.system.builtin import RUNS_NAMESPACE


class Greeting(AgentCapability):
    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def greet(self, name: str) -> dict[str, str]:
        """Greet someone by name."""
        return {"greeting": f"Hello, {name}!"}


def greeter(agent_id: str) -> AgentBlueprint:
    """The blueprint of the `greeter` agent: one scripted step, `greet` with the run's `name`."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="greeter"),
        capabilities=[Greeting.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "greet", "parameters": {"name": "$input.name"}}]
        ),
    )
