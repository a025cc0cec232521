"""benchmarks/affinity_e2e.py end to end on a tiny trace (the CI smoke test the issue asks for):
the script as a user runs it, a fresh `colony up` per variant, the embedded model, page-bound
sessions opened over HTTP; and a trace file it must refuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "affinity_e2e.py"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
KEYS = {"prefill_tokens", "prompt_tokens", "cached_ratio", "ttft_p50_s", "ttft_p99_s", "runs", "failed"}


def folder(tmp_path: Path) -> Path:
    root = tmp_path / "mapped"
    root.mkdir()
    for n in range(3):
        lines = [f"def helper_{n}_{k}(x):\n    return x * {k} + {n}" for k in range(25)]
        (root / f"mod{n}.py").write_text("\n".join(lines) + "\n")
    return root


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_") or k == "COLONY_SECRET"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=840
    )


def test_affinity_e2e_runs_a_tiny_trace_through_colony_and_rays_router(tmp_path: Path) -> None:
    root = folder(tmp_path)
    trace = tmp_path / "tiny.jsonl"
    lines = [
        {"at": 0, "agent": "a", "page": "mod0.py", "question": "What does helper_0_3 return?"},
        {"at": 0, "agent": "b", "page": "mod1.py", "question": "What does helper_1_4 return?"},
        {"at": 0.5, "agent": "a", "page": "mod0.py", "question": "And helper_0_5?"},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.json"
    done = run(
        "--map", str(root), "--trace", str(trace), "--json", str(out),
        "--variants", "ray-prefix", "colony", "--replicas", "1", "--slots", "2", "--reply-tokens", "4",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"ray-prefix", "colony"}
    for name, figures in result["variants"].items():
        assert set(figures) >= KEYS, name
        assert figures["runs"] == 3 and figures["failed"] == 0, (name, figures, done.stderr[-3000:])
        # every turn reached an engine: the page (~200 tokens) and the question at least
        assert figures["prompt_tokens"] > 3 * 150 and figures["prefill_tokens"] > 0, (name, figures)
        assert figures["ttft_p50_s"] > 0
    # the second turn of `a` found its page cached in Colony's page slot: less than all prefilled
    colony = result["variants"]["colony"]
    assert colony["prefill_tokens"] < colony["prompt_tokens"] + 2 * 250
    assert result["offline_optimum"]["belady_page_loads"] == 2
    assert "colony vs ray-prefix" in done.stdout


def test_affinity_e2e_refuses_a_trace_that_leaves_the_folder_or_switches_pages(tmp_path: Path) -> None:
    root = folder(tmp_path)
    for bad, says in (
        ({"at": 0, "agent": "a", "page": "../../etc/passwd", "question": "q"}, "relative path"),
        ({"at": -1, "agent": "a", "page": "mod0.py", "question": "q"}, "at"),
        ({"agent": "a", "page": "mod0.py"}, "not a trace line"),
    ):
        trace = tmp_path / "bad.jsonl"
        trace.write_text(json.dumps(bad) + "\n")
        done = run("--map", str(root), "--trace", str(trace), "--json", str(tmp_path / "o"), cwd=tmp_path)
        assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]
    switching = [
        {"at": 0, "agent": "a", "page": "mod0.py", "question": "q"},
        {"at": 1, "agent": "a", "page": "mod1.py", "question": "q"},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in switching))
    done = run("--map", str(root), "--trace", str(trace), "--json", str(tmp_path / "o.json"), cwd=tmp_path)
    assert done.returncode != 0 and "keeps one page" in done.stderr
