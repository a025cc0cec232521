"""`colony chat` driven with piped stdin as a user types: against the API in this process (scripted
engine, tests/test_api_sessions.py's SessionApp) for the commands, and against a real `colony up`
with the embedded model for a real streamed reply."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run_cli
from test_api_sessions import TOKEN, SessionApp

from colony.blackboard.redis_server import free_port
from colony.cli_chat import HELP, Chat
from colony.client import ColonyClient
from colony.config import ColonySettings, ServeSettings
from colony.serve import cluster
from colony.wire.token import TOKEN_ENV


def chat(url: str, token: str, stdin: str, tmp_path: Path, *extra: str, timeout: float = 120) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "colony.cli", "chat", "--url", url, *extra],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, TOKEN_ENV: token},
        cwd=tmp_path,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def served(redis_url: str) -> Iterator[SessionApp]:
    with SessionApp(redis_url) as served:
        yield served


def test_chat_commands_with_piped_stdin(served: SessionApp, tmp_path: Path) -> None:
    script = "one\ntwo\n/history\n/revert 2\nthree\n/fork 1 side\n/branches\n/switch nope\n"
    script += "/\n/bogus\n/quit\nnever sent\n"
    out = chat(served.url, TOKEN, script, tmp_path)
    lines = [line.rstrip() for line in out.splitlines()]
    session_id = re.match(r"session (session-[0-9a-f]{16}) ", lines[0]).group(1)  # type: ignore[union-attr]
    assert lines[1:3] == ["reply number 1", "reply number 2"]  # streamed tokens, one line per reply
    assert lines[3:7] == [
        "[1] user: one",
        "[2] assistant: reply number 1",
        "[3] user: two",
        "[4] assistant: reply number 2",
    ]
    assert lines[7].startswith("reverted to msg-")
    assert lines[8] == "reply number 3"
    assert lines[9] == "on branch side"
    assert sorted(lines[10:12]) == ["  main (4 messages)", "* side (1 messages)"]
    assert lines[12].startswith("[error] ") and "no branch 'nope'" in lines[12]
    assert lines[13:15] == [HELP, HELP]  # "/" alone and an unknown command
    assert len(lines) == 15  # /quit ended it: "never sent" was not sent
    with ColonyClient(served.url, TOKEN) as client:
        everything = [m["content"] for m in client.sessions.messages(session_id, all=True)["messages"]]
        main = [m["content"] for m in client.sessions.messages(session_id)["messages"]]
    assert everything == ["one", "reply number 1", "two", "reply number 2", "three", "reply number 3"]
    assert main == ["one"]  # the active branch is `side`, forked at message 1
    # the prompt of the reply after /revert 2 held messages 1-2 and `three` only
    assert [m.content for m in served.engine.requests[-1].messages[1:]] == ["one", "reply number 1", "three"]
    # continuing the session by id; an unknown one is refused before any message is read
    again = chat(served.url, TOKEN, "/history\n", tmp_path, "--session", session_id)
    assert again.splitlines()[1:] == ["[1] user: one"]
    # `//` sends a message that starts with `/`; the streamed reply keeps its newline
    slash = chat(served.url, TOKEN, "//etc/hosts\n", tmp_path, "--session", session_id)
    assert [line.rstrip() for line in slash.splitlines()[1:]] == ["reply number 4", "to /etc/hosts"]
    with ColonyClient(served.url, TOKEN) as client:
        side = [m["content"] for m in client.sessions.messages(session_id)["messages"]]
    assert side == ["one", "/etc/hosts", "reply number 4\nto /etc/hosts"]
    done = run_cli(
        "chat", "--url", served.url, "--session", "session-0000000000000000",
        cwd=tmp_path, env={**os.environ, TOKEN_ENV: TOKEN},
    )  # fmt: skip
    assert done.returncode == 1 and "no session" in done.stderr


def test_show_prompt_says_what_entered_the_prompt(redis_url: str, tmp_path: Path) -> None:
    """A 250-token budget fills after a few turns: `--show-prompt` shows the summary of what left
    the prompt and the message recalled for the question; without the flag nothing of it prints."""
    context = {"session_max_message_chars": 500, "token_budget": 250}
    with SessionApp(redis_url, context=context, data_dir=tmp_path) as served:
        script = "The blue folder holds the signed lease for the flat.\n"
        script += "".join(
            f"Filler {n}: lunch plans, the weather and the bus timetable today.\n" for n in range(6)
        )
        script += "Which folder holds the signed lease?\n"
        out = chat(served.url, TOKEN, script, tmp_path, "--show-prompt")
        lines = out.splitlines()
        assert lines[1] == "[prompt: the whole conversation]"
        last = lines[lines.index(next(x for x in reversed(lines) if x.startswith("[prompt: "))) :]
        assert re.fullmatch(r"\[prompt: \d+ earlier messages left it\]", last[0]), last
        assert any(x.startswith("[summary of ") for x in last), last
        assert "[recalled] I said: The blue folder holds the signed lease for the flat." in last
        plain = chat(served.url, TOKEN, "Which folder holds the signed lease?\n", tmp_path)
        assert not any(x.startswith("[") for x in plain.splitlines()[1:])


class StreamingSessions:
    """A client's sessions whose turn streams a reply with newlines and a terminal escape sequence."""

    def send(self, session_id: str, text: str) -> Iterator[dict[str, Any]]:
        yield {"event_type": "token", "data": {"text": "Steps:\n1. a"}}
        yield {"event_type": "token", "data": {"text": "\x1b[2J\n2. b\r\n```py\nprint(1)\n```"}}
        yield {"event_type": "message", "data": {"message": {"content": "whatever"}}}


