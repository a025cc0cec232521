"""What an agent is built with, for people: its class, capabilities, actions, action policy and
resources. The agent records it in its metadata when it is first recorded (`Agent.initialize`),
so the API, which never unpickles a blueprint nor imports a user's package, can show it (the web
console's agent view). Bounded and plain JSON: it is read back from Redis, where a client could
have written anything, and validated against these limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from colony.agents.base import Agent

MAX_CAPABILITIES = 64
MAX_ACTIONS = 128
MAX_EFFECTS = 8
NAME_CHARS = 200
DESCRIPTION_CHARS = 400
Name = Annotated[str, Field(max_length=NAME_CHARS)]


class ProfileAction(BaseModel):
    """One action the agent can take."""

    name: str = Field(max_length=NAME_CHARS)
    capability: str = Field(max_length=NAME_CHARS)
    description: str = Field("", max_length=DESCRIPTION_CHARS)
    planned: bool = Field(True, description="offered to the planner (false: only called in code)")
    effects: list[Name] = Field(default_factory=list, max_length=MAX_EFFECTS)


class ProfileResources(BaseModel):
    cpu: float = 0.0
    memory_mb: int = 0
    max_tokens: int = 0


class AgentProfile(BaseModel):
    """The agent's blueprint summarised (as recorded when the agent was created)."""

    agent_class: str = Field(max_length=NAME_CHARS)
    action_policy: str | None = Field(None, max_length=NAME_CHARS)
    capabilities: list[Name] = Field(default_factory=list, max_length=MAX_CAPABILITIES)
    actions: list[ProfileAction] = Field(default_factory=list, max_length=MAX_ACTIONS)
    more_actions: int = Field(0, ge=0, description="actions left out past MAX_ACTIONS")
    resources: ProfileResources = Field(default_factory=ProfileResources)


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"[:NAME_CHARS]


def profile_of(agent: Agent) -> AgentProfile:
    """The profile of a built agent (its capabilities added, its policy set)."""
    specs = sorted(agent.dispatcher.all_actions(), key=lambda spec: (spec.capability, spec.name))
    actions = [
        ProfileAction(
            name=spec.name[:NAME_CHARS],
            capability=spec.capability[:NAME_CHARS],
            description=" ".join(spec.description.split())[:DESCRIPTION_CHARS],
            planned=not spec.exclude_from_planning,
            effects=[e[:NAME_CHARS] for e in spec.effects[:MAX_EFFECTS]],
        )
        for spec in specs[:MAX_ACTIONS]
    ]
    resources = agent.resources
    policy = agent.action_policy
    return AgentProfile(
        agent_class=_name(type(agent)),
        action_policy=_name(type(policy)) if policy is not None else None,
        capabilities=[
            f"{name[: NAME_CHARS // 2]}: {_name(type(capability))}"[:NAME_CHARS]
            for name, capability in sorted(agent.capabilities.items())[:MAX_CAPABILITIES]
        ],
        actions=actions,
        more_actions=max(0, len(specs) - MAX_ACTIONS),
        resources=ProfileResources(
            cpu=resources.cpu, memory_mb=resources.memory_mb, max_tokens=resources.max_tokens
        ),
    )
