"""`colony up | status | down`: a local Ray cluster running the Serve app, owned by one daemon process.

The daemon (`python -m colony.serve.cluster`) calls `ray.init()` (so the Ray processes are its
own), deploys the app, waits until the built-in agents answer, records `cluster.json` under
`data_dir`, and on SIGTERM shuts Serve and Ray down. `up` is idempotent: a healthy recorded
cluster is reused. `down` stops the daemon (and so Ray), the embedded Redis and the embedded Chroma
server (the memory vector index, started beside Redis when `memory.chroma_url` is unset).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from colony import security
from colony.blackboard.redis_server import EmbeddedRedis, RedisRestarts, RedisSupervisor, process_alive
from colony.config import ColonySettings, load_settings
from colony.errors import ClusterError, ColonyError
from colony.file_lock import file_lock
from colony.memory.chroma_server import EmbeddedChroma
from colony.security import write_private_file
from colony.vcm.pages import default_roots_env
from colony.wire.token import TokenSource, ensure_token_file

log = logging.getLogger(__name__)


@dataclass
class ClusterInfo:
    pid: int
    url: str
    token: str
    redis_url: str
    started_at: float
    replicas: int
    daemon_id: str = ""  # in the environment of the daemon and every process of its Ray cluster
    # the Ray cluster's GCS address: a process that deploys a new Serve config to the running
    # cluster (an upgrade, the way KubeRay applies a changed serveConfigV2) connects here
    ray_address: str = ""


DAEMON_ID_VARIABLE = "_COLONY_DAEMON_ID"  # not COLONY_*: that prefix is the settings' own


def state_file(settings: ColonySettings) -> Path:
    return settings.data_dir / "cluster.json"


def read_state(settings: ColonySettings) -> ClusterInfo | None:
    try:
        return ClusterInfo(**json.loads(state_file(settings).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def health(info: ClusterInfo) -> dict[str, Any] | None:
    """The API's `/healthz` answer: `{"status": "ok"}`, or `{"status": "degraded", "reason": ...}`
    (HTTP 503, e.g. while Redis is away and being restarted); None when the API does not answer."""
    try:
        response = httpx.get(f"{info.url}/healthz", timeout=3)
        body = response.json() if response.content else {}
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict):
        body = {}
    if response.status_code == 200:
        return {"status": "ok", **body}
    if response.status_code == 503 and body.get("status") == "degraded":
        return body
    return None


def _healthy(info: ClusterInfo) -> bool:
    """The API answers, `ok` or `degraded`: a cluster waiting for Redis to come back is running
    (a second `up` must reuse it, not replace it)."""
    return health(info) is not None


def status(settings: ColonySettings) -> ClusterInfo | None:
    """The running cluster: its recorded daemon alive, carrying the record's id (found by review: a
    pid the OS gave another process, beside a stranger answering /healthz on the recorded port, was
    reported as Colony, and sent the token), and its API answering."""
    info = read_state(settings)
    if info is None or not process_alive(info.pid) or not _ours(info) or not _healthy(info):
        return None
    return info


def _ours(info: ClusterInfo) -> bool:
    """`_carries`, where there is a /proc to ask (elsewhere the pid and the API decide, as before)."""
    return _carries(info.pid, info.daemon_id) if Path("/proc/self").exists() else True


def _lock(settings: ColonySettings) -> Any:
    """One `up` or `down` of a data folder at a time (found by review: of two `up`s at once, the one
    that failed stopped the embedded Redis the other had just started its cluster on)."""
    return file_lock(settings.data_dir / "cluster.lock")


def up(settings: ColonySettings, config: str | None = None, *, echo: bool = True) -> ClusterInfo:
    """Start (or reuse) the local cluster; returns where it answers. `settings` (already loaded from
    `config`, the environment and code) are what the daemon runs with. When the cluster cannot start,
    raises `ClusterError` with the cause and leaves nothing running that this call started."""
    with _lock(settings):
        return _up(settings, config, echo=echo)


def _up(settings: ColonySettings, config: str | None, *, echo: bool) -> ClusterInfo:
    running = status(settings)
    if running is not None:
        try:  # a Chroma server that died under a running cluster comes back, on its port
            start_chroma(settings)
        except ColonyError as exc:
            log.warning("the embedded Chroma server is down and could not be started again: %s", exc)
        return running
    # user agents (`agents:`) import here first: a bad entry is named in a second, before Ray starts
    # (the daemon builds them again; it runs with the same environment)
    from colony.system.catalog import colony_blueprints

    colony_blueprints(settings)
    stale = read_state(settings)
    if stale is not None:
        if process_alive(stale.pid) and _carries(stale.pid, stale.daemon_id):
            _stop_daemon(stale.pid)
        # a daemon that was killed leaves its Ray processes dying (the Serve proxy may still hold
        # the port, an old replica may still serve an agent the new cluster is about to host)
        reap_session(stale.pid, stale.daemon_id)
    state_file(settings).unlink(missing_ok=True)
    error_file(settings).unlink(missing_ok=True)
    # a previous cluster just reaped may hold the port a moment longer
    check_port_free(settings.serve.host, settings.serve.port, wait_seconds=20.0 if stale else 0.0)
    ensure_token_file(settings)  # a token from env/config file/<data_dir>/api-token, else a new file
    # an embedded Redis this call starts is stopped again if the cluster does not come up
    own_redis = (
        not settings.redis_url and not EmbeddedRedis(settings.data_dir, settings.embedded_redis).status()
    )
    redis_url = settings.redis_url or EmbeddedRedis(settings.data_dir, settings.embedded_redis).start().url
    own_chroma = False
    try:
        own_chroma = start_chroma(settings)
    except BaseException:
        if own_redis:
            EmbeddedRedis(settings.data_dir, settings.embedded_redis).stop()
        raise
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "COLONY_REDIS_URL": redis_url,
        "COLONY_DATA_DIR": str(settings.data_dir),
        "RAY_USAGE_STATS_ENABLED": "0",
        **default_roots_env(settings.vcm),  # vcm.allowed_roots unset: the folder `colony up` ran in
    }
    try:
        return _launch(settings, env)
    except BaseException:
        if own_chroma:
            EmbeddedChroma(settings.data_dir, settings.memory.chroma).stop()
        if own_redis:
            EmbeddedRedis(settings.data_dir, settings.embedded_redis).stop()
        raise


def embedded_chroma(settings: ColonySettings) -> EmbeddedChroma | None:
    """The Chroma server `up` runs beside the embedded Redis: None when `memory.chroma_url` names
    one elsewhere or `memory.chroma.enabled` is false (memory then keeps an in-process index)."""
    if settings.memory.chroma_url or not settings.memory.chroma.enabled:
        return None
    return EmbeddedChroma(settings.data_dir, settings.memory.chroma)


def start_chroma(settings: ColonySettings) -> bool:
    """Start (or reuse) the embedded Chroma server; True if this call started it. Replicas find its
    URL in `<data_dir>/chroma-server.json` (`resolve_chroma_url`); nothing secret is involved."""
    server = embedded_chroma(settings)
    if server is None or server.status() is not None:
        return False
    server.start()
    return True


def error_file(settings: ColonySettings) -> Path:
    """Where a daemon that could not start writes why, for `up` to print."""
    return settings.data_dir / "cluster-error.txt"


def check_port_free(host: str, port: int, wait_seconds: float = 0.0) -> None:
    """Refuse early, and by name, a port another process listens on: Serve's proxy would fail to
    bind it only inside a Ray actor, and `up` would wait for an API that never answers. With
    `wait_seconds`, a port still held (a previous cluster's proxy on its way out) is waited for."""
    deadline = time.monotonic() + wait_seconds
    while True:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
                return
            except OSError as exc:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise ClusterError(
                    f"cannot serve the API on {host}:{port}: {exc.strerror or exc}; another process "
                    f"uses the port{_listener(port)}. Stop it, or pick another port (serve.port, "
                    "COLONY_SERVE__PORT)"
                ) from None


def _listener(port: int) -> str:
    """` (pid N, name)` of the process listening on `port`, where the OS tells (else "")."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f" (pid {conn.pid}, {psutil.Process(conn.pid).name()})"
    except Exception:  # psutil missing, or not allowed to look: the message goes without it
        return ""
    return ""


def _daemon_settings(settings: ColonySettings, env: dict[str, str]) -> bytes:
    """The caller's settings as JSON (secrets revealed) for the daemon's stdin, so settings made in
    code (tests, embedding programs) reach it, not only the YAML and environment. Fields that `up`
    itself sets through `COLONY_*` variables are left out: the daemon reads those from its env."""
    data = settings.model_dump(mode="python")
    for name, value in env.items():
        if name.startswith("COLONY_") and os.environ.get(name) != value:
            *parents, leaf = name.removeprefix("COLONY_").lower().split("__")
            section = data
            for part in parents:
                section = section.get(part) if isinstance(section, dict) else None
            if isinstance(section, dict):
                section.pop(leaf, None)

    def plain(value: object) -> object:
        return value.get_secret_value() if isinstance(value, SecretStr) else str(value)

    return json.dumps(data, default=plain).encode()


def _launch(settings: ColonySettings, env: dict[str, str]) -> ClusterInfo:
    """Start the daemon and wait until it records the cluster, or report why it did not: the
    cause the daemon wrote (a replica's exception, a busy port), never a bare exit code."""
    env = {**env, DAEMON_ID_VARIABLE: secrets.token_hex(16)}
    command = [sys.executable, "-m", "colony.serve.cluster", "--settings-stdin"]
    if not settings.redis_url and settings.embedded_redis.supervise:
        command.append("--supervise-redis")  # the daemon restarts the embedded server if it dies
    log_path = settings.data_dir / "cluster.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
    try:
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(_daemon_settings(settings, env))
        deadline = time.monotonic() + settings.serve.start_timeout_seconds
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ClusterError(_failure(settings, process.returncode, log_path))
            info = read_state(settings)
            if info is not None and info.pid == process.pid:
                return info
            time.sleep(0.5)
        raise ClusterError(
            f"the cluster was not ready within {settings.serve.start_timeout_seconds}s "
            f"(serve.start_timeout_seconds); see {log_path}"
        )
    except BaseException:
        _stop_daemon(process.pid)  # the daemon's whole group: Ray and its helpers too
        raise


def _failure(settings: ColonySettings, code: int, log_path: Path) -> str:
    """Why the daemon exited: the cause it recorded, else the last exception in its log (it died
    before it could record one, e.g. on an import error), else its exit code."""
    try:
        cause = error_file(settings).read_text().strip()
    except OSError:
        cause = ""
    if not cause:
        with contextlib.suppress(OSError):
            with open(log_path, "rb") as log_file:
                log_file.seek(max(0, log_path.stat().st_size - 16_384))
                tail = log_file.read().decode(errors="replace")
            found = _exception_of(tail)
            cause = found if _EXCEPTION_LINE.match(found.splitlines()[0] if found else "") else ""
    if not cause:
        return f"the cluster daemon exited with code {code}; see {log_path}"
    return f"the cluster did not start: {cause}\n(full log: {log_path})"


def down(settings: ColonySettings) -> bool:
    """Stop the daemon (Serve and Ray with it), the embedded Redis and the embedded Chroma server;
    True if a cluster was running."""
    with _lock(settings):
        return _down(settings)


def _down(settings: ColonySettings) -> bool:
    info = read_state(settings)
    stopped = False
    if info is not None and process_alive(info.pid) and _carries(info.pid, info.daemon_id):
        _stop_daemon(info.pid)
        stopped = True
    if info is not None:
        reap_session(info.pid, info.daemon_id)
    state_file(settings).unlink(missing_ok=True)
    if not settings.redis_url:
        EmbeddedRedis(settings.data_dir, settings.embedded_redis).stop()
    if not settings.memory.chroma_url:  # one started while enabled is stopped even if disabled since
        EmbeddedChroma(settings.data_dir, settings.memory.chroma).stop()
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


def _carries(pid: int, daemon_id: str) -> bool:
    """Whether process `pid` has this daemon's id in its environment: the daemon, or a process of
    the Ray cluster it started (they inherit it). A recorded pid the OS gave to another process
    since does not; nor does anything when the record has no id (written by an older Colony)."""
    if not daemon_id:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{DAEMON_ID_VARIABLE}={daemon_id}".encode() in environ.split(b"\0")


def _session_members(sid: int, daemon_id: str) -> list[int]:
    """The processes of session `sid` that carry `daemon_id`: a daemon is a session leader, and
    every process of the Ray cluster it started (GCS, raylet, workers: each in a process group of
    its own) is in its session, its id in their environment. A session id reused by the OS since,
    or a process that is not the daemon's, never matches both."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.getsid(int(entry.name)) != sid:
                continue
        except (OSError, ProcessLookupError):
            continue
        if _carries(int(entry.name), daemon_id):
            members.append(int(entry.name))
    return members


def reap_session(sid: int, daemon_id: str, timeout: float = 15.0) -> int:
    """SIGKILL what is left of a dead daemon's Ray cluster and wait until it is gone; how many
    processes were killed (none without a daemon id)."""
    members = _session_members(sid, daemon_id) if daemon_id else []
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_alive(pid) for pid in members):
        time.sleep(0.1)
    if members:
        log.info("stopped %d leftover process(es) of the previous cluster (session %d)", len(members), sid)
    return len(members)


def redis_restarts(settings: ColonySettings) -> RedisRestarts | None:
    """How often the daemon restarted the embedded redis-server (None with an external Redis)."""
    if settings.redis_url:
        return None
    return RedisRestarts.read(EmbeddedRedis(settings.data_dir, settings.embedded_redis))


def _serve_forever(settings: ColonySettings, supervise_redis: bool = False) -> None:
    """Daemon body: own a local Ray cluster running the app until SIGTERM; with `supervise_redis`,
    keep the embedded redis-server `up` started alive too (`RedisSupervisor`)."""
    import ray
    from ray import serve

    from colony.serve.app import build_app_with_settings

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    supervisor = None
    if supervise_redis:
        supervisor = RedisSupervisor(EmbeddedRedis(settings.data_dir, settings.embedded_redis)).start()
        log.info("supervising the embedded redis-server on port %s", supervisor.port)
    cfg = settings.serve
    ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False, namespace="colony")
    try:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        app = build_app_with_settings(
            {"replicas": cfg.replicas, "replica_cpus": cfg.replica_cpus}, settings=settings
        )
        try:
            serve.run(app, name="colony", route_prefix="/", blocking=False)
        except RuntimeError as exc:  # DEPLOY_FAILED: Serve's own message names only the deployments
            raise ClusterError(deploy_failure(serve.status(), "colony") or str(exc)) from None
        url = f"http://{cfg.host}:{cfg.port}"
        token = TokenSource.from_settings(settings).current() or ""
        _wait_ready(
            url,
            token,
            settings.serve.start_timeout_seconds,
            lambda: serve_problem(serve.status(), "colony", f"{cfg.host}:{cfg.port}"),
        )
        info = ClusterInfo(
            pid=os.getpid(),
            url=url,
            token=token,
            redis_url=settings.redis_url or "",
            started_at=time.time(),
            replicas=cfg.replicas,
            daemon_id=os.environ.get(DAEMON_ID_VARIABLE, ""),
            ray_address=ray.get_runtime_context().gcs_address,
        )
        path = state_file(settings)
        write_private_file(path, json.dumps(asdict(info)))  # holds the token and the Redis password
        while not stopping:
            time.sleep(0.5)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        if supervisor is not None:
            supervisor.stop()


def _wait_ready(
    url: str, token: str, timeout: float, problem: Callable[[], str | None] | None = None
) -> None:
    """Until the API answers and the built-in agents are registered; `problem()` (asked every few
    seconds) names a failure that means it never will, so `up` reports it at once."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"}
    next_check = time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            agents = httpx.get(f"{url}/v1/agents", headers=headers, timeout=30).json()
            if isinstance(agents, list) and {"echo", "ask"} <= {a.get("agent_id") for a in agents}:
                return
        if problem is not None and time.monotonic() >= next_check:
            cause = problem()
            if cause:
                raise ClusterError(cause)
            next_check = time.monotonic() + 2.0
        time.sleep(0.5)
    raise ClusterError(f"the API at {url} did not become ready in {timeout}s (serve.start_timeout_seconds)")


def _status_name(status: object) -> str:
    return str(getattr(status, "value", status))


def serve_problem(serve_status: Any, app_name: str, address: str) -> str | None:
    """What keeps a deployed app from answering, per `serve.status()`: a deployment that failed or
    turned unhealthy (its exception), or an HTTP proxy that is unhealthy (it could not serve
    `address`)."""
    app = serve_status.applications.get(app_name)
    if app is not None and _status_name(app.status) in ("DEPLOY_FAILED", "UNHEALTHY"):
        return deploy_failure(serve_status, app_name)
    if any(_status_name(proxy) == "UNHEALTHY" for proxy in serve_status.proxies.values()):
        return f"Serve's HTTP proxy is unhealthy: it cannot serve {address} (is the port in use?)"
    return None


# the last line of a Python traceback: "package.module.ErrorName: message"
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*): (\S.*)$")


