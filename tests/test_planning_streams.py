"""Consciousness streams: the seed's three examples, blueprints, and the prompt they produce."""

from __future__ import annotations

from typing import Any

import cloudpickle

from colony.agents.blueprint import Blueprint
from colony.planning import (
    ActionKeySubstringFilter,
    AllOf,
    AnyOf,
    ConsciousnessStream,
    ConsciousnessStreamFormatter,
    ConversationFormatter,
    EventContextKeyFilter,
    JSONStreamFormatter,
    PlanningContextBuilder,
    SuccessfulActionFilter,
    format_planning_prompt,
)


def conversation_stream() -> Blueprint[ConsciousnessStream]:
    return ConsciousnessStream.bind(
        name="conversation",
        formatter=ConversationFormatter.bind(),
        event_filter=EventContextKeyFilter("user_chat_message"),
        action_filter=SuccessfulActionFilter(ActionKeySubstringFilter("respond_to_user")),
    )


def feed_session(stream: ConsciousnessStream) -> None:
    stream.consider_event(
        {"user_chat_message": {"message": "Can you run an impact analysis on the auth module?"}}
    )
    stream.consider_action({"action_key": "spawn_agent", "success": True, "output_preview": "agent-1"})
    stream.consider_action(
        {"action_key": "respond_to_user", "success": False, "output_preview": "(never said: it failed)"}
    )
    stream.consider_action(
        {
            "action_key": "SessionCapability.respond_to_user",
            "success": True,
            "output_preview": "I'll spawn an ImpactAnalysisCoordinator for the auth module...",
        }
    )
    stream.consider_event({"worker_result": {"worker": "w1"}})  # not this stream's
    stream.consider_event({"user_chat_message": {"message": "Focus on session token handling specifically."}})


def test_example_1_session_conversation() -> None:
    stream = conversation_stream().local_instance()
    feed_session(stream)
    assert stream.render() == (
        "## Conversation\n\n"
        "**User**: Can you run an impact analysis on the auth module?\n"
        "**You (Agent)**: I'll spawn an ImpactAnalysisCoordinator for the auth module...\n"
        "**User**: Focus on session token handling specifically."
    )


def test_example_2_two_streams_in_declared_order() -> None:
    streams = [
        ConsciousnessStream.bind(
            name="worker_results",
            formatter=JSONStreamFormatter.bind(section_title="## Worker Results"),
            event_filter=EventContextKeyFilter("worker_result", "worker_failed"),
            action_filter=None,
            max_entries=50,
        ).local_instance(),
        ConsciousnessStream.bind(
            name="synthesis",
            formatter=JSONStreamFormatter.bind(section_title="## Synthesis Progress"),
            event_filter=None,
            action_filter=SuccessfulActionFilter(ActionKeySubstringFilter("synthesize", "finalize")),
            max_entries=20,
        ).local_instance(),
    ]
    feed = [
        ("event", {"worker_result": {"worker": "w1", "findings": 3}}),
        (
            "action",
            {"action_key": "synthesize_findings", "success": True, "output_preview": "3 findings merged"},
        ),
        ("event", {"worker_failed": {"worker": "w2", "error": "timeout"}}),
        ("action", {"action_key": "finalize_report", "success": False, "output_preview": "x"}),
        ("action", {"action_key": "finalize_report", "success": True, "output_preview": "report ready"}),
    ]
    for kind, item in feed:
        for stream in streams:
            (stream.consider_event if kind == "event" else stream.consider_action)(item)
    context = PlanningContextBuilder(streams).get_planning_context(
        goals=["Assess the impact"],
        constraints=["Be brief"],
        actions=[{"name": "synthesize", "parameters": {}}],
    )
    assert context.stream_sections == [
        '## Worker Results\n\n- worker_result: {"findings": 3, "worker": "w1"}\n'
        '- worker_failed: {"error": "timeout", "worker": "w2"}',
        "## Synthesis Progress\n\n- synthesize_findings: 3 findings merged\n- finalize_report: report ready",
    ]
    prompt = format_planning_prompt(context, instructions="Choose.")
    goals, worker, synthesis, actions = (
        prompt.index("## Constraints"),
        prompt.index("## Worker Results"),
        prompt.index("## Synthesis Progress"),
        prompt.index("## Available Actions"),
    )
    assert goals < worker < synthesis < actions  # verbatim, between goals/constraints and actions


class GameMoveFormatter(ConsciousnessStreamFormatter):
    def __init__(self, section_title: str = "## Game Moves") -> None:
        self._section_title = section_title

    def format(self, entries: list[dict[str, Any]]) -> str:
        if not entries:
            return ""
        lines = [self._section_title, ""]
        for i, entry in enumerate(entries, start=1):
            if entry["kind"] != "event":
                continue
            ctx = entry["contexts"].get("game_move", {})
            lines.append(f"{i}. {ctx.get('move', '?')} (eval: {ctx.get('evaluation', '?')})")
        return "\n".join(lines)


def test_example_3_custom_formatter_and_window() -> None:
    stream = ConsciousnessStream.bind(
        name="game_moves",
        formatter=GameMoveFormatter.bind(),
        event_filter=EventContextKeyFilter("game_move"),
        max_entries=2,
    ).local_instance()
    assert stream.render() == ""
    for move, evaluation in [("e4", 0.3), ("e5", 0.2), ("Nf3", 0.35)]:
        stream.consider_event({"game_move": {"move": move, "evaluation": evaluation}})
    assert stream.render() == "## Game Moves\n\n1. e5 (eval: 0.2)\n2. Nf3 (eval: 0.35)"  # oldest dropped


def test_stream_blueprint_survives_cloudpickle() -> None:
    blueprint = conversation_stream()
    again = cloudpickle.loads(cloudpickle.dumps(blueprint))
    first, second = blueprint.local_instance(), again.local_instance()
    feed_session(first)
    feed_session(second)
    assert first.render() == second.render() != ""


def test_filter_combinators() -> None:
    either = AnyOf(EventContextKeyFilter("a"), EventContextKeyFilter("b"))
    both = AllOf(EventContextKeyFilter("a"), EventContextKeyFilter("b"))
    assert either({"b": 1}) and not either({"c": 1})
    assert both({"a": 1, "b": 2}) and not both({"a": 1})
    assert SuccessfulActionFilter()({"success": True}) and not SuccessfulActionFilter()({"success": False})
