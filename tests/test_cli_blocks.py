"""`colony blocks ...` against the real API (uvicorn over a real redis-server; see
tests/test_api_blocks.py), through `colony.cli.main` with `--url`/`--token`, as a user runs them:
ls, show, create, edit (--text, --file, --append, $EDITOR), history, rollback, undo, share/unshare,
colony blocks, and API refusals printed with exit status 1."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_blocks import TOKEN, BlocksApp

from colony import cli, cli_blocks


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlocksApp]:
    with BlocksApp(redis_server.url, tmp_path_factory.mktemp("blocks-cli")) as app:
        yield app


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No local cluster, config file or token of this machine in play."""
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG", "EDITOR", "VISUAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def names(*roles: str) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{role}-{tag}" for role in roles]


class Colony:
    def __init__(self, served: BlocksApp, capsys: pytest.CaptureFixture[str]) -> None:
        self.served, self.capsys = served, capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        if argv[0] in ("create", "share") and "--colony" not in argv:
            argv = (*argv, "--provision")  # these tests' agents never run (tests/test_api_blocks.py)
        code = cli.main(["blocks", *argv, "--url", self.served.url, "--token", TOKEN])
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, (argv, out, err)
        return out

    def json(self, *argv: str) -> Any:
        return json.loads(self.ok(*argv, "--json"))


@pytest.fixture
def colony(served: BlocksApp, capsys: pytest.CaptureFixture[str]) -> Colony:
    return Colony(served, capsys)


