"""The embedded Chroma server, and the Chroma client every memory index uses.

Chroma holds the vector index of agent memory: derived data, rebuilt from Redis at will (Redis is
the only source of truth, and Chroma stores vectors only, no text). Every replica of a colony must
see the same index, so `colony up` starts one `chroma run` server beside the embedded Redis (when
`memory.chroma_url` is unset and `memory.chroma.enabled`), and `colony down` stops it.
`EmbeddedChroma` does the starting, reusing and stopping, the way `EmbeddedRedis` does: a state
file `<data_dir>/chroma-server.json` (pid, port, url) lets a second start reuse a live server, its
data lives in `<data_dir>/chroma`, its log in `<data_dir>/logs/chroma.log`.

The server has no authentication, so it listens on a loopback address only: a local process can at
worst change the ranking of recalled entries (recall verifies every hit against Redis), never read
memory text.

Nothing phones home: the Python client is built with `anonymized_telemetry=False` (Chroma's
default sends usage events), and the Rust server has no product telemetry; its only exporter is
OpenTelemetry, off unless its config names a collector (the server gets none, and no `OTEL_*`
variables).

`resolve_chroma_url(settings)` says which server to use: `memory.chroma_url`, else the live
embedded one, else None, and `chroma_client(settings)` connects to it, or, with none, opens an
in-process `PersistentClient` under `<data_dir>/chroma-local` (library use without `colony up`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from colony.blackboard.redis_server import free_port, is_loopback, log_tail, process_alive, wait_exit
from colony.config import ChromaServerSettings, ColonySettings
from colony.errors import ClusterError
from colony.file_lock import file_lock

log = logging.getLogger(__name__)

STATE_FILE_NAME = "chroma-server.json"
HEARTBEAT_PATH = "/api/v2/heartbeat"
INSTALL_COMMAND = "pip install chromadb==1.5.9"


@dataclass(frozen=True)
class ChromaServerInfo:
    """What is known of a running embedded Chroma server (nothing in it is secret)."""

    pid: int
    host: str
    port: int
    binary: str
    path: str  # its persistence folder

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def find_chroma_binary(configured: Path | None = None) -> Path:
    """The `chroma` CLI: configured, else the one installed beside this Python (the venv's
    scripts folder), else on PATH."""
    if configured is not None:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ClusterError(
                f"configured chroma CLI {path} (memory.chroma.binary) is missing or not executable"
            )
        return path
    candidates = [Path(sys.executable).parent / "chroma", Path(sysconfig.get_path("scripts")) / "chroma"]
    on_path = shutil.which("chroma")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ClusterError(
        f"no `chroma` CLI found beside {sys.executable} or on PATH; install it: `{INSTALL_COMMAND}` "
        "(or set memory.chroma_url to a running Chroma server, or memory.chroma.enabled=false)"
    )


def heartbeat(url: str, timeout: float = 1.0) -> bool:
    """Whether a Chroma server answers at `url`."""
    try:
        response = httpx.get(f"{url}{HEARTBEAT_PATH}", timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and "heartbeat" in response.text


def _is_chroma_process(pid: int, path: Path | None = None) -> bool:
    """Whether `pid` still runs a `chroma run` (of the data folder `path`, when given): a recorded
    pid the OS gave to another process since, or another colony's server, must never be signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    ours = path is None or str(path).encode() in argv
    return (
        ours and b"run" in argv and any(Path(arg.decode(errors="replace")).name == "chroma" for arg in argv)
    )


