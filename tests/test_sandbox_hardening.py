"""The sandbox after the issue-11 review: what bounds memory and processes (cgroups, rlimits), the
Python guards' own robustness, the uid range and the protocol's values. Real sandboxes throughout.

The cgroup tests need Colony to be root on a host with the memory and pids controllers (CI and this
machine are); elsewhere they are skipped with the reason `detect_cgroups()` gives.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from colony.config import PlanningSettings
from colony.errors import InvalidArgument
from colony.planning import SandboxLimits, run_sandboxed, sandbox_os

LIMITS = SandboxLimits(wall_seconds=10, cpu_seconds=5, memory_mb=64)
BWRAP = PlanningSettings(sandbox_isolation="bubblewrap")
PROCESS = PlanningSettings(sandbox_isolation="process")
# the layers beneath the Python guards and the seccomp allowlist, on their own (tests only)
BENEATH: dict[str, Any] = {"python_guards": False, "syscalls": "namespaces"}
BOTH = pytest.mark.parametrize("settings", [BWRAP, PROCESS], ids=["bubblewrap", "process"])
CGROUPS = sandbox_os.detect_cgroups()
NEEDS_CGROUPS = pytest.mark.skipif(not CGROUPS.version, reason=CGROUPS.reason)


def gone(path: str | Path) -> bool:
    return not os.path.exists(path)


SPREAD_OVER_PROCESSES = """
import os, time
for i in range(6):  # each under RLIMIT_AS, together far over the run's memory
    if os.fork() == 0:
        data = b"x" * (60 << 20)
        time.sleep(3)
        os._exit(0)
print("exits", sorted(os.waitstatus_to_exitcode(os.wait()[1]) for _ in range(6)), flush=True)
"""


@NEEDS_CGROUPS
@BOTH
async def test_the_runs_memory_cgroup_bounds_all_its_processes_together(settings: PlanningSettings) -> None:
    limits = LIMITS.model_copy(update={"memory_mb": 96, "max_processes": 8})
    result = await run_sandboxed(
        SPREAD_OVER_PROCESSES,
        limits=limits,
        settings=settings,
        **BENEATH,
    )
    assert not result.ok and "went over its memory limit (128 MiB" in result.error, result.error
    assert "exits [-9" in result.stdout  # the kernel's OOM killer, inside the run's cgroup only
    assert result.cgroup is not None and gone(result.cgroup)  # removed after the run


MEMFD_AND_NAMESPACES = """
import os
try:
    os.memfd_create("m")
    print("MEMFD")
except PermissionError:
    print("memfd refused")
try:
    import ctypes
except ImportError:  # process isolation: the stdlib under /root is not readable by the run's uid
    print("namespaces refused")
else:
    libc = ctypes.CDLL(None, use_errno=True)
    print("namespaces refused" if libc.unshare(0x10000000 | 0x20000) == -1 else "UNSHARED")
pid = os.fork()  # plain processes still work (clone without namespace flags)
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@BOTH
async def test_seccomp_refuses_memfd_and_new_namespaces(settings: PlanningSettings) -> None:
    """Kernel-enforced, so it holds for a program past the Python guards (run here without them):
    memfds are memory RLIMIT_AS does not see, and a user namespace would make the program root."""
    result = await run_sandboxed(
        MEMFD_AND_NAMESPACES,
        limits=LIMITS,
        settings=settings,
        **BENEATH,
    )
    assert result.ok, result.error
    assert result.stdout.splitlines() == ["memfd refused", "namespaces refused", "fork 7"]


