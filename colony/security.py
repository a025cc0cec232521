"""The colony secret, private files, and the HMAC that makes stored blueprints trustworthy.

Blueprints are cloudpickled, and unpickling runs code. Whoever can write Redis could otherwise
make every replica run a program of their choosing, so each stored blueprint carries an
HMAC-SHA256 made with a key only Colony's own processes know (the colony secret), and the
signature is checked (in constant time) before a single byte is unpickled.

Every process of one colony must resolve the same secret. In order:
`ColonySettings.secret` (env `COLONY_SECRET`; a Kubernetes Secret arrives this way), else the
file `ColonySettings.secret_file` (default `<data_dir>/secret`), generated 0600 on first use
(not the default file in a Kubernetes pod: pods do not share a data_dir, so there it must be given).
Each process's entry point hands it its settings with `use_settings()` (replica hosts, the control
plane, the API deployment, the `colony` command, a test session); a process that never did gets a
`ConfigError` on its first signature, never a secret looked up from its own environment.

This is a leaf module: it imports only config and errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from colony.errors import ConfigError

if TYPE_CHECKING:
    from colony.config import ColonySettings

SECRET_FILE_NAME = "secret"
MIN_SECRET_CHARS = 16  # shorter secrets are guessable; refuse them rather than sign with them
_SIGNING_CONTEXT = b"colony-blueprint-v1\x00"  # domain separation: this key signs nothing else

_lock = threading.Lock()
_settings: ColonySettings | None = None
_key: bytes | None = None


def write_private_file(path: Path, text: str, *, replace: bool = True) -> str:
    """Write `text` to `path` readable by the owner only (0600), atomically.

    The content goes to a temporary file created 0600 in the same folder, then is renamed over
    (or, with `replace=False`, hard-linked to) `path`, so no reader ever sees a partial file and
    the file is never world-readable, not even for an instant. With `replace=False` an existing
    file wins (two processes generating a secret at once both end with the same one): its
    content is returned.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
            return text
        try:
            os.link(tmp, path)
        except FileExistsError:
            return read_private_file(path)
        return text
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_private_file(path: Path) -> str:
    """The stripped content of a file that must be private: one readable by others is tightened
    to 0600 first (it holds a password or a key)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path} must be a regular file (it holds a secret), not a link or a folder")
    if info.st_mode & 0o077 and info.st_uid == os.getuid():
        path.chmod(0o600)
    return path.read_text().strip()


def secret_file_of(settings: ColonySettings) -> Path:
    return Path(settings.secret_file or settings.data_dir / SECRET_FILE_NAME).expanduser()


def resolve_secret(settings: ColonySettings) -> bytes:
    """The colony secret of `settings`: the configured value, else the secret file (made if absent)."""
    configured = settings.secret.get_secret_value().strip() if settings.secret is not None else ""
    if configured:  # an empty COLONY_SECRET counts as unset
        value = configured
        source = "COLONY_SECRET / settings.secret"
    else:
        path = secret_file_of(settings)
        try:
            value = read_private_file(path)
        except FileNotFoundError:
            if settings.secret_file is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                raise ConfigError(  # pods do not share a data_dir: each would make its own secret
                    f"no colony secret: COLONY_SECRET is unset and {path} does not exist. In Kubernetes "
                    "each pod would generate its own and refuse the others' blueprints; set COLONY_SECRET "
                    "from a Secret (the same in every pod of the colony), or COLONY_SECRET_FILE to a "
                    "mounted Secret file."
                ) from None
            value = write_private_file(path, secrets.token_urlsafe(48) + "\n", replace=False).strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the colony secret {path}: {exc}. Fix its permissions, or set COLONY_SECRET"
            ) from exc
        source = str(path)
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"the colony secret from {source} is {len(value)} characters long; it needs at least "
            f"{MIN_SECRET_CHARS}. Use e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`"
        )
    return hashlib.sha256(b"colony-secret\x00" + value.encode()).digest()


def use_settings(settings: ColonySettings) -> None:
    """Make `settings` the source of this process's signing key (resolved on first use)."""
    global _settings, _key
    with _lock:
        if _settings is not settings:
            _settings, _key = settings, None


def signing_key() -> bytes:
    """This process's blueprint signing key."""
    global _key
    with _lock:
        if _key is None:
            if _settings is None:
                raise ConfigError(
                    "no settings to take the blueprint signing key from: call "
                    "colony.security.use_settings(settings) at your program's entry point (replica "
                    "hosts, the control plane, the API deployment, LocalAgentRuntime and the colony "
                    "command do it for you)"
                )
            _key = resolve_secret(_settings)
        return _key


def sign(payload: bytes, key: bytes | None = None) -> str:
    """HMAC-SHA256 of `payload` (hex) under `key` (default: this process's signing key)."""
    return hmac.new(key or signing_key(), _SIGNING_CONTEXT + payload, hashlib.sha256).hexdigest()


def verify(payload: bytes, signature: str, key: bytes | None = None) -> bool:
    """Whether `signature` is the HMAC of `payload`, compared in constant time."""
    expected = sign(payload, key).encode()
    return hmac.compare_digest(expected, signature.encode("utf-8", "backslashreplace"))
