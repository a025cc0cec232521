"""The `colony` command end to end, and the metrics the blackboard exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from colony.blackboard import Blackboard
from colony.errors import ConcurrentModificationError


def _colony(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    environ.update({"COLONY_DATA_DIR": str(data_dir), **env})
    return subprocess.run(
        [sys.executable, "-m", "colony.cli", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def test_cli_redis_lifecycle_and_blackboard(tmp_path: Path) -> None:
    data = tmp_path / "colony"
    assert "colony " in _colony("version", data_dir=data).stdout
    assert _colony("redis", "status", data_dir=data).returncode == 1
    started = _colony("redis", "start", data_dir=data)
    assert started.returncode == 0, started.stderr
    try:
        assert "running" in _colony("redis", "status", data_dir=data).stdout
        wrote = _colony("bb", "write", "greeting", '{"text": "hi"}', "--tag", "demo", data_dir=data)
        assert wrote.returncode == 0, wrote.stderr
        read = json.loads(_colony("bb", "read", "greeting", data_dir=data).stdout)
        assert read["value"] == {"text": "hi"} and read["tags"] == ["demo"] and read["version"] == 1
        listed = _colony("bb", "query", "--tag", "demo", data_dir=data).stdout.splitlines()
        assert [json.loads(line)["key"] for line in listed] == ["greeting"]
        watched = _colony("bb", "watch", "--from-id", "0", "--count", "1", data_dir=data).stdout
        assert json.loads(watched)["key"] == "greeting"
        missing = _colony("bb", "read", "nothing", data_dir=data)
        assert missing.returncode == 1 and "not found" in missing.stderr
        demo = _colony("demo", data_dir=data)
        assert demo.returncode == 0, demo.stderr
        assert "counter=1000" in demo.stdout
    finally:
        assert "stopped" in _colony("redis", "stop", data_dir=data).stdout
    gone = _colony("bb", "read", "greeting", data_dir=data)
    assert gone.returncode == 2 and "colony redis start" in gone.stderr


def test_cli_reports_bad_config_without_traceback(tmp_path: Path) -> None:
    result = _colony("redis", "status", data_dir=tmp_path, COLONY_BLACKBOARD__EVENTS_MAXLEN="1")
    assert result.returncode == 2
    assert "blackboard.events_maxlen" in result.stderr and "Traceback" not in result.stderr


def test_cli_names_the_closest_setting_of_a_misspelt_env_var(tmp_path: Path) -> None:
    result = _colony("redis", "status", data_dir=tmp_path, COLONY_SERVE__REPLCAS="3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "COLONY_SERVE__REPLCAS: matches no setting; did you mean COLONY_SERVE__REPLICAS?" in result.stderr


async def test_blackboard_metrics_are_exported(bb: Blackboard) -> None:
    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    writes, conflicts = (
        value("colony_blackboard_ops_total", op="write"),
        value("colony_blackboard_conflicts_total"),
    )
    await bb.write("m", 1)
    with pytest.raises(ConcurrentModificationError):
        await bb.write("m", 2, expected_version=7)
    assert value("colony_blackboard_ops_total", op="write") == writes + 2
    assert value("colony_blackboard_conflicts_total") == conflicts + 1
    sub = await bb.subscribe().start()
    await bb.write("n", 1)
    await sub.next(timeout=2)
    text = generate_latest().decode()
    assert "colony_blackboard_event_lag_seconds_bucket" in text
    assert "colony_blackboard_op_seconds_bucket" in text
