"""An agent's capabilities (a mixin of `Agent`, colony/agents/base.py): adding one wires its
actions into the dispatcher, its hooks into the agent's registry and its event handlers into event
delivery; attaching one to a recorded agent also records it in the stored blueprint, so a restored
agent has it too."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeVar

from colony.agents.blueprint import CapabilitySpec
from colony.agents.capability import AgentCapability, capability_parts
from colony.agents.events import EventHandlerSpec
from colony.agents.state.persistence import store_blueprint
from colony.errors import AgentUsageError

if TYPE_CHECKING:
    from colony.agents.actions import ActionDispatcher
    from colony.agents.blueprint import AgentBlueprint, Blueprint
    from colony.agents.event_delivery import EventDelivery
    from colony.agents.hooks import HookRegistry
    from colony.blackboard import Blackboard


T = TypeVar("T")


def capability_of(agent: CapabilitySet | None, kind: type[T]) -> T | None:
    """`agent`'s first capability that is a `kind` (a class, or a runtime-checkable protocol)."""
    for capability in agent.capabilities.values() if agent is not None else ():
        if isinstance(capability, kind):
            return capability
    return None


class CapabilitySet:
    """Mixed into Agent, which provides what is declared here."""

    if TYPE_CHECKING:
        agent_id: str
        blackboard: Blackboard
        host: object | None
        capabilities: dict[str, AgentCapability]
        dispatcher: ActionDispatcher
        hooks: HookRegistry
        blueprint: AgentBlueprint | None
        capability_specs: dict[str, CapabilitySpec]
        event_delivery: EventDelivery

    def add_capability(
        self,
        capability: AgentCapability,
        *,
        include_actions: list[str] | None = None,
        exclude_actions: list[str] | None = None,
    ) -> None:
        """Add a capability: its actions go to the dispatcher, its hooks to this agent's registry.

        Before the agent is recorded (or for agents without a blueprint). A recorded agent gets new
        capabilities through `attach_capability(blueprint)`, so a restored agent has them too.
        The policy still has to `use_agent_capabilities()` it when it restricts what it plans with.
        """
        if self.blueprint is not None and capability.name not in self.capability_specs:
            raise AgentUsageError(
                f"agent {self.agent_id} is already recorded; add {capability.name} with "
                "`await agent.attach_capability(Cap.bind(...))` so a restored agent has it too"
            )
        if capability.agent is not self:
            raise AgentUsageError(
                f"{capability.name} belongs to another agent; build it with agent=this agent"
            )
        if capability.name in self.capabilities:
            raise AgentUsageError(f"agent {self.agent_id} already has a capability named {capability.name!r}")
        parts = capability_parts(capability)
        actions = [
            dataclasses.replace(spec, capability=capability.name, method=getattr(capability, attr))
            for attr, spec in parts.actions
        ]
        if include_actions is not None:
            actions = [a for a in actions if a.name in include_actions]
        if exclude_actions:
            actions = [a for a in actions if a.name not in exclude_actions]
        self.dispatcher.add(actions)
        for attr, spec in parts.hooks:
            self.hooks.register(
                spec.pointcut,
                spec.kind,
                getattr(capability, attr),
                priority=spec.priority,
                owner=capability,
            )
        handlers = [EventHandlerSpec(pattern, getattr(capability, attr)) for attr, pattern in parts.handlers]
        if handlers:
            self.event_delivery.handlers[capability.name] = handlers
        self.capabilities[capability.name] = capability

    def get_capability(self, name: str) -> AgentCapability | None:
        return self.capabilities.get(name)

    async def attach_capability(
        self,
        blueprint: Blueprint[AgentCapability],
        *,
        include_actions: list[str] | None = None,
        exclude_actions: list[str] | None = None,
    ) -> AgentCapability:
        """Add a capability to a running agent and record it in the agent's stored blueprint."""
        capability = blueprint.local_instance(agent=self, blackboard=self.blackboard)
        self.capability_specs[capability.name] = CapabilitySpec(
            blueprint=blueprint, include_actions=include_actions, exclude_actions=exclude_actions
        )
        self.add_capability(capability, include_actions=include_actions, exclude_actions=exclude_actions)
        await store_blueprint(self)  # type: ignore[arg-type]
        if self.host is not None:
            await capability.start()
        return capability

    async def remove_capability(self, name: str) -> AgentCapability | None:
        capability = self.capabilities.pop(name, None)
        if capability is not None:
            self.dispatcher.remove_capability(name)
            self.hooks.unregister_owner(capability)
            self.event_delivery.handlers.pop(name, None)
            await capability.close()
            if self.capability_specs.pop(name, None) is not None:
                await store_blueprint(self)  # type: ignore[arg-type]
        return capability