@NEEDS_CGROUPS
async def test_every_run_has_its_own_cgroup_with_memory_and_pids_limits() -> None:
    seen: dict[str, str] = {}

    async def where(pid: int) -> str:
        with open(f"/proc/{pid}/cgroup") as lines:  # noqa: ASYNC230 (procfs, instant)
            text = lines.read()
        for line in text.splitlines():
            _, controllers, path = line.split(":", 2)
            if "run-" in path:
                seen[controllers] = path
        return "ok"

    code = "import os\nrun('where', pid=os.getpid())"
    limits = LIMITS.model_copy(update={"max_processes": 5})
    result = await run_sandboxed(
        code, actions={"where": where}, limits=limits, settings=PROCESS, python_guards=False
    )
    assert result.ok, result.error
    group = Path(result.cgroup or "")
    assert group.name in "".join(seen.values())  # the program itself was in the run's cgroup
    if CGROUPS.version == 1:
        assert set(seen) >= {"memory", "pids"}
    assert gone(group)
    # the limits the run's cgroup had: made again the same way, read back
    made = sandbox_os.RunCgroup.create(CGROUPS, "test-limits", memory_bytes=(64 + 32) << 20, pids_max=5 + 3)
    try:
        pids = (made.dirs[-1] / "pids.max").read_text().strip()
        memory = made.dirs[0] / ("memory.max" if made.version == 2 else "memory.limit_in_bytes")
        assert pids == "8" and int(memory.read_text()) == 96 << 20
    finally:
        made.remove()


@NEEDS_CGROUPS
def test_cgroups_left_by_a_colony_that_died_are_removed() -> None:
    """A SIGKILLed Colony cannot clean up (test_the_sandbox_dies_with_colony); the next one does."""
    dead, alive = f"run-{2**22 + 7}-feed", f"run-{os.getpid()}-beef"  # above pid_max: no such process
    made = [
        sandbox_os.RunCgroup.create(CGROUPS, name, memory_bytes=64 << 20, pids_max=4)
        for name in (dead, alive)
    ]
    try:
        sandbox_os._remove_stale(CGROUPS)
        assert [gone(d) for d in made[0].dirs] == [True] * len(made[0].dirs)
        assert [gone(d) for d in made[1].dirs] == [False] * len(made[1].dirs)
    finally:
        for group in made:
            group.remove()


async def test_without_cgroups_file_descriptors_and_locked_memory_are_bounded() -> None:
    code = (
        "import os, resource\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_MEMLOCK))\n"
        "n = 0\ntry:\n    while True:\n        os.pipe()\n        n += 2\n"
        "except OSError as exc:\n    print('fds', n, exc.errno)\n"
    )
    settings = PlanningSettings(sandbox_isolation="process", sandbox_cgroups="off")
    result = await run_sandboxed(
        code,
        limits=LIMITS,
        settings=settings,
        **BENEATH,
    )
    assert result.ok and result.cgroup is None, result.error
    lines = result.stdout.splitlines()
    assert lines[0] == "(32, 32) (0, 0)"
    count, errno = map(int, lines[1].split()[1:])
    assert 0 < count < 32 and errno == 24  # EMFILE


async def test_required_cgroups_refuse_to_run_where_they_cannot_be_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unusable = sandbox_os.CgroupSupport(0, None, None, "Colony is not root, so it cannot create cgroups")
    monkeypatch.setattr(sandbox_os, "detect_cgroups", lambda: unusable)
    required = PlanningSettings(sandbox_isolation="process", sandbox_cgroups="required")
    result = await run_sandboxed("print(1)", limits=LIMITS, settings=required)
    assert not result.ok and "planning.sandbox_cgroups is 'required'" in result.error
    assert "Colony is not root" in result.error and result.stdout == ""
    auto = await run_sandboxed("print(1)", limits=LIMITS, settings=PROCESS)
    assert auto.ok and auto.cgroup is None  # auto: rlimits only


# -- the Python guards: defence in depth, but not switched off by the known tricks -----------------

SHADOW_THE_HOOK = """
import json
g = run.__globals__  # was sandbox_child's module globals, where the hook looked up str and len
class S:
    def __init__(self, x): pass
    def split(self, sep): return ["json"]
g["str"], g["len"] = S, (lambda a: 0)
g["PermissionError"] = KeyError
try:
    1 / 0
except ZeroDivisionError as e:
    try:
        print("FRAME", e.__traceback__.tb_frame)
    except PermissionError:
        print("refused frame")
imp = json.__builtins__["__import__"]  # the real __import__, past the import allow-list
for name in ("_posixsubprocess", "ctypes", "socket", "os", "sys"):
    try:
        imp(name)
        print("IMPORTED", name)
    except (ImportError, PermissionError):
        print("refused", name)
"""


@BOTH
async def test_rewriting_the_childs_globals_does_not_switch_the_hook_off(settings: PlanningSettings) -> None:
    result = await run_sandboxed(SHADOW_THE_HOOK, limits=LIMITS, settings=settings)
    assert result.ok, result.error
    assert "FRAME" not in result.stdout and "IMPORTED" not in result.stdout
    assert result.stdout.count("refused") == 6


