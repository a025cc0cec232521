"""`colony token create|ls|revoke` and `colony audit` against a served API (issue 39): the token
printed once works with its verbs, `--json` prints its id, token, tenant and verbs, a revoked one
is refused, another tenant is refused with a reason, and the audit lists the calls made."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api_memory import TOKEN, MemoryApp

from colony import cli


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryApp]:
    with MemoryApp(redis_server.url, tmp_path_factory.mktemp("access-cli")) as app:
        yield app


@pytest.fixture(autouse=True)
def no_local_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def colony(
    capsys: pytest.CaptureFixture[str], served: MemoryApp, *argv: str, token: str = TOKEN
) -> tuple[int, str, str]:
    code = cli.main([*argv, "--url", served.url, "--token", token])
    out, err = capsys.readouterr()
    return code, out, err


def test_tokens_made_listed_used_and_revoked(served: MemoryApp, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = colony(
        capsys, served, "token", "create", "--verbs", "read,run", "--ttl", "600", "--json"
    )
    assert code == 0, err
    made = json.loads(out)
    assert {"id", "token", "tenant", "verbs"} <= set(made) and made["verbs"] == ["read", "run"]
    assert made["tenant"] == "default" and made["token"].startswith("ct-")
    code, out, err = colony(capsys, served, "token", "create", "--verbs", "read", "--agents", "echo,ask")
    assert code == 0 and "shown once" in err
    lines = out.splitlines()
    assert (
        lines[0].endswith("verbs read") and lines[1] == "  agents: ask, echo" and lines[-1].startswith("ct-")
    )
    code, out, _ = colony(capsys, served, "token", "ls")
    assert code == 0 and made["id"] in out and "every agent" in out and "ask, echo" in out
    answer = httpx.get(f"{served.url}/v1/agents", headers={"Authorization": f"Bearer {made['token']}"})
    assert answer.status_code == 200
    # the new token is no admin: it may not list tokens
    code, _, err = colony(capsys, served, "token", "ls", token=made["token"])
    assert code != 0 and "403" in err and "may not admin" in err
    code, out, _ = colony(capsys, served, "token", "revoke", made["id"])
    assert code == 0 and made["id"] in out
    time.sleep(1.1)
    answer = httpx.get(f"{served.url}/v1/agents", headers={"Authorization": f"Bearer {made['token']}"})
    assert answer.status_code == 401
    code, _, err = colony(capsys, served, "token", "revoke", made["id"])
    assert code != 0 and "404" in err
    code, _, err = colony(capsys, served, "token", "create", "--verbs", "read", "--tenant", "Team B")
    assert code != 0 and "422" in err and "tenant" in err
    # another tenant's token, made by the operator, listed under its tenant only
    code, out, _ = colony(
        capsys, served, "token", "create", "--verbs", "read", "--tenant", "team-b", "--json"
    )
    other = json.loads(out)
    assert code == 0 and other["tenant"] == "team-b"
    code, out, _ = colony(capsys, served, "token", "ls", "--tenant", "team-b", "--json")
    assert code == 0 and [t["id"] for t in json.loads(out)] == [other["id"]]
    code, out, _ = colony(capsys, served, "token", "ls", "--json")
    assert code == 0 and other["id"] not in out
    with pytest.raises(SystemExit):  # refused by the command line, before any call
        colony(capsys, served, "token", "create", "--verbs", "read,root")
    assert "verbs are some of" in capsys.readouterr().err


def test_the_audit_lists_the_calls_made(served: MemoryApp, capsys: pytest.CaptureFixture[str]) -> None:
    colony(capsys, served, "token", "create", "--verbs", "read", "--note", "audited")
    entries: list[dict[str, Any]] = []
    for _ in range(50):
        code, out, _ = colony(capsys, served, "audit", "--json", "--limit", "5")
        entries = json.loads(out)["entries"]
        if entries and entries[0]["route"] == "/v1/tokens":
            break
        time.sleep(0.02)
    assert entries[0]["token"] == "api" and entries[0]["method"] == "POST" and entries[0]["status"] == 201
    code, out, _ = colony(capsys, served, "audit", "--limit", "1")
    assert code == 0 and " api  POST /v1/tokens  201" in out
