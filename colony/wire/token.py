"""The API's bearer token: where it comes from, and how a request proves it holds it.

The token is read at run time, in the process that serves the API, so a Kubernetes secret or a
rotated file takes effect without rebuilding the application: `COLONY_API_TOKEN` in this
process's environment first, else `api_token` from the operator's config file, else the file
`api.token_file` (default `<data_dir>/api-token`). With none of them, `ensure_token_file` creates
that file (0600, create-only) on a loopback host and refuses to start on any other host, so the API
is never served without a token. Comparison is constant-time (`hmac.compare_digest`).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from colony.config import ColonySettings
from colony.errors import ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "COLONY_API_TOKEN"
METRICS_TOKEN_ENV = "COLONY_API__METRICS_TOKEN"  # the settings' api.metrics_token, re-read per request
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def token_file_path(settings: ColonySettings) -> Path:
    """Where the token file lives: `api.token_file`, else `<data_dir>/api-token`."""
    path = settings.api.token_file or settings.data_dir / "api-token"
    return path.expanduser()


def _read_token_file(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the API token file {path}: {exc}") from exc
    return text or None


@dataclass
class TokenSource:
    """The token this process accepts, looked up at every call (cheap: an env lookup, a stat).

    `configured` is a token from the config file (not the environment: that is re-read here);
    the file is re-read only when its modification time, size or inode change.
    """

    file: Path | None = None
    configured: str | None = None
    read_env: bool = True
    metrics_configured: str | None = None  # api.metrics_token from the config file
    _cache: tuple[tuple[int, int, int], str | None] | None = field(default=None, repr=False)

    @classmethod
    def fixed(cls, token: str) -> TokenSource:
        """A token that never changes (tests, embedded use)."""
        if not token:
            raise ConfigError("the API token must not be empty")
        return cls(configured=token, read_env=False)

    @classmethod
    def from_settings(cls, settings: ColonySettings) -> TokenSource:
        """The token lookup of an API process: env, then a config-file token, then the token file."""
        configured = None
        if settings.api_token is not None and not os.environ.get(TOKEN_ENV):
            configured = settings.api_token.get_secret_value() or None
        metrics = settings.api.metrics_token.get_secret_value() if settings.api.metrics_token else None
        return cls(file=token_file_path(settings), configured=configured, metrics_configured=metrics or None)

    def current(self) -> str | None:
        """The token a request must carry now; None when none is configured anywhere."""
        if self.read_env:
            env = os.environ.get(TOKEN_ENV, "").strip()
            if env:
                return env
        if self.configured:
            return self.configured
        if self.file is None:
            return None
        try:
            stat = self.file.stat()
        except FileNotFoundError:
            self._cache = None
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read the API token file {self.file}: {exc}") from exc
        signature = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._cache is None or self._cache[0] != signature:
            self._cache = (signature, _read_token_file(self.file))
        return self._cache[1]

    def metrics_token(self) -> str | None:
        """The token accepted on /metrics besides the API token: $COLONY_API__METRICS_TOKEN at
        call time, else `api.metrics_token` of the config file; None when neither is set."""
        if self.read_env:
            env = os.environ.get(METRICS_TOKEN_ENV, "").strip()
            if env:
                return env
        return self.metrics_configured

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries the current token (constant time)."""
        return _carries(authorization, self.current())

    def accepts_for_metrics(self, authorization: str | None) -> bool:
        """Whether the header may read /metrics: the API token, or the metrics-only token (which
        opens nothing else, so a scraper's copy of it cannot submit runs or stop agents)."""
        return self.accepts(authorization) or _carries(authorization, self.metrics_token())


def _carries(authorization: str | None, token: str | None) -> bool:
    """`Authorization: Bearer <token>` with exactly this token (constant-time comparison)."""
    if token is None or authorization is None:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def is_loopback(host: str) -> bool:
    return host.strip().lower() in LOOPBACK_HOSTS


def ensure_token_file(settings: ColonySettings, *, host: str | None = None) -> TokenSource:
    """The token source of an API process, creating the token file on first start if needed.

    A token from the environment, the config file or an existing token file is used as is. Else, on
    a loopback host, a new token is written create-only with mode 0600 (never world-readable, not
    even for an instant) and its path logged; on any other host this refuses to start: an API
    reachable from other machines without a token the operator chose is not an option.
    """
    source = TokenSource.from_settings(settings)
    if source.current() is not None:
        return source
    where = settings.serve.host if host is None else host
    path = token_file_path(settings)
    if not is_loopback(where):
        raise ConfigError(
            f"the API would listen on {where!r} (not a loopback address) without a token: set "
            f"{TOKEN_ENV}, `api_token` in the config file, or put a token in {path} (api.token_file)"
        )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = new_api_token()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return _wait_for_other_writer(source, path)  # another process created it first: use theirs
    try:
        os.write(fd, token.encode())
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    os.close(fd)
    log.warning("no API token was configured: generated one in %s (mode 0600)", path)
    return source


def new_api_token() -> str:
    """A random token (256 bits) that never starts with '-': pasted after `--token` on a command
    line, such a value would be read as an option."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def _wait_for_other_writer(source: TokenSource, path: Path) -> TokenSource:
    """The token file exists but held nothing a moment ago: give its creator a second to write it."""
    for _ in range(20):
        if source.current() is not None:
            return source
        time.sleep(0.05)
    raise ConfigError(f"the API token file {path} is empty: put a token in it, or delete it to get a new one")