OS_ALIASES = """
import random, dataclasses, typing, collections, json, statistics
bad = {"memfd_create", "write", "fork", "system", "sys", "execv"}
print("random._os", sorted(set(dir(random._os)) & bad))
print("urandom", len(random._os.urandom(4)))
print("dataclasses.sys", sorted(set(dataclasses.sys.modules) & {"os", "sys", "posix", "_posixsubprocess"}))
print("typing.sys", hasattr(typing.sys, "_getframe"), hasattr(typing.sys, "modules"))
print("loader", random.__loader__, random.__spec__)
@dataclasses.dataclass
class P:
    x: int
print(P(1), collections.namedtuple("T", "a")(1), statistics.mean([1, 2]))
"""


@BOTH
async def test_allowed_modules_hand_out_no_os_or_sys(settings: PlanningSettings) -> None:
    result = await run_sandboxed(OS_ALIASES, limits=LIMITS, settings=settings)
    assert result.ok, result.error
    assert result.stdout.splitlines() == [
        "random._os []",
        "urandom 4",
        "dataclasses.sys []",
        "typing.sys False True",
        "loader None None",
        "P(x=1) T(a=1) 1.5",
    ]


async def test_the_reviewers_memfd_flood_through_random_os_fails_with_the_guards_on() -> None:
    code = "import random\nos = random._os\nfd = os.memfd_create('m')\nos.write(fd, b'x' * (16 << 20))"
    result = await run_sandboxed(code, limits=LIMITS, settings=PROCESS)
    assert not result.ok and "has no attribute 'memfd_create'" in result.error


# -- the uid range -----------------------------------------------------------------------------------


def test_the_default_uid_range_is_above_usual_subuid_ranges_and_fits_uid_t() -> None:
    planning = PlanningSettings()
    assert planning.sandbox_uid_base >= 2_000_000_000  # useradd allocates subuids from 100000 upwards
    assert planning.sandbox_uid_base + planning.sandbox_uid_span < 2**31  # even for signed-int tools
    with pytest.raises(ValueError, match="must stay below 4294967294"):
        PlanningSettings(sandbox_uid_base=4_294_000_000, sandbox_uid_span=1_000_000)


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are drawn only when Colony is root")
async def test_a_uid_range_meeting_subuid_ranges_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\nbob:165536:65536\n")
    assert sandbox_os.subid_overlaps(150_000, 10, (str(subuid),)) == [f"{subuid}: alice:100000:65536"]
    assert sandbox_os.subid_overlaps(2_000_000_000, 10, (str(subuid),)) == []
    monkeypatch.setattr(sandbox_os, "SUBID_FILES", (str(subuid),))
    with pytest.raises(InvalidArgument, match="overlaps subordinate id ranges"):
        sandbox_os.pick_uid(100_000, 1_000_000)
    old_default = PlanningSettings(
        sandbox_isolation="process", sandbox_uid_base=100_000, sandbox_uid_span=1_000_000
    )
    result = await run_sandboxed("print(1)", limits=LIMITS, settings=old_default)
    assert not result.ok and "alice:100000:65536" in result.error and result.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are drawn only when Colony is root")
async def test_a_uid_some_process_already_runs_as_is_never_drawn_nor_swept() -> None:
    base = 2_100_000_000
    stranger = subprocess.Popen(["sleep", "60"], user=base, group=base)  # noqa: ASYNC220
    try:
        assert {sandbox_os.pick_uid(base, 2) for _ in range(30)} == {base + 1}
        settings = PlanningSettings(
            sandbox_isolation="process", sandbox_cgroups="off", sandbox_uid_base=base, sandbox_uid_span=2
        )
        result = await run_sandboxed("print(1)", limits=LIMITS, settings=settings)
        assert result.ok and result.uid == base + 1
        assert stranger.poll() is None  # the uid sweep after the run did not meet it
    finally:
        stranger.kill()
        stranger.wait()


# -- protocol values that could not leave Colony -------------------------------------------------------

