"""Planning: consciousness streams, the planning prompt, event-driven, structured and code-generating
action policies, and the sandbox generated code runs in."""

from colony.planning.codegen import CodeGenerationActionPolicy, extract_code
from colony.planning.context import PlanningContext, PlanningContextBuilder, format_planning_prompt
from colony.planning.policies import EventDrivenActionPolicy, StructuredActionPolicy, choice_schema
from colony.planning.sandbox import SandboxCall, SandboxLimits, SandboxResult, run_sandboxed
from colony.planning.streams import (
    ActionKeySubstringFilter,
    AllOf,
    AnyOf,
    ConsciousnessStream,
    ConsciousnessStreamFormatter,
    ConversationFormatter,
    EventContextKeyFilter,
    JSONStreamFormatter,
    SuccessfulActionFilter,
)

__all__ = [
    "ActionKeySubstringFilter",
    "AllOf",
    "AnyOf",
    "CodeGenerationActionPolicy",
    "ConsciousnessStream",
    "ConsciousnessStreamFormatter",
    "ConversationFormatter",
    "EventContextKeyFilter",
    "EventDrivenActionPolicy",
    "JSONStreamFormatter",
    "PlanningContext",
    "PlanningContextBuilder",
    "SandboxCall",
    "SandboxLimits",
    "SandboxResult",
    "StructuredActionPolicy",
    "SuccessfulActionFilter",
    "choice_schema",
    "extract_code",
    "format_planning_prompt",
    "run_sandboxed",
]
