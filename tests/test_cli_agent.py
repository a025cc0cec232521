"""`colony agent checkpoints|undo|restore|export|import` against the API served over real HTTP
(the in-process control plane of tests/test_api_checkpoints.py) on a real redis-server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_api_checkpoints import TOKEN, ControlledApi
from test_context_checkpoints import STEPS

from colony.cli import main


@pytest.fixture
def served(redis_url: str) -> Iterator[ControlledApi]:
    with ControlledApi(redis_url) as served:
        yield served


def colony(served: ControlledApi, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--url", served.url, "--token", TOKEN])
    out, err = capsys.readouterr()
    return code, out, err


def test_agent_commands(served: ControlledApi, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    served.place("cli-ck", STEPS)
    served.run("cli-ck")

    code, out, _ = colony(served, capsys, "agent", "checkpoints", "cli-ck")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:5] == ["STEP", "RUN", "HTTP", "RUN", "AT"]
    assert [line.split()[0] for line in lines[1:]] == ["3", "4", "5", "6", "7"]
    assert "external" in lines[5] and lines[4].rstrip().endswith("-")
    code, out, _ = colony(served, capsys, "agent", "checkpoints", "cli-ck", "--json")
    assert [c["step"] for c in json.loads(out)] == [3, 4, 5, 6, 7]

    code, out, _ = colony(served, capsys, "agent", "undo", "cli-ck")
    assert code == 0 and "is back at step 6" in out and "discarded checkpoints: 7" in out
    assert "not undone (their effects stay):" in out and "step 7: notify (external)" in out
    assert "runs again (now): step(s) 7" in out  # the finished step that runs again, and when
    served.wait_done("cli-ck")

    code, out, _ = colony(served, capsys, "agent", "restore", "cli-ck", "5", "--replay", "--json")
    report = json.loads(out)
    assert code == 0 and report["mode"] == "replay" and report["discarded"] == [6, 7]
    assert [c["action"] for c in report["not_undone"]] == ["notify"]
    served.wait_done("cli-ck")

    code, _, err = colony(served, capsys, "agent", "restore", "cli-ck", "1")
    assert code == 1 and "404" in err and "kept steps" in err
    code, _, err = colony(served, capsys, "agent", "undo", "nobody")
    assert code == 1 and "404" in err

    code, out, _ = colony(served, capsys, "agent", "export", "cli-ck")
    assert code == 0
    document = json.loads(out)
    assert "cli-ck" in json.dumps(document)[:100_000]
    saved = tmp_path / "agent.json"
    saved.write_text(out)
    served.call(lambda: served.control.suspend("cli-ck"))
    code, out, err = colony(served, capsys, "agent", "import", str(saved), "--replace")
    assert code == 0, err
    assert out.startswith("imported agent cli-ck")

    (tmp_path / "bad.json").write_text("[1, 2]")
    assert (
        main(["agent", "import", str(tmp_path / "bad.json"), "--url", served.url, "--token", TOKEN]) == 2
    )  # refused before any call
    assert "holds no JSON object" in capsys.readouterr().err