CALL_A = repr(b'{"kind":"call","action":"echo","params":{"a":')
PAYLOADS = {  # Python expressions the program writes on its protocol pipe
    "lone surrogate": repr(rb'{"kind":"call","action":"echo","params":{"\ud800":"\udfff"}}'),
    "surrogate action": repr(rb'{"kind":"call","action":"\ud800x","params":{}}'),
    "surrogate error": repr(rb'{"kind":"done","ok":false,"error":"\ud800"}'),
    "NaN": repr(b'{"kind":"call","action":"echo","params":{"x":NaN,"y":-Infinity}}'),
    "deep": f"{CALL_A} + b'[' * 900 + b']' * 900 + b'}}}}'",
    "very deep": f"{CALL_A} + b'[' * 200000 + b']' * 200000 + b'}}}}'",
    "invalid utf-8": repr(b'{"kind":"call","action":"echo","params":{"x":"\xff"}}'),
    # found by review: `1e999` came through as infinity, which no longer serialises as JSON ...
    "beyond a float": repr(b'{"kind":"call","action":"echo","params":{"x":1e999,"y":-1e999}}'),
    # ... and a megabyte of small values was tens of megabytes parsed in the replica
    "too many values": f"{CALL_A} + b'[' + b'0,' * 60000 + b'0]}}}}'",
}


@pytest.mark.parametrize("payload", list(PAYLOADS.values()), ids=list(PAYLOADS))
async def test_protocol_values_json_cannot_carry_are_a_protocol_violation(payload: str) -> None:
    seen = []

    async def echo(**params: object) -> object:
        seen.append(params)
        return params

    code = f"import os, sys\nos.write(int(sys.argv[2]), {payload} + b'\\n')\nos.read(int(sys.argv[1]), 100)\n"
    limits = LIMITS.model_copy(update={"max_message_bytes": 2 << 20})
    result = await run_sandboxed(
        code, actions={"echo": echo}, limits=limits, settings=PROCESS, python_guards=False
    )
    assert not result.ok and result.error.startswith("the program broke the action-call protocol")
    assert seen == [] and result.calls == []
    json.loads(result.model_dump_json())  # what reaches Redis and the API serialises


async def test_what_a_program_sends_is_bounded_in_all_and_recorded_in_short() -> None:
    """Found by review: each message was bounded but not their sum (the replica parsed until the
    wall-clock limit) and every call's parameters were kept whole in the run's state."""
    seen: list[int] = []

    async def echo(**params: object) -> object:
        seen.append(len(str(params)))
        return "ok"

    code = "for _ in range(40):\n    run('echo', x='a' * 10000)\n"
    limits = LIMITS.model_copy(update={"max_total_message_bytes": 64 * 1024})
    result = await run_sandboxed(code, actions={"echo": echo}, limits=limits, settings=PROCESS)
    assert not result.ok and "more than 65536 bytes of messages in all" in (result.error or "")
    assert 1 <= len(seen) < 10
    recorded = result.calls[0].parameters
    assert recorded["_chars"] > 10000 and len(json.dumps(recorded)) < 1200  # the action got it whole
    assert seen[0] > 10000

    forged = (  # a final message claiming setup failed, with a megabyte of error, then exit 1
        "import os, sys\n"
        "os.write(int(sys.argv[2]), b'{\"kind\":\"done\",\"ok\":false,\"setup\":true,\"error\":\"' "
        "+ b'A' * 500000 + b'\"}\\n')\nos._exit(1)\n"
    )
    result = await run_sandboxed(forged, limits=LIMITS, settings=PROCESS, python_guards=False)
    assert not result.ok and len(result.error or "") < 4200


EVERY_KIND_OF_CALL = """
import os
def tried(what, call):
    try:
        call()
        print(what, "ALLOWED")
    except Exception as exc:
        print(what, type(exc).__name__, getattr(exc, "errno", None))
tried("open", lambda: open("/etc/ld.so.cache", "rb"))
tried("listdir", lambda: os.listdir("/"))
tried("fork", os.fork)
tried("socket", lambda: __import__("socket").socket())
tried("memfd", lambda: os.memfd_create("m"))
tried("pipe", os.pipe)
tried("kill", lambda: os.kill(1, 0))
tried("getcwd", os.getcwd)
tried("import", lambda: __import__("xml.dom.minidom"))
print("computing", sum(i * i for i in range(1000)))
"""


