"""Issue 12, item 1: the embedded redis-server is supervised. SIGKILL it and it comes back on the
same port, with the same password and data (AOF replayed; `appendfsync always` by default, so a
write acknowledged before the kill is there), the restart counted where `colony status` reads it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis
from cli_kit import run_cli

from colony.blackboard.redis_server import (
    EmbeddedRedis,
    RedisRestarts,
    RedisSupervisor,
    free_port,
    process_alive,
)
from colony.client import ApiError, ColonyClient
from colony.config import ColonySettings, EmbeddedRedisSettings
from colony.serve.cluster import read_state


def _wait(predicate, timeout: float, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert _wait(lambda: not process_alive(pid), 5)


def test_the_default_is_appendfsync_always(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    client = redis.Redis.from_url(info.url)
    try:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        client.close()


def test_a_killed_server_is_restarted_on_its_port_with_its_data(tmp_path: Path) -> None:
    settings = EmbeddedRedisSettings(supervise_interval_seconds=0.1, restart_backoff_seconds=0.2)
    server = EmbeddedRedis(tmp_path / "data", settings)
    info = server.start()
    supervisor = RedisSupervisor(server).start()
    try:
        client = redis.Redis.from_url(info.url, socket_timeout=2)
        client.set("accepted-run", "r-1")  # acknowledged: fsynced before the reply
        client.close()
        pids = [info.pid]
        for restart in (1, 2):  # twice: the second one waits its backoff, then comes back too
            _kill(pids[-1])
            started = time.monotonic()
            assert _wait(lambda n=restart: RedisRestarts.read(server).restarts == n, 10)
            back = server.status()
            assert back is not None and back.pid != pids[-1]
            assert (back.port, back.password) == (info.port, info.password)
            pids.append(back.pid)
            client = redis.Redis.from_url(info.url, socket_timeout=2)  # the address clients know
            assert client.get("accepted-run") == b"r-1"
            client.close()
            assert time.monotonic() - started < 10
        record = RedisRestarts.read(server)
        assert record.last_pid == pids[-1] and record.last_restart_at and record.last_error is None
    finally:
        supervisor.stop()
        server.stop()


def test_restarts_back_off_and_a_stopped_server_stays_down(tmp_path: Path) -> None:
    settings = EmbeddedRedisSettings(restart_backoff_seconds=3.0, restart_backoff_max_seconds=60.0)
    server = EmbeddedRedis(tmp_path / "data", settings)
    info = server.start()
    supervisor = RedisSupervisor(server)  # driven round by round
    try:
        assert supervisor.check() is False  # alive: nothing to do
        _kill(info.pid)
        assert supervisor.check() is True  # the first restart is at once
        second = server.status()
        assert second is not None and second.port == info.port
        _kill(second.pid)
        assert supervisor.check() is False  # a restart right after one waits its backoff
        assert server.status() is None
        assert _wait(supervisor.check, 8, step=0.2)
        assert RedisRestarts.read(server).restarts == 2
        server.stop()  # on purpose (`colony redis stop`): left down
        assert supervisor.check() is False and server.status() is None
        assert RedisRestarts.read(server).restarts == 2
    finally:
        server.stop()


def test_a_failed_restart_is_recorded_and_retried(tmp_path: Path) -> None:
    port = free_port()
    settings = EmbeddedRedisSettings(port=port, restart_backoff_seconds=0.2)
    server = EmbeddedRedis(tmp_path / "data", settings)
    info = server.start()
    supervisor = RedisSupervisor(server)
    _kill(info.pid)
    # another process takes the port while the server is down
    squatter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); "
            "s.listen(); time.sleep(60)",
        ]
    )
    try:
        time.sleep(0.5)
        assert supervisor.check() is False
        failed = RedisRestarts.read(server)
        assert failed.restarts == 0 and failed.last_error  # why, for `colony status`
        squatter.kill()
        squatter.wait()
        assert _wait(supervisor.check, 10, step=0.2)
        assert RedisRestarts.read(server).restarts == 1
        assert server.status() is not None and server.status().port == port  # type: ignore[union-attr]
    finally:
        squatter.kill()
        server.stop()


def test_a_server_stopped_before_the_supervisor_starts_stays_down(tmp_path: Path) -> None:
    """A supervisor of a data dir whose server was stopped on purpose never starts one."""
    server = EmbeddedRedis(tmp_path / "data")
    server.start()
    server.stop()
    assert RedisSupervisor(server).check() is False and server.status() is None


def _stuck_report(client: ColonyClient, views: dict) -> str:  # type: ignore[type-arg]
    """What a failure needs to be understood: each unended run's view and stored events, and the
    warnings the cluster's Serve replicas logged."""
    lines = []
    for run_id, view in views.items():
        if view["status"] in ("succeeded", "failed", "cancelled"):
            continue
        lines.append(f"{run_id}: {view}")
        stream = client._api.http.stream("GET", f"/v1/runs/{run_id}/events", timeout=3)
        with contextlib.suppress(Exception), stream as events:
            until = time.monotonic() + 3
            for line in events.iter_lines():  # bounded in time: an unended run's stream stays open
                lines.append(line)
                if time.monotonic() > until:
                    break
    sessions = sorted(Path("/tmp/ray").glob("session_2*"), key=lambda p: p.stat().st_mtime, reverse=True)
    cluster = next((s for s in sessions if any((s / "logs" / "serve").glob("replica_colony_*"))), None)
    for log_file in sorted(cluster.glob("logs/worker-*.err")) if cluster else []:
        with contextlib.suppress(OSError):  # Colony's own lines (Ray's start with its level)
            text = [line for line in log_file.read_text().splitlines() if line and line[0] not in "I:"]
            if text:
                lines.append(f"{log_file.name}:\n" + "\n".join(text[-60:]))
    return "\n".join(lines)


