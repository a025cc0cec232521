"""The planning prompt: goals and constraints, the summary of compacted history, then the streams'
sections verbatim, memory sections, then the actions.

The summary (`history_summary`, written by compaction: colony/planning/compaction.py) stands for
the stream entries taken out of the prompt; it goes in a `<chat_history_summary>` section right
after the pinned goals and constraints, before the entries it precedes in time.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from colony.planning.streams import ConsciousnessStream

HISTORY_SUMMARY_OPEN = "<chat_history_summary>"
HISTORY_SUMMARY_CLOSE = "</chat_history_summary>"


class PlanningContext(BaseModel):
    goals: list[str] = Field(default_factory=list)
    constraints: list[str] = Field(default_factory=list)
    stream_sections: list[str] = Field(default_factory=list, description="rendered streams, declared order")
    memory_sections: list[str] = Field(default_factory=list, description="rendered memory lenses")
    actions: list[dict[str, Any]] = Field(default_factory=list, description="name, description, parameters")
    history_summary: str = Field("", description="summary of compacted history ('' when none)")
    step: int = 0


class PlanningContextBuilder:
    def __init__(self, streams: list[ConsciousnessStream] | None = None) -> None:
        self.streams = list(streams or [])

    def get_planning_context(
        self,
        *,
        goals: list[str],
        constraints: list[str] | None = None,
        actions: list[dict[str, Any]] | None = None,
        memory_sections: list[str] | None = None,
        step: int = 0,
        history_summary: str = "",
    ) -> PlanningContext:
        sections = [s for s in (stream.render() for stream in self.streams) if s]
        return PlanningContext(
            goals=goals,
            constraints=constraints or [],
            stream_sections=sections,
            memory_sections=memory_sections or [],
            actions=actions or [],
            history_summary=history_summary,
            step=step,
        )


def format_planning_prompt(context: PlanningContext, *, instructions: str) -> str:
    """Goals/constraints block, history summary, stream sections verbatim, memory sections, actions
    block, instructions."""
    parts = ["## Goals", "", *[f"- {g}" for g in context.goals]]
    if context.constraints:
        parts += ["", "## Constraints", "", *[f"- {c}" for c in context.constraints]]
    if context.history_summary:
        parts += ["", HISTORY_SUMMARY_OPEN, context.history_summary, HISTORY_SUMMARY_CLOSE]
    for section in [*context.stream_sections, *context.memory_sections]:
        parts += ["", section]
    parts += ["", "## Available Actions", ""]
    for action in context.actions:
        params = action.get("parameters", {}).get("properties", {})
        signature = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in params.items())
        parts.append(f"- `{action['name']}({signature})`: {action.get('description', '')}")
    parts += ["", instructions]
    return "\n".join(parts)
