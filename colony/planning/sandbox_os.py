"""OS isolation for the sandbox: which layer is available here, and the command line that applies it.

Why a separate module: the Python-level guards in `sandbox_child.py` are defence in depth only; a
hostile program that has read Colony's source can defeat anything that lives in its own
interpreter. What holds regardless is decided here, outside the program's process:

- bubblewrap (`bwrap`): new mount, pid, network, ipc, uts and cgroup namespaces; a root of
  read-only binds of the Python runtime (the interpreter, its stdlib without site-packages, the
  shared libraries it links) plus size-capped tmpfs on `/tmp` and `/dev/shm`; `--die-with-parent`,
  `--new-session`, an empty environment. When Colony runs as root the program then runs under a
  fresh unprivileged uid (one per run, so RLIMIT_NPROC counts only its processes); when Colony is
  not root bwrap also unshares the user namespace and maps the program to uid 65534.
- process isolation (the fallback where bwrap is missing or does not work): a separate process in
  its own session with the same rlimits and per-run uid, killed as a process group and, as root
  without a cgroup, by a sweep over every process of its uid.
- cgroups (either isolation, where Colony is root and the memory and pids controllers are there):
  one per run, entered before the first instruction, with memory.max and pids.max; the bound on
  memory (memfd, shm and tmpfs pages included) and processes, and the way every process of the run
  (and nothing else) is killed.

`detect_bubblewrap` really starts a sandbox once (cached), because an installed `bwrap` may still
be unusable (no user namespaces in an unprivileged pod, a seccomp profile refusing `unshare`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from colony.errors import InvalidArgument

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


def bubblewrap_argv(*, uid: int | None, scratch_mb: int) -> list[str]:
    """The bwrap command line up to (and including) the interpreter and the child script.

    `uid` (Colony is root): bwrap runs as root in the host's user namespace and the child drops to
    that fresh uid itself (bwrap cannot map a uid other than its caller's into a user namespace, and
    an unprivileged bwrap could not read an interpreter under /root); else the program is uid 65534
    in a user namespace of its own.
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    files, folders = _runtime_paths()
    argv = [bwrap]
    if uid is not None:  # the child drops to the fresh uid itself, which RLIMIT_NPROC then counts
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
    for tmpfs in (SCRATCH, "/dev/shm"):  # both capped; as root their pages also count in the run's cgroup
        argv += ["--perms", "1777", "--size", str(scratch_mb * 1024 * 1024), "--tmpfs", tmpfs]
    # the root tmpfs read-only once built: without root, bwrap's user namespace leaves it writable
    # by the program's uid, and it has no size cap (only the scratch tmpfs are written, capped)
    argv += ["--remount-ro", "/"]
    argv += ["--chdir", SCRATCH, "--", interpreter(), *PYTHON_FLAGS, CHILD_IN_SANDBOX]
    return argv


def process_argv() -> list[str]:
    """The fallback command line: the interpreter in isolated mode, nothing more."""
    return [interpreter(), *PYTHON_FLAGS, str(CHILD)]


SUBID_FILES = ("/etc/subuid", "/etc/subgid")


def subid_overlaps(base: int, span: int, files: tuple[str, ...] = SUBID_FILES) -> list[str]:
    """The /etc/subuid and /etc/subgid entries (user namespaces' ranges) that meet [base, base + span)."""
    found = []
    for name in files:
        try:
            lines = Path(name).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.strip().split(":")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                continue
            start, count = int(parts[1]), int(parts[2])
            if start < base + span and base < start + count:
                found.append(f"{name}: {line.strip()}")
    return found


def uids_in_use() -> set[int]:
    """Real uids of every live process, from /proc."""
    used = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/status") as st:
                for line in st:
                    if line.startswith("Uid:"):
                        used.add(int(line.split()[1]))
                        break
    return used


def pick_uid(base: int, span: int) -> int | None:
    """A fresh uid for one run when Colony is root (else None: the uid cannot be changed).

    Refuses a range that meets a subordinate-id range (those uids belong to other users'
    containers), and draws again while a process already runs as the drawn uid, so the uid sweep
    of process isolation never meets a stranger.
    """
    if os.geteuid() != 0:
        return None
    overlaps = subid_overlaps(base, span, SUBID_FILES)
    if overlaps:
        raise InvalidArgument(
            f"planning.sandbox_uid_base/span [{base}, {base + span}) overlaps subordinate id ranges "
            f"({'; '.join(overlaps[:3])}); choose a range outside them"
        )
    used = uids_in_use()
    for _ in range(64):
        uid = base + secrets.randbelow(span)
        if uid not in used:
            return uid
    raise InvalidArgument(
        f"no free uid found in planning.sandbox_uid_base/span [{base}, {base + span}): widen the span"
    )


async def detect_bubblewrap(*, refresh: bool = False) -> Detection:
    """Whether bubblewrap can start the sandbox here: a real probe run, done once per process."""
    global _detected
    if _detected is None or refresh:  # two concurrent first calls both probe; harmless
        _detected = await _probe()
    return _detected