@BOTH
async def test_the_seccomp_allowlist_refuses_everything_but_the_allowed_work(
    settings: PlanningSettings,
) -> None:
    """Deny by default, in the kernel, so it holds for a program past the Python guards (run here
    without them, with the real `os`): no file opened (nor a module imported from disk), no
    directory listed, no process, pipe, socket or memfd made, no signal to another process; the
    computation and its output go on."""
    result = await run_sandboxed(EVERY_KIND_OF_CALL, limits=LIMITS, settings=settings, python_guards=False)
    assert result.ok, result.error
    lines = result.stdout.splitlines()
    assert lines[-1] == "computing 332833500" and "ALLOWED" not in result.stdout
    for line in lines[:-1]:
        what, kind, errno = line.split()
        # EPERM from the filter; under process isolation the run's uid cannot read the stdlib, so a
        # module that was not loaded yet is not found before the filter is asked
        assert (kind, errno) == ("PermissionError", "1") or (
            what in ("socket", "import") and kind == "ModuleNotFoundError"
        ), line


def test_the_allowlists_syscall_numbers_are_the_kernels() -> None:
    """The numbers in the child's table against the kernel headers (linux-libc-dev, which
    `.ci/system-packages test` installs): x86_64's own table, and the generic one aarch64 uses."""
    import re

    from colony.planning.sandbox_child import ALLOWED_SYSCALLS

    def table(path: str) -> dict[str, int]:
        text = Path(path).read_text()
        return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}

    x86_64 = table(
        "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
        if Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").exists()
        else "/usr/include/asm/unistd_64.h"
    )
    generic = table("/usr/include/asm-generic/unistd.h")
    for name, (on_x86_64, on_aarch64) in ALLOWED_SYSCALLS.items():
        assert x86_64[name] == on_x86_64, name
        assert generic["fstatat" if name == "newfstatat" else name] == on_aarch64, name


def run_bpf(program: list[tuple[int, int, int, int]], data: bytes) -> int:
    """The classic-BPF subset the filter uses (ld abs word, jeq, jge, jset, ret), run on a
    seccomp_data buffer: what the kernel would answer."""
    import struct

    pc, acc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if hit else jf
        else:
            raise AssertionError(f"instruction {code:#x} not simulated")
        pc += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_passes_exactly_the_allowlist_and_tgkill_to_itself_only(machine: str) -> None:
    import struct

    from colony.planning.sandbox_child import ALLOWED_SYSCALLS, SECCOMP_ARCH, _seccomp_program

    arch, column = SECCOMP_ARCH[machine]
    program = _seccomp_program(machine, "allowlist", own_pid=4242)
    allow, eperm, kill = 0x7FFF0000, 0x00050001, 0x80000000

    def verdict(nr: int, *args: int, audit_arch: int = arch) -> int:
        data = struct.pack("<iIQ6Q", nr, audit_arch, 0, *(list(args) + [0] * 6)[:6])
        return run_bpf(program, data)

    allowed = {pair[column] for pair in ALLOWED_SYSCALLS.values()}
    tgkill = ALLOWED_SYSCALLS["tgkill"][column]
    for nr in range(1000):
        expected = allow if nr in allowed else eperm
        assert verdict(nr, 4242) == expected, nr  # (tgkill aimed at itself here)
    assert verdict(tgkill, 1) == verdict(tgkill, 4243) == eperm  # another process: refused
    assert verdict(tgkill, 4242 | (1 << 32)) == eperm  # the pid's high half must be 0
    assert verdict(0x40000000 + 1) == eperm  # x32
    assert verdict(1, audit_arch=0x40000003) == kill  # another architecture's calls (i386)
    assert "newfstatat" not in ALLOWED_SYSCALLS  # it takes a path: metadata of any file


async def test_everyday_datetime_calls_work_under_the_guards_and_the_allowlist() -> None:
    code = (
        "import datetime\nd = datetime.date.today()\nprint(d.strftime('%Y') == str(d.year), "
        "datetime.datetime(2024, 1, 2).timetuple().tm_yday, datetime.datetime.now().year >= 2024)"
    )
    result = await run_sandboxed(code, limits=LIMITS, settings=BWRAP)
    assert result.ok, result.error
    assert result.stdout == "True 2 True\n"