def test_create_ls_show(colony: Colony) -> None:
    (agent,) = names("writer")
    out = colony.ok(
        "create",
        agent,
        "notes",
        "--type",
        "core",
        "--description",
        "my notes",
        "--limit",
        "100",
        "--content",
        "hello",
    )
    assert out == f"created notes ({agent}, core), limit 100 characters\n"
    colony.ok("create", agent, "scratch")

    lines = colony.ok("ls", agent).splitlines()
    assert lines[0].split() == ["LABEL", "OWNER", "TYPE", "CHARS/LIMIT", "ACCESS", "FLAGS", "DESCRIPTION"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["notes"] == ["notes", agent, "core", "5/100", "read_write", "-", "my", "notes"]
    assert rows["scratch"][:6] == ["scratch", agent, "working", "0/5000", "read_write", "-"]
    listed = colony.json("ls", agent)
    assert {(b["label"], b["chars"]) for b in listed if not b["colony"]} == {("notes", 5), ("scratch", 0)}

    assert colony.ok("show", agent, "notes") == f"notes ({agent}, core) 5/100 v1\nhello\n"
    assert colony.json("show", agent, "notes")["content"] == "hello\n"

    # from a template, its fields given as NAME=VALUE
    out = colony.ok(
        "create",
        agent,
        "human",
        "--template",
        "human",
        "--field",
        "name=Ada",
        "--field",
        'preferences=["tea"]',
    )
    assert out == f"created human ({agent}, core), limit 2000 characters\n"
    assert colony.json("show", agent, "human")["content"] == "Name: Ada\nPreferences: tea\n"
    code, _, err = colony("create", agent, "other", "--template", "human", "--field", "age=7")
    assert code == 1 and "HTTP 422" in err and "age" in err

    # the server's refusals: message on stderr, exit 1
    code, out, err = colony("create", agent, "notes")
    assert code == 1 and out == "" and "HTTP 409 conflict" in err
    code, _, err = colony("show", agent, "missing")
    assert code == 1 and "HTTP 404 not_found" in err and "missing" in err
    code, _, err = colony("create", agent, "Bad")
    assert code == 1 and "HTTP 422 invalid_request" in err and "label" in err
    # usage mistakes are the CLI's own (exit 2)
    code, _, err = colony("show", agent)
    assert code == 2 and "give AGENT LABEL" in err
    code, _, err = colony("ls")
    assert code == 2 and "--colony" in err


def test_edit_history_show_version_and_rollback(colony: Colony, tmp_path: Path) -> None:
    (agent,) = names("editor")
    colony.ok("create", agent, "human", "--content", "v1 text")
    assert colony.ok("edit", agent, "human", "--append", "second line").startswith(
        f"human ({agent}): append -> v2, "
    )
    assert "put -> v3" in colony.ok("edit", agent, "human", "--text", "rewritten", "--message", "fresh")
    (tmp_path / "new.txt").write_text("from a file\nwith two lines")
    assert "put -> v4, 26/5000 characters" in colony.ok("edit", agent, "human", "--file", "new.txt")

    out = colony.ok("history", agent, "human")
    lines = out.splitlines()
    assert lines[0] == f"human ({agent}): head v4, viewable from v1"
    assert [line.split()[0] for line in lines[1:]] == ["v1", "v2", "v3", "v4"]
    assert all(line.split()[3] == agent for line in lines[1:])
    assert [line.split()[5] for line in lines[1:]] == ["create", "append", "put", "put"]
    assert lines[3].endswith("  fresh")
    history = colony.json("history", agent, "human", "--limit", "2")
    assert [v["version"] for v in history["versions"]] == [3, 4]

    assert colony.ok("show", agent, "human", "--version", "1") == (
        f"human ({agent}, working) 7/5000 v1 (a past version)\nv1 text\n"
    )
    assert colony.ok("show", agent, "human").startswith(f"human ({agent}, working) 26/5000 v4\n")

    assert "rollback -> v5, 7/5000" in colony.ok("rollback", agent, "human", "1")
    assert colony.ok("show", agent, "human").endswith("\nv1 text\n")
    assert len(colony.json("history", agent, "human")["versions"]) == 5

    # a stale base version is refused (409) and changes nothing; the current one goes through
    code, _, err = colony("edit", agent, "human", "--append", "late", "--base-version", "2")
    assert code == 1 and "HTTP 409 version_conflict" in err and "version 5" in err
    assert "append -> v6" in colony.ok("edit", agent, "human", "--append", "on time", "--base-version", "5")
    code, _, err = colony("rollback", agent, "human", "one")
    assert code == 2 and "VERSION must be a number" in err
    code, _, err = colony("edit", agent, "human", "--file", "absent.txt")
    assert code == 2 and "absent.txt" in err


def test_share_access_undo_and_unshare(colony: Colony) -> None:
    owner, reader, peer = names("owner", "reader", "peer")
    colony.ok("create", owner, "plan", "--content", "step one")
    out = colony.ok("share", owner, "plan", reader, "--access", "read_only")
    assert out == f"shared {owner}'s block plan with {reader} (read_only)\n"
    colony.ok("share", owner, "plan", peer, "--access", "read_write")

    assert colony.ok("show", reader, "plan") == f"plan ({owner}, working) 8/5000 v1\nstep one\n"
    row = next(line.split() for line in colony.ok("ls", reader).splitlines() if line.startswith("plan "))
    assert row[:5] == ["plan", owner, "working", "8/5000", "read_only"]
    code, _, err = colony("edit", reader, "plan", "--append", "mine")
    assert code == 1 and "HTTP 403 forbidden" in err and "read-only" in err
    assert len(colony.json("history", owner, "plan")["versions"]) == 1

    # undo keeps the other agent's edit
    colony.ok("edit", owner, "plan", "--append", "owner line")
    colony.ok("edit", peer, "plan", "--append", "peer line")
    assert "undo -> v4" in colony.ok("undo", owner, "plan")
    content = colony.json("show", owner, "plan")["content"]
    assert content.startswith("step one") and "peer line" in content and "owner line" not in content
    code, _, err = colony("undo", owner, "plan")
    assert code == 1 and "HTTP 422" in err and "undo" in err

    assert colony.ok("unshare", owner, "plan", reader) == f"{reader} no longer sees {owner}'s block plan\n"
    code, _, err = colony("show", reader, "plan")
    assert code == 1 and "HTTP 404 not_found" in err
    code, _, err = colony("show", reader, "plan", "--owner", owner)
    assert code == 1 and "HTTP 403 forbidden" in err
    assert colony.json("unshare", owner, "plan", reader) == {"removed": False}


def test_colony_blocks(colony: Colony) -> None:
    (agent,) = names("member")
    label = f"rules_{uuid.uuid4().hex[:6]}"
    out = colony.ok("create", "--colony", label, "--access", "append_only", "--content", "be kind")
    assert out == f"created {label} (_colony, working), limit 5000 characters\n"
    row = next(line.split() for line in colony.ok("ls", "--colony").splitlines() if line.startswith(label))
    assert row[:6] == [label, "_colony", "working", "7/5000", "append_only", "colony"]
    row = next(line.split() for line in colony.ok("ls", agent).splitlines() if line.startswith(label))
    assert row[4:6] == ["append_only", "colony"]

    colony.ok("edit", agent, label, "--append", "share tools")  # the agent's colony access: append
    colony.ok("edit", "--colony", label, "--append", "rest")
    view = colony.json("show", "--colony", label)
    header, *content = colony.ok("show", "--colony", label).splitlines()
    assert header == f"{label} (_colony, working) {view['chars']}/5000 v3"
    assert content == ["be kind", "share tools", "rest"] == view["content"].splitlines()
    authors = [v["author"] for v in colony.json("history", "--colony", label)["versions"]]
    assert authors == ["_operator", agent, "_operator"]
    assert "rollback -> v4" in colony.ok("rollback", "--colony", label, "1")
    assert colony.json("show", agent, label)["content"] == "be kind\n"
    code, _, err = colony("create", agent, "extra", "--access", "read_only")
    assert code == 2 and "--colony" in err


def test_edit_in_the_editor(colony: Colony, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (agent,) = names("typist")
    colony.ok("create", agent, "draft", "--content", "first draft")
    # not a terminal (as here): refused, with what to do instead
    monkeypatch.setenv("EDITOR", "true")
    code, _, err = colony("edit", agent, "draft")
    assert code == 2 and "--text" in err and "$EDITOR" in err

    monkeypatch.setattr(cli_blocks, "_interactive", lambda: True)
    assert colony.ok("edit", agent, "draft") == "draft: no change\n"  # `true` leaves the file as it was
    script = tmp_path / "editor.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\np = Path(sys.argv[1])\n"
        "p.write_text(p.read_text().replace('first', 'second') + '\\nedited')\n"
    )
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    assert "put -> v2" in colony.ok("edit", agent, "draft")
    assert colony.json("show", agent, "draft")["content"] == "second draft\n\nedited\n"
    monkeypatch.setenv("EDITOR", "false")
    code, _, err = colony("edit", agent, "draft")
    assert code == 2 and "editor exited with status 1" in err
    assert len(colony.json("history", agent, "draft")["versions"]) == 2


def test_server_text_cannot_drive_the_terminal(colony: Colony) -> None:
    (agent,) = names("sly")
    colony.ok(
        "create",
        agent,
        "evil",
        "--content",
        "a\x1b[2J\x1b]0;title\x07b\nline two",
        "--description",
        "d\x1b[1m",
    )
    out = colony.ok("show", agent, "evil")
    assert "\x1b" not in out and "\x07" not in out and out.endswith("line two\n")
    out = colony.ok("ls", agent)
    assert "\x1b" not in out