async def _probe() -> Detection:
    if shutil.which("bwrap") is None:
        return Detection(False, "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    argv = bubblewrap_argv(uid=NOBODY if os.geteuid() == 0 else None, scratch_mb=1)  # as runs will use it
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


# --- cgroups: the memory and process bound that holds whatever the program does -------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "colony-sandbox"


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-run cgroups are made (None: not usable here, `reason` says why)."""

    version: int  # 1 or 2; 0 = not usable
    memory: Path | None
    pids: Path | None
    reason: str


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in the hierarchy of `controller` ("" = the v2 unified one)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers.split(",") == ([controller] if controller else [""]):
            return path or "/"
    return "/"


def _base(mount: Path, controller: str) -> Path:
    own = mount / _own_cgroup(controller).lstrip("/")
    return (own if own.is_dir() else mount) / CGROUP_NAME


@functools.cache
def detect_cgroups() -> CgroupSupport:
    """Whether this process can make a cgroup with a memory and a pids limit per run (probed once)."""
    if os.geteuid() != 0:
        return CgroupSupport(0, None, None, "Colony is not root, so it cannot create cgroups")
    if (CGROUP_ROOT / "cgroup.controllers").is_file():  # pure cgroup v2
        base = _base(CGROUP_ROOT, "")
        support = CgroupSupport(2, base, base, "cgroup v2")
    elif (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").is_file() and (CGROUP_ROOT / "pids").is_dir():
        support = CgroupSupport(
            1, _base(CGROUP_ROOT / "memory", "memory"), _base(CGROUP_ROOT / "pids", "pids"), "cgroup v1"
        )
    else:
        return CgroupSupport(0, None, None, f"no memory and pids cgroup controllers under {CGROUP_ROOT}")
    try:
        probe = RunCgroup.create(support, f"probe-{os.getpid()}", memory_bytes=64 << 20, pids_max=8)
        probe.remove()
    except OSError as exc:
        return CgroupSupport(0, None, None, f"cgroups are not writable here: {exc}")
    _remove_stale(support)
    return support


def _remove_stale(support: CgroupSupport) -> None:
    """Remove the empty cgroups of runs whose Colony process died before cleaning up (SIGKILL)."""
    for base in {support.memory, support.pids}:
        if base is None or not base.is_dir():
            continue
        for group in base.iterdir():
            parts = group.name.split("-")
            dead = len(parts) == 3 and parts[0] == "run" and parts[1].isdigit()
            if dead and group.is_dir() and not Path(f"/proc/{parts[1]}").exists():
                with contextlib.suppress(OSError):  # not empty: left for the operator to see
                    group.rmdir()


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass
class RunCgroup:
    """One run's cgroup (v1: one per controller): memory.max, pids.max; killed and removed after."""

    version: int
    dirs: list[Path]  # v2: [one]; v1: [memory, pids]

    @property
    def name(self) -> str:
        return str(self.dirs[-1])

    @classmethod
    def create(cls, support: CgroupSupport, name: str, *, memory_bytes: int, pids_max: int) -> RunCgroup:
        assert support.memory is not None and support.pids is not None
        if support.version == 2:
            parent = support.memory
            if not parent.is_dir():
                parent.mkdir()
                _write(parent.parent / "cgroup.subtree_control", "+memory +pids")
                _write(parent / "cgroup.subtree_control", "+memory +pids")
            group = parent / name
            group.mkdir()
            made = cls(2, [group])
            try:
                _write(group / "memory.max", str(memory_bytes))
                if (group / "memory.swap.max").exists():
                    _write(group / "memory.swap.max", "0")
                _write(group / "pids.max", str(pids_max))
            except OSError:
                made.remove()
                raise
            return made
        for parent in (support.memory, support.pids):
            parent.mkdir(exist_ok=True)
        memory, pids = support.memory / name, support.pids / name
        memory.mkdir()
        made = cls(1, [memory])
        try:
            pids.mkdir()
            made.dirs.append(pids)
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
                _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(pids / "pids.max", str(pids_max))
        except OSError:
            made.remove()
            raise
        return made

    def enter_argv(self, argv: list[str]) -> list[str]:
        """`argv` prefixed by a shell that moves itself into the cgroup, then execs `argv`."""
        moves = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)
        return [shutil.which("sh") or "/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *argv]

    def pids(self) -> list[int]:
        try:
            text = (self.dirs[-1] / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this run for going over memory.max."""
        events = self.dirs[0] / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    async def kill(self, rounds: int = 50) -> bool:
        """SIGKILL every process in the cgroup (v2: cgroup.kill); True when none is left."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:  # pids.max bounds how many can appear between two rounds
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)
        return not self.pids()

    def remove(self) -> None:
        """rmdir the cgroup; a task still exiting makes that EBUSY for a moment, so it retries.

        Never raises: a cgroup left behind is empty and is removed by the next `detect_cgroups`.
        """
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)