def deploy_failure(serve_status: Any, app_name: str) -> str | None:
    """The real cause of a failed deployment, from `serve.status()`: each failed deployment's name
    and the exception its replicas raised (constructor or first health check), e.g.
    `EngineReplica: EngineNotInstalled: the default embedded model is not installed; run ...`.
    Serve keeps the traceback in the deployment's status message and says only "Failed to update
    the deployments [...]" at the application level."""
    app = serve_status.applications.get(app_name)
    if app is None:
        return None
    causes = []
    for name, deployment in app.deployments.items():
        if _status_name(deployment.status) not in ("DEPLOY_FAILED", "UNHEALTHY"):
            continue
        causes.append(f"{name}: {_exception_of(str(deployment.message or ''))}")
    return "; ".join(causes) or (str(app.message) if app.message else None)


def _exception_of(message: str) -> str:
    """The innermost `Name: message` line of a traceback text and the lines after it (a
    multi-line message, e.g. a ConfigError's list of problems), else the text itself (trimmed)."""
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION_LINE.match(lines[index].strip())
        if match:
            return "\n".join([f"{match.group(1)}: {match.group(2)}", *lines[index + 1 :]])[:4000]
    return " ".join(line.strip() for line in lines)[-2000:]


def _write_failure(settings: ColonySettings, cause: str) -> None:
    with contextlib.suppress(OSError):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        write_private_file(error_file(settings), cause + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Colony local cluster daemon (started by `colony up`).")
    parser.add_argument("--config")
    parser.add_argument("--settings-stdin", action="store_true", help="read the settings as JSON from stdin")
    parser.add_argument(
        "--supervise-redis", action="store_true", help="restart the embedded redis-server when it dies"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = (
        ColonySettings(**json.loads(sys.stdin.read())) if args.settings_stdin else load_settings(args.config)
    )
    security.use_settings(settings)  # the daemon's entry point: its signatures use these settings
    try:
        _serve_forever(settings, supervise_redis=args.supervise_redis)
    except Exception as exc:
        log.exception("the cluster did not start")
        _write_failure(settings, str(exc) if isinstance(exc, ColonyError) else f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
