"""`colony memory map|query|write|reindex AGENT` against the real API (served by uvicorn over a real
Redis, an agent with working and short-term memory; see tests/test_api_memory.py), through
`colony.cli.main` with `--url`/`--token` or $COLONY_URL/$COLONY_API_TOKEN, as a user runs them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_memory import AGENT, OTHER, TOKEN, MemoryApp

from colony import cli
from colony.cli_memory import add_memory_commands


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryApp]:
    with MemoryApp(redis_server.url, tmp_path_factory.mktemp("memory-cli")) as app:
        yield app


@pytest.fixture(autouse=True)
def memory_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`colony memory` on the `colony` parser (added here while cli.py does not wire it itself), and
    no local cluster, config file or token of this machine in play."""
    build = cli.build_parser

    def with_memory() -> argparse.ArgumentParser:
        parser = build()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if "memory" not in sub.choices:
            add_memory_commands(sub)
        return parser

    monkeypatch.setattr(cli, "build_parser", with_memory)
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def colony(capsys: pytest.CaptureFixture[str], served: MemoryApp, *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv, "--url", served.url, "--token", TOKEN])
    out, err = capsys.readouterr()
    return code, out, err


def test_map_shows_a_table_and_json(served: MemoryApp, capsys: pytest.CaptureFixture[str]) -> None:
    served.wait_for(
        lambda: colony(capsys, served, "memory", "map", AGENT, "--json")[1].count("scope_type") == 2
    )
    code, out, err = colony(capsys, served, "memory", "map", AGENT)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"agent {AGENT}: 2 scope(s),")
    header = next(line for line in lines if "ENTRIES/CAP" in line)
    assert header.split() == ["SCOPE", "ENTRIES/CAP", "TTL", "PENDING", "TAGS"]
    cap = served.settings.memory.default_max_entries
    rows = {
        line.split()[0]: line.split()
        for line in lines
        if line.startswith("  working") or line.startswith("  stm")
    }
    assert rows["working"][1].endswith(f"/{cap}") and rows["stm"][1].endswith(f"/{cap}")
    assert "  dataflow: working -> stm" in lines
    assert f"    working: {served.scope(AGENT, 'working')}" in lines
    code, out, _ = colony(capsys, served, "memory", "map", AGENT, "--json")
    assert code == 0 and set(json.loads(out)["scopes"]) == {
        served.scope(AGENT, "working"),
        served.scope(AGENT, "stm"),
    }
    code, out, _ = colony(capsys, served, "memory", "map", "echo")
    assert code == 0 and "no memory" in out


def test_write_query_and_reindex(served: MemoryApp, capsys: pytest.CaptureFixture[str]) -> None:
    fact = "The backup job runs at 03:00 from the db-replica host."
    code, out, err = colony(
        capsys, served, "memory", "write", AGENT, fact, "--scope", "working", "--tag", "ops"
    )
    assert code == 0, err
    assert out.startswith("stored ") and served.scope(AGENT, "working") in out
    code, out, _ = colony(capsys, served, "memory", "write", AGENT, fact, "--scope", "working")
    assert code == 0 and out.startswith("already held as ")
    colony(capsys, served, "memory", "write", AGENT, "Lunch is served at noon.", "--scope", "working")
    # a stored text cannot drive the terminal: control characters are not printed back
    colony(
        capsys, served, "memory", "write", AGENT, "evil \x1b[2J\x1b]0;title\x07 note", "--scope", "working"
    )

    code, out, err = colony(
        capsys,
        served,
        "memory",
        "query",
        AGENT,
        "when are database backups taken?",
        "-n",
        "2",
        "--scope",
        "working",
    )
    assert code == 0, err
    first = out.splitlines()[:2]
    assert first[0].startswith("1. [") and " working " in first[0] and "tags: ops" in first[0]
    assert first[1].strip() == fact
    code, out, _ = colony(capsys, served, "memory", "query", AGENT, "note", "--json", "--tag", "ops")
    assert code == 0 and [e["entry"]["content"] for e in json.loads(out)] == [fact]
    code, out, _ = colony(capsys, served, "memory", "query", AGENT, "evil note", "--scope", "working")
    assert code == 0 and "evil" in out and "\x1b" not in out and "\x07" not in out
    code, out, _ = colony(
        capsys,
        served,
        "memory",
        "query",
        AGENT,
        "database backups",
        "--min-relevance",
        "0.99",
        "--scope",
        "stm",
    )
    assert code == 0 and out == "no entries\n"

    served.wait_for(
        lambda: (
            json.loads(colony(capsys, served, "memory", "map", AGENT, "--json")[1])["total_pending_ingestion"]
            == 0
        )
    )
    counts = {
        info["scope_id"]: info["entry_count"]
        for info in json.loads(colony(capsys, served, "memory", "map", AGENT, "--json")[1])["scopes"].values()
    }
    code, out, err = colony(capsys, served, "memory", "reindex", AGENT)
    assert code == 0, err
    assert sorted(out.splitlines()) == sorted(f"{scope}: {n} entries" for scope, n in counts.items())


def test_errors_say_what_to_do(
    served: MemoryApp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = colony(capsys, served, "memory", "map", "nobody")
    assert code == 2 and "no agent named 'nobody'" in err
    code, _, err = colony(
        capsys, served, "memory", "write", AGENT, "x", "--scope", served.scope(OTHER, "working")
    )
    assert code == 2 and "has no memory scope" in err
    code, _, err = colony(capsys, served, "memory", "write", AGENT, "x", "--scope", "working", "--tag", "a b")
    assert code == 2 and "tags" in err
    code = cli.main(["memory", "map", AGENT, "--url", served.url, "--token", "wrong"])
    err = capsys.readouterr().err
    assert code == 2 and "the token given was refused" in err and "--token" in err
    # the environment instead of the options (keeps the token off the process list)
    monkeypatch.setenv("COLONY_URL", served.url)
    monkeypatch.setenv("COLONY_API_TOKEN", TOKEN)
    assert cli.main(["memory", "map", AGENT, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["agent_id"] == AGENT
    monkeypatch.delenv("COLONY_URL")
    code = cli.main(["memory", "map", AGENT])
    assert code == 2 and "Colony is not running here" in capsys.readouterr().err
