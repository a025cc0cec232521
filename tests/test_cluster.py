"""The real thing: `colony up` (daemon owning a local Ray cluster with the Serve app on the embedded
model), runs over HTTP, an API replica killed mid-life, metrics, `colony down` leaving nothing."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from colony import cli
from colony.blackboard.redis_server import EmbeddedRedis, free_port
from colony.client import ApiError, ColonyClient
from colony.config import ColonySettings, ServeSettings, VcmSettings
from colony.serve import cluster


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def _pid_of(title: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if title in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return int(entry.name)
            except OSError:
                continue
    return None


@pytest.fixture(scope="module")
def colony_up(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("colony-up"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replica_cpus=0.5),
        vcm=VcmSettings(allowed_roots=[tmp_path_factory.getbasetemp()]),  # the folders tests map
    )
    info = cluster.up(settings)
    yield settings, info
    cluster.down(settings)


def test_up_is_idempotent_and_serves_runs(colony_up) -> None:
    settings, info = colony_up
    assert cluster.up(settings).pid == info.pid  # a second `up` reuses the running cluster
    with ColonyClient(info.url, info.token, timeout=120) as client:
        assert client.health()["status"] == "ok"
        echo = client.run("echo", {"ping": [1, 2, 3]})
        assert echo["status"] == "succeeded" and echo["output"] == {"ping": [1, 2, 3]}
        run_id = client.submit("ask", {"question": "What is the capital of France?"})["run_id"]
        events = list(client.events(run_id))
        tokens = "".join(e["data"]["text"] for e in events if e["event_type"] == "token")
        assert tokens.strip() and events[-1]["event_type"] == "completed"
        view = client.get(run_id)
        assert view["status"] == "succeeded" and view["output"] == tokens.strip()
        with pytest.raises(ApiError) as info_401:
            ColonyClient(info.url, "wrong").submit("echo", 1)
        assert info_401.value.status == 401
        metrics = httpx.get(f"{info.url}/metrics", headers={"Authorization": f"Bearer {info.token}"}).text
        assert 'colony_runs_submitted_total{agent="ask"}' in metrics
        assert 'colony_replica_inference_tokens_total{kind="completion"' in metrics
        assert "colony_replica_inference_ttft_seconds_total" in metrics
        pages = httpx.get(f"{info.url}/v1/vcm/pages", headers={"Authorization": f"Bearer {info.token}"})
        assert pages.status_code == 200 and isinstance(pages.json(), list)


def test_runs_survive_a_killed_api_replica(colony_up) -> None:
    _settings, info = colony_up
    with ColonyClient(info.url, info.token, timeout=120) as client:
        run_ids = [client.submit("echo", n)["run_id"] for n in range(5)]
        api_pid = _pid_of("ColonyAPI")
        assert api_pid is not None
        os.kill(api_pid, signal.SIGKILL)  # the API replica dies; Serve starts another
        deadline = time.monotonic() + 120
        views = None
        while time.monotonic() < deadline:
            try:
                views = [client.get(run_id) for run_id in run_ids]
                break
            except (httpx.HTTPError, ApiError):
                time.sleep(1)
        assert views is not None, "the API did not come back"
        assert _pid_of("ColonyAPI") not in (None, api_pid)
        assert [v["run_id"] for v in views] == run_ids
        for run_id in run_ids:
            for _event in client.events(run_id):
                pass
        assert [client.get(r)["output"] for r in run_ids] == [0, 1, 2, 3, 4]


def test_analyze_a_folder_with_the_embedded_model(
    colony_up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's main job: `colony run analyze --map PATH` on the embedded model."""
    settings, _info = colony_up
    (tmp_path / "stack.py").write_text(
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
        "    def push(self, item):\n        self.items.append(item)\n\n"
        "    def pop(self):\n        return self.items.pop()\n" * 3
    )
    (tmp_path / "greet.py").write_text(
        "def greet(name):\n    return f'Hello, {name}!'\n\n\nprint(greet('world'))\n" * 4
    )
    monkeypatch.setenv("COLONY_DATA_DIR", str(settings.data_dir))
    started = time.monotonic()
    code = cli.main(["run", "analyze", "--map", str(tmp_path), "--page-tokens", "256", "--timeout", "600"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "stack.py" in out and "greet.py" in out and out.startswith("# Analysis of")
    assert "page workers started" in err
    print(f"analyze took {time.monotonic() - started:.1f} s", file=sys.stderr)


def test_down_leaves_nothing_running(colony_up) -> None:
    settings, info = colony_up
    assert _group_pids(info.pid)
    assert cluster.down(settings) is True
    assert _group_pids(info.pid) == []
    assert cluster.status(settings) is None
    assert EmbeddedRedis(settings.data_dir).status() is None


def test_a_dead_daemons_leftover_processes_are_reaped(tmp_path: Path) -> None:
    """`up` after the daemon was SIGKILLed stops what is left of its Ray cluster (processes of its
    session carrying its id), and only those: a process of another session, or of a session whose
    leader got the dead daemon's pid since (no id in its environment), is left alone."""
    import subprocess

    from colony.blackboard.redis_server import process_alive
    from colony.serve.cluster import DAEMON_ID_VARIABLE, reap_session

    script = (
        "import os, subprocess, sys, time\n"
        "os.setsid()\n"  # a session leader, as the daemon is
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'ray::Fake'])\n"
        "print(os.getpid(), child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script, "colony-daemon"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, DAEMON_ID_VARIABLE: "d1"},
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ray::Other"])
    # a session leader the OS could have given the dead daemon's pid: `ray` in its command line
    reused = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "ray::Reused"], start_new_session=True
    )
    try:
        assert leader.stdout is not None
        sid, child = (int(x) for x in leader.stdout.readline().split())
        os.kill(sid, signal.SIGKILL)  # the daemon dies; its child lives on
        leader.wait()
        assert process_alive(child)
        assert reap_session(reused.pid, "d1") == 0 and process_alive(reused.pid)
        assert reap_session(sid, "") == 0 and process_alive(child)  # a record without an id: nothing
        assert reap_session(sid, "d1") == 1
        assert not process_alive(child) and process_alive(stranger.pid)
    finally:
        for process in (stranger, reused):
            process.kill()
            process.wait()