def _server_environment() -> dict[str, str]:
    """The server's environment: ours without OpenTelemetry settings (the only way the Rust server
    would export anything) and with the Python client's telemetry off."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    env["ANONYMIZED_TELEMETRY"] = "False"
    return env


class EmbeddedChroma:
    """Start, reuse, inspect and stop the `chroma run` server that lives under `data_dir`."""

    def __init__(self, data_dir: Path | str, settings: ChromaServerSettings | None = None) -> None:
        self.settings = settings or ChromaServerSettings()
        self.data_dir = Path(data_dir).expanduser()
        self.path = self.data_dir / "chroma"
        self.state_file = self.data_dir / STATE_FILE_NAME
        self.log_file = self.data_dir / "logs" / "chroma.log"

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Serialise start/stop across processes sharing this data_dir."""
        return file_lock(self.data_dir / ".chroma-server.lock")

    def recorded(self) -> ChromaServerInfo | None:
        """What the state file says (alive or not); None without one (a damaged one is removed)."""
        try:
            return ChromaServerInfo(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            self.state_file.unlink(missing_ok=True)
            return None

    def status(self) -> ChromaServerInfo | None:
        """The running server, or None. The state file of a server that died stays (only `stop()`
        removes it): the next `start()` brings the server back on the port it recorded."""
        info = self.recorded()
        if info is None:
            return None
        if process_alive(info.pid) and _is_chroma_process(info.pid, self.path) and heartbeat(info.url):
            return info
        return None

    def start(self) -> ChromaServerInfo:
        """Start the server, or return the one already running for this data_dir."""
        with self._locked():
            previous = self.recorded()
            running = self.status()
            if running is not None:
                return running
            if not is_loopback(self.settings.host):
                raise ClusterError(
                    f"memory.chroma.host is {self.settings.host!r}; the embedded Chroma server has no "
                    "authentication and listens on a loopback address only (e.g. 127.0.0.1). To share "
                    "one between machines, run Chroma yourself and set memory.chroma_url."
                )
            binary = find_chroma_binary(self.settings.binary)
            if previous is not None and self._answers_late(previous):
                return previous
            # a server that died comes back on its port: clients holding its URL reconnect to it
            reusable = previous is not None and previous.host == self.settings.host and _free(previous)
            port = self.settings.port or (previous.port if previous and reusable else None)
            port = port or free_port(self.settings.host)
            self.path.mkdir(parents=True, exist_ok=True)
            self.path.chmod(0o700)
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            command = [str(binary), "run", "--path", str(self.path), "--host", self.settings.host]
            command += ["--port", str(port)]
            with open(self.log_file, "ab") as log_handle:
                process = subprocess.Popen(
                    command,
                    cwd=self.data_dir,
                    env=_server_environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the CLI that started it
                )
            info = ChromaServerInfo(process.pid, self.settings.host, port, str(binary), str(self.path))
            self._wait_ready(process, info)
            tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(info)))
            os.replace(tmp, self.state_file)
            log.info(
                "embedded chroma server started: pid %s at %s (data in %s)", info.pid, info.url, self.path
            )
            return info

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the server (SIGTERM, then SIGKILL after `timeout`); True if one was running."""
        with self._locked():
            info = self.recorded()
            self.state_file.unlink(missing_ok=True)
            if info is None or not process_alive(info.pid) or not _is_chroma_process(info.pid, self.path):
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGTERM)
            if not wait_exit(info.pid, timeout):
                log.warning("chroma server pid %s did not exit in %.0fs; killing it", info.pid, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
                wait_exit(info.pid, 5.0)
            return True

    def _answers_late(self, info: ChromaServerInfo) -> bool:
        """Whether the recorded server, which did not answer `status()`, is only slow. One that
        still runs gets 5 s more to answer; else it is dying (a SIGKILL not yet done) or hung, and
        is stopped so that its port frees up for the new one (a state file is only ever written
        for a server that answered, so it is not one still starting)."""
        if not process_alive(info.pid):
            return False
        if not _is_chroma_process(info.pid, self.path):
            # exiting (its leader a zombie, with an empty command line, while its other threads
            # still hold the port) or the pid went to another process: wait for a dying one
            wait_exit(info.pid, 3.0)
            return False
        if heartbeat(info.url, timeout=5.0):
            return True
        log.warning("the embedded chroma server pid %s does not answer; stopping it", info.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGTERM)
        if not wait_exit(info.pid, 5.0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pid, signal.SIGKILL)
            wait_exit(info.pid, 5.0)
        return False

    def _wait_ready(self, process: subprocess.Popen[bytes], info: ChromaServerInfo) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_seconds
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ClusterError(
                    f"the chroma server exited with code {process.returncode} at start; see "
                    f"{self.log_file}:\n{self._log_tail()}"
                )
            if heartbeat(info.url, timeout=0.5):
                return
            time.sleep(0.1)
        process.kill()
        process.wait()
        raise ClusterError(
            f"the chroma server did not answer {HEARTBEAT_PATH} within "
            f"{self.settings.start_timeout_seconds}s (memory.chroma.start_timeout_seconds); "
            f"see {self.log_file}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_file, lines)


def _free(info: ChromaServerInfo) -> bool:
    """Whether nothing listens on the port `info` recorded (connections of the dead server left in
    TIME_WAIT do not count: the server binds with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET6 if ":" in info.host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((info.host, info.port))
        except OSError:
            return False
    return True


def resolve_chroma_url(settings: ColonySettings) -> str | None:
    """The Chroma server memory uses: `memory.chroma_url`, else the live embedded server under
    `data_dir` (started by `colony up`), else None (in-process index)."""
    if settings.memory.chroma_url:
        return settings.memory.chroma_url
    running = EmbeddedChroma(settings.data_dir, settings.memory.chroma).status()
    return running.url if running is not None else None


def client_settings() -> Any:
    """Chroma client settings: never any telemetry."""
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


def chroma_client(settings: ColonySettings) -> Any:
    """A Chroma client: HTTP to `resolve_chroma_url(settings)`, else (library use: no server was ever
    started under this data_dir) an in-process persistent one under `<data_dir>/chroma-local`.
    When `colony up` started a server here that is not answering now, `ClusterError`: a process
    must not quietly index into a private copy while the others use the shared server (the caller
    ranks by keywords meanwhile and tries again). Collections must be given an embedding function
    explicitly (`colony.memory.embedding.get_embedder`): Chroma's default one downloads a model."""
    import chromadb

    url = resolve_chroma_url(settings)
    embedded = EmbeddedChroma(settings.data_dir, settings.memory.chroma)
    if url is None and embedded.recorded() is not None:
        raise ClusterError(
            f"the embedded Chroma server of {settings.data_dir} is not answering (see "
            f"{embedded.log_file}); `colony up` restarts it"
        )
    if url is None:
        path = settings.data_dir / "chroma-local"
        path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=client_settings())
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClusterError(f"memory.chroma_url {url!r} is not an http(s)://host:port URL")
    ssl = parts.scheme == "https"
    port = parts.port or (443 if ssl else 80)
    from colony.memory.chroma_http import CHROMA_CALL_SECONDS, bounded

    if not heartbeat(url.rstrip("/"), timeout=CHROMA_CALL_SECONDS):  # (no client of an unanswering server)
        raise ClusterError(
            f"the Chroma server at {url} does not answer its heartbeat within {CHROMA_CALL_SECONDS:g} s; "
            "start it (`colony up` starts the embedded one) or fix memory.chroma_url"
        )
    try:
        client = chromadb.HttpClient(host=parts.hostname, port=port, ssl=ssl, settings=client_settings())
        return bounded(client)
    except Exception as exc:  # chromadb raises plain ValueError/ConnectError when the server is away
        raise ClusterError(
            f"the Chroma server at {url} does not answer ({type(exc).__name__}: {exc}); start it "
            "(`colony up` starts the embedded one) or fix memory.chroma_url"
        ) from None
