"""OS isolation for the sandbox: which layer is available here, and the command line that applies it.

Why a separate module: the Python-level guards in `sandbox_child.py` are defence in depth only; a
hostile program that has read Colony's source can defeat anything that lives in its own
interpreter. What holds regardless is decided here, outside the program's process:

- bubblewrap (`bwrap`): new mount, pid, network, ipc, uts and cgroup namespaces; a root of
  read-only binds of the Python runtime (the interpreter, its stdlib without site-packages, the
  shared libraries it links) plus a size-capped tmpfs on `/tmp`; `--die-with-parent`,
  `--new-session`, an empty environment. When Colony runs as root the program then runs under a
  fresh unprivileged uid (one per run, so RLIMIT_NPROC counts only its processes); when Colony is
  not root bwrap also unshares the user namespace and maps the program to uid 65534.
- process isolation (the fallback where bwrap is missing or does not work): a separate process in
  its own session with the same rlimits and per-run uid, killed as a process group and, as root,
  by a sweep over every process of its uid.

`detect_bubblewrap` really starts a sandbox once (cached), because an installed `bwrap` may still
be unusable (no user namespaces in an unprivileged pod, a seccomp profile refusing `unshare`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
CHILD_IN_SANDBOX = "/colony/sandbox_child.py"
SCRATCH = "/tmp"
NOBODY = 65534
PYTHON_FLAGS = ("-I", "-S", "-u", "-B")
_FALLBACK_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")
LD_CACHE = "/etc/ld.so.cache"


@dataclass(frozen=True)
class Detection:
    """Whether bubblewrap works here; `reason` says why not (shown to users in errors and logs)."""

    available: bool
    reason: str


_detected: Detection | None = None


def interpreter() -> str:
    """The real interpreter binary (a venv's `python` is a symlink to it)."""
    return os.path.realpath(sys.executable)


@functools.cache
def _runtime_paths() -> tuple[list[str], list[str]]:
    """(files, folders) the interpreter needs: binary, libpython, shared libraries; the stdlib."""
    files = [interpreter()]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
            files.append(os.path.join(libdir, soname))
    stdlib = os.path.realpath(
        sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix, "base": sys.base_prefix})
    )
    libraries = _shared_libraries(stdlib)
    if libraries:
        files += [f for f in libraries if f not in files]
        if os.path.isfile(LD_CACHE):  # where the loader finds them; a list of library paths only
            files.append(LD_CACHE)
        return files, [stdlib]
    # no ldd: whole library folders, except one holding the stdlib (it would show site-packages)
    folders = [d for d in _FALLBACK_LIB_DIRS if os.path.isdir(d) and not stdlib.startswith(d + os.sep)]
    return files, [stdlib, *folders]


def _shared_libraries(stdlib: str) -> list[str]:
    """The shared libraries (and loader) the interpreter and its extension modules link, via ldd.

    Bound one file at a time, at the path the loader resolved, so no folder (with whatever else
    it holds) is exposed.
    """
    targets = [interpreter()]
    dynload = Path(stdlib) / "lib-dynload"
    if dynload.is_dir():
        targets += [str(p) for p in dynload.glob("*.so")]
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run([ldd, *targets], capture_output=True, text=True, timeout=20, env={}).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found: set[str] = set()
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if len(parts) > 2 and parts[1] == "=>" else (parts[0] if parts else "")
        if path.startswith("/") and os.path.isfile(path):
            found.add(path)
    return sorted(found)


def _parents(path: str) -> list[str]:
    parents = []
    current = os.path.dirname(path)
    while current not in ("/", ""):
        parents.append(current)
        current = os.path.dirname(current)
    return parents[::-1]


def bubblewrap_argv(*, switch_uid: bool, scratch_mb: int) -> list[str]:
    """The bwrap command line up to (and including) the interpreter and the child script."""
    bwrap = shutil.which("bwrap") or "bwrap"
    files, folders = _runtime_paths()
    argv = [bwrap]
    if switch_uid:  # root: the child drops to a fresh uid itself, which RLIMIT_NPROC then counts
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        argv += ["--unshare-all", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--perms", "0755", "--tmpfs", "/"]
    made: set[str] = set()
    for target in [*files, *folders, CHILD_IN_SANDBOX]:
        for parent in _parents(target):
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
    for path in files:
        argv += ["--ro-bind", path, path]
    for path in folders:
        argv += ["--ro-bind", path, path]
        site = os.path.join(path, "site-packages")
        if os.path.isdir(site):  # the stdlib folder without third-party packages
            argv += ["--tmpfs", site, "--remount-ro", site]
    argv += ["--ro-bind", str(CHILD), CHILD_IN_SANDBOX, "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(scratch_mb * 1024 * 1024), "--tmpfs", SCRATCH]
    argv += ["--chdir", SCRATCH, "--", interpreter(), *PYTHON_FLAGS, CHILD_IN_SANDBOX]
    return argv


def process_argv() -> list[str]:
    """The fallback command line: the interpreter in isolated mode, nothing more."""
    return [interpreter(), *PYTHON_FLAGS, str(CHILD)]


def pick_uid(base: int, span: int) -> int | None:
    """A fresh uid for one run when Colony is root (else None: the uid cannot be changed)."""
    if os.geteuid() != 0:
        return None
    return base + secrets.randbelow(span)


async def detect_bubblewrap(*, refresh: bool = False) -> Detection:
    """Whether bubblewrap can start the sandbox here: a real probe run, done once per process."""
    global _detected
    if _detected is None or refresh:  # two concurrent first calls both probe; harmless
        _detected = await _probe()
    return _detected


async def _probe() -> Detection:
    if shutil.which("bwrap") is None:
        return Detection(False, "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    argv = bubblewrap_argv(switch_uid=os.geteuid() == 0, scratch_mb=1)  # the variant runs will use
    argv = [*argv[: argv.index("--") + 1], interpreter(), *PYTHON_FLAGS, "-c", "print('sandbox-ok')"]
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={},
            start_new_session=True,
        )
        out, err = await asyncio.wait_for(process.communicate(), 20)
    except TimeoutError:
        kill_group(process.pid)
        return Detection(False, "a bwrap probe run did not finish within 20s")
    except OSError as exc:
        return Detection(False, f"bwrap could not be started: {exc}")
    if process.returncode == 0 and out.strip() == b"sandbox-ok":
        return Detection(True, "bubblewrap works")
    detail = err.decode(errors="replace").strip()[-300:] or f"exit code {process.returncode}"
    return Detection(False, f"bwrap is installed but cannot start a sandbox here: {detail}")


def kill_group(pid: int) -> None:
    """SIGKILL the process group (= session) `pid` leads; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) pids owned by `uid`, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        uids = fields.get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            pids.append(int(entry))
    return pids


async def kill_uid(uid: int, rounds: int = 5) -> bool:
    """Kill every process of `uid` (a helper switches to it and signals -1); True when none is left.

    This is what catches a daemonised grandchild (double fork + setsid) in process isolation: it
    left the process group, but it cannot leave its uid.
    """
    script = f"import os,signal\nos.setgroups([])\nos.setresgid({uid},{uid},{uid})\n"
    script += (
        f"os.setresuid({uid},{uid},{uid})\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    )
    for _ in range(rounds):
        if not processes_of_uid(uid):
            return True
        helper = await asyncio.create_subprocess_exec(
            interpreter(), "-I", "-S", "-c", script, env={}, stdin=asyncio.subprocess.DEVNULL
        )
        await helper.wait()
        await asyncio.sleep(0.02)
    return not processes_of_uid(uid)