def test_a_streamed_reply_keeps_its_newlines_and_drops_other_control_characters() -> None:
    out = io.StringIO()
    Chat(StreamingSessions(), "session-0000000000000000", out).turn("hi")
    assert out.getvalue() == "Steps:\n1. a [2J\n2. b \n```py\nprint(1)\n```\n"


@pytest.fixture(scope="module")
def chat_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.ClusterInfo]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("colony-chat"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1, replica_cpus=0.5),
    )
    info = cluster.up(settings)
    try:
        yield info
    finally:
        cluster.down(settings)


def test_chat_on_a_real_cluster_with_the_embedded_model(
    chat_cluster: cluster.ClusterInfo, tmp_path: Path
) -> None:
    """The catalog's `session` agent places a session agent on the replica; the embedded model's
    reply streams back token by token; `colony chat` continues the session, reverts, and the tree
    keeps what was reverted."""
    info = chat_cluster
    with ColonyClient(info.url, info.token, timeout=600) as client:
        sid = client.sessions.start()["session_id"]
        record = next(a for a in client.agents() if a["agent_id"] == sid)
        assert record["role"] == "session" and record.get("replica")
        events = list(client.sessions.send(sid, "Say hello."))
        tokens = [e["data"]["text"] for e in events if e["event_type"] == "token"]
        assert events[-1]["event_type"] == "message", events[-1]
        reply = events[-1]["data"]["message"]
        assert len(tokens) > 1 and reply["content"] == "".join(tokens).strip() != ""
    script = "What is 2+2?\n/revert 2\n/history\n"
    lines = chat(info.url, info.token or "", script, tmp_path, "--session", sid, timeout=600).splitlines()
    assert lines[1].strip(), lines  # the second reply, streamed
    assert lines[2].startswith("reverted to msg-"), lines
    assert lines[3] == "[1] user: Say hello."
    assert lines[4].startswith("[2] assistant: ") and len(lines) == 5, lines
    with ColonyClient(info.url, info.token, timeout=600) as client:
        everything = client.sessions.messages(sid, all=True)["messages"]
    assert [m["role"] for m in everything] == ["user", "assistant", "user", "assistant"]
    assert everything[2]["content"] == "What is 2+2?"
