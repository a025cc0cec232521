"""`colony run` prints what the server sends (a report built from the files it read, a model's
answer, an error) without terminal escape sequences, and a connection to the API lost for good is
an error of the command (exit 2, what to do), not a traceback read as a failed run."""

from __future__ import annotations

import argparse

import httpx
import pytest

from colony import cli

HOSTILE = "ok\x1b]52;c;c2VjcmV0\x07 \x1b[2Jdone\u202e\u200b\nnext\tline"


def test_terminal_text_drops_control_and_format_characters() -> None:
    text = cli.terminal_text(HOSTILE)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "\u200b" not in text
    assert text == "ok]52;c;c2VjcmV0 [2Jdone\nnext\tline"


@pytest.mark.parametrize("output", [{"report": HOSTILE, "partial": False}, HOSTILE])
def test_a_report_or_answer_reaches_stdout_without_escapes(
    output: object, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(json=False)
    cli._print_output(args, output, failed=False, streamed="")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "done" in out and "next\tline" in out


def test_json_output_escapes_them(capsys: pytest.CaptureFixture[str]) -> None:
    cli._print_output(argparse.Namespace(json=True), {"report": HOSTILE}, failed=False, streamed="")
    assert "\x1b" not in capsys.readouterr().out  # JSON writes \u001b


def test_a_lost_api_connection_is_an_error_of_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def lost(args: argparse.Namespace) -> int:
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    monkeypatch.setattr(cli, "cmd_run", lost)
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        action.choices["run"].set_defaults(func=lost)  # type: ignore[index]
    assert cli.main(["run", "echo"]) == 2
    err = capsys.readouterr().err
    assert "lost the connection to the API" in err and "Traceback" not in err
