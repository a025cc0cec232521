"""The agent programming model: Agent, capabilities, hooks, actions, policies, blueprints, handles."""

from colony.agents.actions import ActionDispatcher, ActionSpec, action_executor
from colony.agents.base import Agent, build_agent
from colony.agents.blueprint import AgentBlueprint, Bindable, Blueprint, ResourceRequirements
from colony.agents.capability import AgentCapability, BlackboardPublishable, CapabilityMode
from colony.agents.events import event_handler
from colony.agents.handle import AgentHandle
from colony.agents.hooks import HookContext, HookRegistry, HookType, Pointcut, hook_handler, hookable
from colony.agents.models import (
    ActionResult,
    ActionType,
    AgentMetadata,
    AgentRun,
    AgentState,
    AgentType,
    ResumptionCondition,
    ResumptionKind,
    RunServing,
    RunStatus,
)
from colony.agents.policy import (
    ActionPolicy,
    ActionPolicyExecutionState,
    ActionPolicyIterationResult,
    ScriptedActionPolicy,
)
from colony.agents.run_capability import AgentRunCapability
from colony.agents.runtime import LocalAgentRuntime
from colony.wire.run_events import AgentRunEvent

__all__ = [
    "ActionDispatcher",
    "ActionPolicy",
    "ActionPolicyExecutionState",
    "ActionPolicyIterationResult",
    "ActionResult",
    "ActionSpec",
    "ActionType",
    "Agent",
    "AgentBlueprint",
    "AgentCapability",
    "AgentHandle",
    "AgentMetadata",
    "AgentRun",
    "AgentRunCapability",
    "AgentRunEvent",
    "AgentState",
    "AgentType",
    "Bindable",
    "BlackboardPublishable",
    "Blueprint",
    "CapabilityMode",
    "HookContext",
    "HookRegistry",
    "HookType",
    "LocalAgentRuntime",
    "Pointcut",
    "ResourceRequirements",
    "ResumptionCondition",
    "ResumptionKind",
    "RunServing",
    "RunStatus",
    "ScriptedActionPolicy",
    "action_executor",
    "build_agent",
    "event_handler",
    "hook_handler",
    "hookable",
]
