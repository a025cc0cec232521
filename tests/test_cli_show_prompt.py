"""`colony run --show-prompt`: the run's input asks for prompt events, and the display prints each
step's prompt (control characters dropped). The end-to-end check against a real cluster and the
embedded model is tests/test_cluster_blocks.py::test_run_show_prompt_prints_each_steps_prompt."""

from __future__ import annotations

from colony.cli import build_parser, with_prompt_events
from colony.run_display import RunDisplay


def test_the_input_asks_for_prompt_events() -> None:
    assert with_prompt_events({"task": "t", "k": 1}) == {"task": "t", "k": 1, "emit_prompt": True}
    assert with_prompt_events("What is my name?") == {"task": "What is my name?", "emit_prompt": True}
    assert with_prompt_events(None) == {"task": "null", "emit_prompt": True}
    assert with_prompt_events([1, 2]) == {"task": "[1, 2]", "emit_prompt": True}
    args = build_parser().parse_args(["run", "ask", "--show-prompt"])
    assert args.show_prompt is True
    assert build_parser().parse_args(["run", "ask"]).show_prompt is False


def test_each_steps_prompt_is_printed_indented_without_control_characters() -> None:
    display = RunDisplay()
    text = "## Goals\n\n- Task: hi \x1b[31mred\x1b[0m\n\tindented"
    out = display.feed({"event_type": "prompt", "data": {"step": 2, "text": text}})
    assert out == "  prompt of step 2:\n    ## Goals\n    \n    - Task: hi  [31mred [0m\n    \tindented\n"
    assert "\x1b" not in out
    # a token line left open is closed before the prompt
    display.feed({"event_type": "token", "data": {"text": "half"}})
    assert display.feed({"event_type": "prompt", "data": {"text": "x"}}).startswith("\n  prompt:\n")


def test_prompt_token_figures_and_compactions_are_shown() -> None:
    display = RunDisplay()
    out = display.feed(
        {"event_type": "prompt", "data": {"step": 3, "text": "x", "tokens": 812, "budget": 1000}}
    )
    assert out.startswith("  prompt of step 3 (812 tokens of 1000):\n")
    out = display.feed(
        {"event_type": "prompt", "data": {"step": 4, "text": "x", "tokens": 90, "budget": None}}
    )
    assert out.startswith("  prompt of step 4 (90 tokens):\n")
    event = {"step": 7, "stage": "summarized", "tokens_before": 1400, "tokens_after": 600}
    out = display.feed({"event_type": "compaction", "data": event})
    assert out == "  compacted at step 7: summarized, 1400 -> 600 tokens\n"


def test_a_failed_step_is_printed_with_its_error() -> None:
    """`colony run` says why a step failed (the action's error type and message), bounded and
    without control characters; a step that went well says ok, as before."""
    display = RunDisplay()
    failed = {
        "step": 1,
        "name": "core_memory_save_message",
        "action": {
            "success": False,
            "error": "core_memory_save_message failed: BlockNotFound: no block 'x'\x1b[2J",
        },
    }
    out = display.feed({"event_type": "step", "data": failed})
    assert out == "  step 1: core_memory_save_message failed: BlockNotFound: no block 'x' [2J\n"
    ok = {"step": 2, "name": "answer", "action": {"success": True, "output": "x"}}
    assert display.feed({"event_type": "step", "data": ok}) == "  step 2: answer ok\n"
    long = {"step": 3, "name": "a", "action": {"success": False, "error": "E" * 5000}}
    assert len(display.feed({"event_type": "step", "data": long})) < 600
    assert display.feed({"event_type": "step", "data": {"step": 4, "name": "plan"}}) == "  step 4: plan\n"