def _environ(data_dir: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    environ.update(
        {
            "COLONY_DATA_DIR": str(data_dir),
            "COLONY_SERVE__NUM_CPUS": "2",
            "COLONY_SERVE__PORT": str(free_port()),
            "COLONY_EMBEDDED_REDIS__SUPERVISE_INTERVAL_SECONDS": "0.2",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    return environ


def _status(cwd: Path, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    return json.loads(run_cli("status", "--json", cwd=cwd, env=env, timeout=60).stdout)


def test_colony_up_restarts_a_killed_redis_and_status_shows_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = _environ(data_dir)
    started = time.monotonic()
    up = run_cli("up", cwd=tmp_path, env=env, timeout=180)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        before = _status(tmp_path, env)
        assert before["running"] and before["redis"]["restarts"] == 0
        assert before["redis"]["appendfsync"] == "always"
        pid, port = before["redis"]["pid"], EmbeddedRedis(data_dir).recorded().port  # type: ignore[union-attr]
        ran = run_cli("run", "echo", "--input", '{"n": 1}', cwd=tmp_path, env=env, timeout=60)
        assert ran.returncode == 0 and json.loads(ran.stdout) == {"n": 1}, ran.stderr[-2000:]

        info = read_state(ColonySettings(data_dir=data_dir))
        assert info is not None
        with ColonyClient(info.url, info.token, timeout=30) as client:
            accepted = [client.submit("echo", {"k": n})["run_id"] for n in range(10)]
        os.kill(pid, signal.SIGKILL)  # right after the 202s: some of the runs are still in flight
        killed = time.monotonic()
        assert _wait(lambda: _status(tmp_path, env)["redis"]["restarts"] == 1, 20, step=0.5)
        after = _status(tmp_path, env)["redis"]
        assert after["running"] and after["pid"] != pid
        assert EmbeddedRedis(data_dir).recorded().port == port  # type: ignore[union-attr]
        assert time.monotonic() - killed < 20
        text = run_cli("status", cwd=tmp_path, env=env, timeout=60).stdout
        assert "restarted 1 time(s)" in text
        redis_status = run_cli("redis", "status", cwd=tmp_path, env=env, timeout=60)
        assert redis_status.returncode == 0 and "restarted 1 time(s) by the supervisor" in redis_status.stdout
        assert "embedded redis-server restarted (restart 1)" in (data_dir / "cluster.log").read_text()

        # appendfsync always: every accepted run is still there after the restart (none lost)
        with ColonyClient(info.url, info.token, timeout=30) as client:
            views = {}

            def all_readable() -> bool:
                for run_id in accepted:
                    if run_id not in views:
                        try:
                            views[run_id] = client.get(run_id)
                        except (ApiError, httpx.HTTPError):
                            return False
                return True

            assert _wait(all_readable, 30, step=0.5), "accepted runs are missing after the restart"

            # ... and none is stuck: each ends, succeeded or failed with its reason (one caught by the
            # outage mid-way fails with "blackboard unavailable"), none stays queued or running
            def all_ended() -> bool:
                for run_id in accepted:
                    if views[run_id]["status"] not in ("succeeded", "failed", "cancelled"):
                        with contextlib.suppress(ApiError, httpx.HTTPError):
                            views[run_id] = client.get(run_id)
                return all(v["status"] in ("succeeded", "failed", "cancelled") for v in views.values())

            assert _wait(all_ended, 30, step=0.5), _stuck_report(client, views)
            assert all(v["status"] == "succeeded" or v.get("error") for v in views.values())
            print("after restart:", [(v["status"], v.get("error")) for v in views.values()])

        # the rest of the cluster reconnects to the address it knows: a new echo run succeeds
        ran = run_cli("run", "echo", "--input", '{"n": 2}', cwd=tmp_path, env=env, timeout=60)
        assert ran.returncode == 0 and json.loads(ran.stdout) == {"n": 2}, ran.stderr[-2000:]
        # and `colony doctor`, given the accepted runs, finds the colony consistent (exit 0)
        doctor = run_cli(
            "doctor",
            *[a for r in accepted for a in ("--run", r)],
            cwd=tmp_path,
            env=env,
            timeout=60,
        )
        assert doctor.returncode == 0 and "clean" in doctor.stdout, doctor.stdout + doctor.stderr
    finally:
        down = run_cli("down", cwd=tmp_path, env=env, timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        assert EmbeddedRedis(data_dir).status() is None
    print(f"took {time.monotonic() - started:.1f}s")


def test_a_cluster_waiting_for_redis_is_running_degraded(tmp_path: Path) -> None:
    """While Redis is away the API answers /healthz 503 `degraded`: the cluster still counts as
    running (a second `colony up` reuses it instead of replacing it) and `status` says why."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    from colony.serve import cluster

    answer = {"code": 503, "body": {"status": "degraded", "reason": "redis unavailable"}}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = json.dumps(answer["body"]).encode()
            self.send_response(int(answer["code"]))  # type: ignore[call-overload]
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    Thread(target=server.serve_forever, daemon=True).start()
    # the recorded daemon: a process carrying the record's id, as the daemon's processes do
    daemon = subprocess.Popen(["sleep", "600"], env={**os.environ, cluster.DAEMON_ID_VARIABLE: "d-chaos"})
    try:
        settings = ColonySettings(data_dir=tmp_path)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        record = cluster.ClusterInfo(daemon.pid, url, "t", "", time.time(), 1, daemon_id="d-chaos")
        cluster.state_file(settings).write_text(json.dumps(record.__dict__))
        assert cluster.status(settings) == record
        assert cluster.health(record) == {"status": "degraded", "reason": "redis unavailable"}
        answer.update(code=200, body={"status": "ok", "version": "x"})
        assert cluster.status(settings) == record and cluster.health(record)["status"] == "ok"  # type: ignore[index]
        answer.update(code=500, body={"detail": "boom"})
        assert cluster.status(settings) is None and cluster.health(record) is None
    finally:
        server.shutdown()
        daemon.kill()
        daemon.wait()
