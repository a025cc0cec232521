"""`colony up | status | down`: a local Ray cluster running the Serve app, owned by one daemon process.

The daemon (`python -m colony.serve.cluster`) calls `ray.init()` (so the Ray processes are its
own), deploys the app, waits until the built-in agents answer, records `cluster.json` under
`data_dir`, and on SIGTERM shuts Serve and Ray down. `up` is idempotent: a healthy recorded
cluster is reused. `down` stops the daemon (and so Ray) and the embedded Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from colony.blackboard.redis_server import EmbeddedRedis, process_alive
from colony.config import ColonySettings, load_settings
from colony.errors import ClusterError

log = logging.getLogger(__name__)


@dataclass
class ClusterInfo:
    pid: int
    url: str
    token: str
    redis_url: str
    started_at: float
    replicas: int


def state_file(settings: ColonySettings) -> Path:
    return settings.data_dir / "cluster.json"


def read_state(settings: ColonySettings) -> ClusterInfo | None:
    try:
        return ClusterInfo(**json.loads(state_file(settings).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _healthy(info: ClusterInfo) -> bool:
    try:
        return httpx.get(f"{info.url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def status(settings: ColonySettings) -> ClusterInfo | None:
    info = read_state(settings)
    if info is None or not process_alive(info.pid) or not _healthy(info):
        return None
    return info


def up(settings: ColonySettings, config: str | None = None, *, echo: bool = True) -> ClusterInfo:
    """Start (or reuse) the local cluster; returns where it answers."""
    running = status(settings)
    if running is not None:
        return running
    stale = read_state(settings)
    if stale is not None and process_alive(stale.pid):
        _stop_daemon(stale.pid)
    state_file(settings).unlink(missing_ok=True)
    redis_url = settings.redis_url or EmbeddedRedis(settings.data_dir, settings.embedded_redis).start().url
    token = settings.api_token.get_secret_value() if settings.api_token else secrets.token_urlsafe(24)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "COLONY_REDIS_URL": redis_url,
        "COLONY_API_TOKEN": token,
        "COLONY_DATA_DIR": str(settings.data_dir),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    command = [sys.executable, "-m", "colony.serve.cluster"] + (["--config", config] if config else [])
    log_path = settings.data_dir / "cluster.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + settings.serve.start_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(f"the cluster daemon exited with code {process.returncode}; see {log_path}")
        info = read_state(settings)
        if info is not None and info.pid == process.pid:
            return info
        time.sleep(0.5)
    _stop_daemon(process.pid)
    raise ClusterError(
        f"the cluster was not ready within {settings.serve.start_timeout_seconds}s; see {log_path}"
    )


def down(settings: ColonySettings) -> bool:
    """Stop the daemon (Serve and Ray with it) and the embedded Redis; True if a cluster was running."""
    info = read_state(settings)
    stopped = False
    if info is not None and process_alive(info.pid):
        _stop_daemon(info.pid)
        stopped = True
    state_file(settings).unlink(missing_ok=True)
    if not settings.redis_url:
        EmbeddedRedis(settings.data_dir, settings.embedded_redis).stop()
    return stopped


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_daemon(pid: int, timeout: float = 60.0) -> None:
    """SIGTERM the daemon (it shuts Serve and Ray down), then clear its whole process group: Ray
    leaves a few helper processes behind, and they are in the daemon's group (it is a session leader)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.2)
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if not _group_alive(pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.1)


def _serve_forever(settings: ColonySettings) -> None:
    """Daemon body: own a local Ray cluster running the app until SIGTERM."""
    import ray
    from ray import serve

    from colony.serve.app import build_app

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    cfg = settings.serve
    ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False, namespace="colony")
    try:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        app = build_app({"replicas": cfg.replicas, "replica_cpus": cfg.replica_cpus}, settings=settings)
        serve.run(app, name="colony", route_prefix="/", blocking=False)
        url = f"http://{cfg.host}:{cfg.port}"
        token = settings.api_token.get_secret_value() if settings.api_token else ""
        _wait_ready(url, token, settings.serve.start_timeout_seconds)
        info = ClusterInfo(
            pid=os.getpid(),
            url=url,
            token=token,
            redis_url=settings.redis_url or "",
            started_at=time.time(),
            replicas=cfg.replicas,
        )
        path = state_file(settings)
        path.write_text(json.dumps(asdict(info)))
        path.chmod(0o600)
        while not stopping:
            time.sleep(0.5)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def _wait_ready(url: str, token: str, timeout: float) -> None:
    """Until the API answers and the built-in agents are registered."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            agents = httpx.get(f"{url}/v1/agents", headers=headers, timeout=30).json()
            if isinstance(agents, list) and {"echo", "ask"} <= {a.get("agent_id") for a in agents}:
                return
        time.sleep(0.5)
    raise ClusterError(f"the API at {url} did not become ready in {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description="Colony local cluster daemon (started by `colony up`).")
    parser.add_argument("--config")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _serve_forever(load_settings(args.config))


if __name__ == "__main__":
    main()
