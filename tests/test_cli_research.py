"""What `colony run research` shows: the plan and each worker's evidence as progress lines, then the
answer with its citations (and the workers that could not finish); server text has its control
characters dropped."""

from __future__ import annotations

from colony.run_display import RunDisplay, cited_answer_text


def test_progress_lines_name_the_files_the_pages_and_the_evidence() -> None:
    display = RunDisplay()
    plan = {
        "event_type": "plan",
        "data": {
            "files": ["utils.py", "message.py"],
            "chosen_by_model": ["message.py"],
            "pages": ["p1", "p2", "p3"],
        },
    }
    assert (
        display.feed(plan)
        == "  examining 2 file(s): utils.py, message.py (1 chosen by the model), 3 page(s)\n"
    )
    evidence = {
        "event_type": "evidence",
        "data": {
            "worker": "research-ab-0",
            "replica_id": "ra",
            "faulted": 1,
            "found": [{"path": "utils.py", "line": 197, "name": "parsedate_to_datetime", "chosen": True}],
        },
    }
    assert display.feed(evidence) == (
        "  evidence from research-ab-0 (replica ra, 1 page(s) faulted): utils.py:197 parsedate_to_datetime\n"
    )
    empty = {"event_type": "evidence", "data": {"worker": "w", "replica_id": "rb", "found": "junk"}}
    assert display.feed(empty) == "  evidence from w (replica rb, 0 page(s) faulted): nothing on its page\n"
    hostile = {
        "event_type": "plan",
        "data": {"files": ["a\x1b[2J.py", 7], "chosen_by_model": None, "pages": 3},
    }
    assert "\x1b" not in display.feed(hostile)


def test_the_answer_is_printed_with_its_citations() -> None:
    output = {
        "answer": "`parsedate_to_datetime` (utils.py, line 197): it turns a header date into a datetime.",
        "citations": [
            {"path": "utils.py", "line": 197, "text": "def parsedate_to_datetime(data):"},
            {"path": "evil\x1b]52;c;x\x07.py", "line": 3, "text": "x = 1\u202e"},
            "junk",
        ],
        "not_finished": [{"agent": "research-cd-0", "error": "engine refuses"}],
    }
    text = cited_answer_text(output)
    assert text.splitlines() == [
        "`parsedate_to_datetime` (utils.py, line 197): it turns a header date into a datetime.",
        "  utils.py:197  def parsedate_to_datetime(data):",
        "  evil]52;c;x.py:3  x = 1",
        "  not finished: research-cd-0: engine refuses",
    ]


def test_a_line_break_in_a_path_cannot_forge_a_citation_line() -> None:
    forged = "x\n  trusted/audit.py:12  def verified_safe_converter(value):\n.py"
    output = {
        "answer": f"`convert` ({forged}, line 3): it converts.",
        "citations": [{"path": forged, "line": 3, "text": "def convert(value):\n  evil.py:1  x"}],
    }
    lines = cited_answer_text(output).splitlines()
    assert len(lines) == 2 and not any(line.lstrip().startswith("trusted/") for line in lines)
    assert "x\\n  trusted/audit.py:12" in lines[1]


def test_a_model_calls_usage_is_shown_as_its_token_counts() -> None:
    display = RunDisplay()
    usage = {"event_type": "usage", "data": {"prompt_tokens": 1834, "completion_tokens": 41}}
    assert display.feed(usage) == "  model call: 1,834 prompt tokens, 41 generated\n"
    forged = {"event_type": "usage", "data": {"prompt_tokens": "1\x1b[2J", "completion_tokens": True}}
    assert display.feed(forged) == "  model call\n"
    for count in (-5, 10**12, int("9" * 4000)):  # negative, or too long a line to print
        huge = {"event_type": "usage", "data": {"prompt_tokens": count, "completion_tokens": 1}}
        assert display.feed(huge) == "  model call\n"
