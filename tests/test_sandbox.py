"""The sandbox generated code runs in: a separate process sharing no Python object with Colony,
under bubblewrap (or process isolation where forced), action calls over a dedicated pipe.

Threat model: the program is hostile and has read Colony's source. Tests with
`python_guards=False` hand the program the real `os`, `socket` and `gc` modules, as if it had
defeated every in-process guard, and assert on what the OS lets happen: no file content, no
connection, no surviving process, no forged result.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from colony.config import PlanningSettings
from colony.planning import SandboxLimits, run_sandboxed
from colony.planning.sandbox_os import detect_bubblewrap, processes_of_uid

LIMITS = SandboxLimits(wall_seconds=5, cpu_seconds=2, memory_mb=512)
BWRAP = PlanningSettings(sandbox_isolation="bubblewrap")
PROCESS = PlanningSettings(sandbox_isolation="process")
# the layers beneath the Python guards and the seccomp allowlist, on their own (tests only)
BENEATH: dict[str, Any] = {"python_guards": False, "syscalls": "namespaces"}
BOTH = pytest.mark.parametrize("settings", [BWRAP, PROCESS], ids=["bubblewrap", "process"])
BWRAP_DEVICES = {"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout"}
BWRAP_DEVICES |= {"tty", "urandom", "zero"}  # bwrap's minimal /dev: no disks, no kmsg, no kvm
REPO = Path(__file__).resolve().parents[1]
SECRET = f"parent-secret-{uuid.uuid4().hex}"


async def add(a: int, b: int) -> int:
    return a + b


async def fail() -> None:
    raise ValueError("nope")


async def holds_secret() -> str:
    """An action whose closure and globals hold a secret: the program must never see it."""
    return "nothing for you" if SECRET else ""


def host_has(path: Path) -> bool:
    return path.exists()


def everything(result: Any) -> str:
    return f"{result.stdout}\n{result.stderr}\n{result.error}"


def sandbox_pids() -> set[int]:
    """Non-root processes running the sandbox child (seen from this, the parent's, side)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
        state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
        if b"sandbox_child.py" in cmdline and uid != 0 and state != "Z":
            pids.add(int(entry))
    return pids


# -- an honest program -------------------------------------------------------------------------


@BOTH
async def test_program_calls_actions_in_the_parent(settings: PlanningSettings) -> None:
    code = (
        "x = run('add', a=2, b=3)\nprint('x =', x)\n"
        "try:\n    run('fail')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    result = await run_sandboxed(code, actions={"add": add, "fail": fail}, limits=LIMITS, settings=settings)
    assert result.ok, result.error
    assert result.isolation == settings.sandbox_isolation
    assert [(c.action_key, c.success) for c in result.calls] == [("add", True), ("fail", False)]
    assert result.calls[0].parameters == {"a": 2, "b": 3} and result.calls[0].output == 5
    assert result.stdout == "x = 5\nfail failed: ValueError: nope\n"


HONEST = """
import dataclasses, datetime, decimal, enum, functools, json, statistics
@dataclasses.dataclass
class Point:
    x: int
    y: int = 2
class Color(enum.Enum):
    RED = 1
@functools.lru_cache
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
day = datetime.datetime.strptime('2020-01-02', '%Y-%m-%d').date()
print(Point(1), Color.RED.name, fib(20), statistics.mean([1, 2, 3]), decimal.Decimal('1.1') * 3, day)
print(json.dumps(run('add', a=fib(10), b=1)))
"""


@BOTH
async def test_an_honest_program_uses_the_allowed_modules(settings: PlanningSettings) -> None:
    result = await run_sandboxed(HONEST, actions={"add": add}, limits=LIMITS, settings=settings)
    assert result.ok, everything(result)
    assert result.stdout == "Point(x=1, y=2) RED 6765 2 3.3 2020-01-02\n56\n"


async def test_isolation_is_bubblewrap_here_and_process_when_forced_off() -> None:
    detection = await detect_bubblewrap()
    assert detection.available, detection.reason  # CI installs bubblewrap (.ci/run)
    auto = await run_sandboxed("print(1)", limits=LIMITS)
    assert auto.ok and auto.isolation == "bubblewrap"
    forced = await run_sandboxed("print(1)", limits=LIMITS, settings=PROCESS)
    assert forced.ok and forced.isolation == "process"


async def test_program_runs_as_a_fresh_unprivileged_uid_when_colony_is_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("uids are only switched when Colony runs as root")
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())"
    first = await run_sandboxed(code, limits=LIMITS, **BENEATH)
    second = await run_sandboxed(code, limits=LIMITS, **BENEATH)
    assert first.ok, first.error
    assert first.stdout.strip() == f"{first.uid} {first.uid} []" and first.uid != 0
    assert first.uid != second.uid  # one uid per run: RLIMIT_NPROC and kills count only its processes


@BOTH
async def test_rlimits_uid_and_capabilities_are_in_place_before_the_program_starts(
    settings: PlanningSettings,
) -> None:
    code = (
        "import os, resource, sys\n"
        "for name in ('CPU', 'AS', 'FSIZE', 'CORE', 'NPROC'):\n"
        "    print(name, resource.getrlimit(getattr(resource, 'RLIMIT_' + name))[0])\n"
        "print('bubblewrap' if not os.path.exists('/proc/self/status') else\n"
        "      [x for x in open('/proc/self/status').read().splitlines() if x.startswith('CapEff')][0])\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    limits = LIMITS.model_copy(
        update={"cpu_seconds": 3, "memory_mb": 300, "scratch_mb": 5, "max_processes": 6}
    )
    result = await run_sandboxed(
        code,
        limits=limits,
        settings=settings,
        **BENEATH,
    )
    assert result.ok, everything(result)
    lines = result.stdout.splitlines()
    assert lines[:4] == ["CPU 3", f"AS {300 * 1024 * 1024}", f"FSIZE {5 * 1024 * 1024}", "CORE 0"]
    if os.geteuid() == 0:
        assert lines[4] == "NPROC 6"
    assert lines[5] == ("bubblewrap" if settings is BWRAP else "CapEff:\t0000000000000000")
    assert result.stderr == "to stderr\n"  # stderr is captured apart, as plain text


async def test_without_root_bwrap_maps_the_program_to_nobody_in_a_user_namespace() -> None:
    from colony.planning import sandbox_os

    argv = sandbox_os.bubblewrap_argv(uid=None, scratch_mb=1)
    assert "--unshare-all" in argv and argv[argv.index("--uid") + 1] == "65534"
    argv = [
        *argv[: argv.index("--") + 1],
        sandbox_os.interpreter(),
        "-I",
        "-S",
        "-c",
        "import os; print(os.getuid())",
    ]
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, env={})
    out, _ = await process.communicate()
    assert process.returncode == 0 and out.strip() == b"65534"


# -- Python-level guards (defence in depth) ------------------------------------------------------


@pytest.mark.parametrize(
    "code,expected",
    [
        ("import os", "import of 'os' is not allowed"),
        ("print(open('/etc/passwd').read())", "'open' is not defined"),
        ("__import__('socket')", "import of 'socket' is not allowed"),
        ("import gc", "import of 'gc' is not allowed"),
        ("while True:\n    pass", "CPU-time limit"),
        ("x = bytearray(4 * 1024 ** 3)", "memory limit"),
        (
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
            ".__init__.__globals__['system']('echo pwned')",
            "KeyError: 'system'",  # os.system is gone from the os module (and its audit event refused)
        ),
        ("run('rm_rf')", "unknown action 'rm_rf'"),
        ("def f():\n    pass\nf.__code__ = (lambda: 1).__code__", "'__code__' is not allowed"),
        ("g = (i for i in [1])\nprint(g.gi_frame)", "'gi_frame' is not allowed"),
    ],
    ids=[
        "import os",
        "open",
        "socket",
        "gc",
        "infinite loop",
        "4 GB",
        "subclass escape",
        "unknown action",
        "code swap",
        "generator frame",
    ],
)
async def test_escapes_and_runaways_are_stopped_with_a_clear_error(code: str, expected: str) -> None:
    limits = LIMITS.model_copy(update={"wall_seconds": 20, "cpu_seconds": 1})  # CPU time, even on a busy box
    started = time.monotonic()
    result = await run_sandboxed(code, actions={"add": add}, limits=limits)
    assert not result.ok and expected in (result.error or "")
    assert time.monotonic() - started < limits.wall_seconds


HOOK_SWITCH_OFF = """
g = run.__globals__
# the escape that worked before: rewrite the hook's and the import guard's module-level config
for name in ('BLOCKED_EVENTS', 'ALLOWED_MODULES'):
    if name in g:
        g[name] = ('nothing-blocked',) if name == 'BLOCKED_EVENTS' else frozenset({'os', 'socket'})
b = g['__builtins__']
imp = b['__import__'] if isinstance(b, dict) else b.__import__
os = imp('os')
opener = b['open'] if isinstance(b, dict) else b.open
print('PASSWD', opener('/etc/passwd').read())
"""


@BOTH
async def test_escape_through_the_provided_callables_reaches_nothing(settings: PlanningSettings) -> None:
    result = await run_sandboxed(HOOK_SWITCH_OFF, limits=LIMITS, settings=settings)
    assert not result.ok and "PASSWD" not in result.stdout and "root:" not in everything(result)
    # the child's module globals are emptied before the program starts: nothing to rewrite there
    assert "not allowed" in result.error or "No such file" in result.error or "'__builtins__'" in result.error


LEAK_PROBE = """
names = set()
try:
    names |= set(run.__globals__)
    names |= {repr(c.cell_contents)[:200] for c in run.__closure__ or ()}
except Exception as e:
    names.add(repr(e))
try:
    names.add(repr(print.__self__)[:100])
except Exception as e:
    names.add(repr(e))
for c in ().__class__.__base__.__subclasses__():
    names.add(f"{c.__module__}.{c.__qualname__}")
print(sorted(names))
"""


@BOTH
async def test_callables_closures_and_subclasses_lead_to_no_colony_object(settings: PlanningSettings) -> None:
    result = await run_sandboxed(LEAK_PROBE, actions={"hold": holds_secret}, limits=LIMITS, settings=settings)
    assert result.ok, result.error
    seen = result.stdout
    assert "builtins.object" in seen or "builtins.type" in seen  # the walk did run
    for parent_only in ("colony.", "pydantic", "redis", "ray.", "run_sandboxed", "SandboxCall", SECRET):
        assert parent_only not in seen


async def test_frames_through_tracebacks_are_refused() -> None:
    code = (
        "def f():\n    1 / 0\n"
        "try:\n    f()\nexcept ZeroDivisionError as e:\n    frame = e.__traceback__.tb_frame\n"
        "while frame.f_back:\n    frame = frame.f_back\nprint(sorted(frame.f_globals))\n"
    )
    result = await run_sandboxed(code, limits=LIMITS)
    assert not result.ok and "'tb_frame' is not allowed" in result.error


@BOTH
async def test_frames_and_gc_walks_find_nothing_of_the_parent(settings: PlanningSettings) -> None:
    code = (
        "import gc, sys\n"
        "def f():\n    1 / 0\n"
        "try:\n    f()\nexcept ZeroDivisionError as e:\n    frame = e.__traceback__.tb_frame\n"
        "seen = []\nwhile frame:\n    seen += list(frame.f_globals) + list(frame.f_locals)\n"
        "    frame = frame.f_back\n"
        "def text(o):\n    try:\n        return repr(o)[:200]\n    except Exception:\n        return '?'\n"
        "texts = [text(o) for o in gc.get_objects()]\n"
        "print(len(texts), 'objects')\nprint(seen)\nprint('\\n'.join(texts))\n"
    )
    limits = LIMITS.model_copy(update={"max_output_bytes": 8 * 1024 * 1024})
    result = await run_sandboxed(
        code, actions={"hold": holds_secret}, limits=limits, settings=settings, python_guards=False
    )
    assert result.ok, result.error
    assert int(result.stdout.split(" objects")[0]) > 1000 and "read_fd" in result.stdout
    for parent_only in (SECRET, "holds_secret", "SandboxCall", "pydantic", "redis"):
        assert parent_only not in result.stdout


# -- the protocol: results cannot be forged ------------------------------------------------------


@BOTH
async def test_non_json_and_forged_lines_on_stdout_are_just_output(settings: PlanningSettings) -> None:
    code = (
        "print('not json {')\n"
        'print(\'{"kind": "done", "ok": true, "error": null}\')\n'
        'print(\'{"done": true, "ok": true, "error": null, "stdout": ""}\')\n'
        "print('{raw garbage', flush=True)\n"
        "x = run('add', a=1, b=2)\nprint('x', x)\n"
        "raise ValueError('the real outcome')\n"
    )
    result = await run_sandboxed(code, actions={"add": add}, limits=LIMITS, settings=settings)
    assert not result.ok and result.error == "ValueError: the real outcome"
    assert "not json {" in result.stdout and "{raw garbage" in result.stdout and "x 3" in result.stdout
    assert [c.action_key for c in result.calls] == ["add"]


FORGE_ON_EVERY_FD = """
import os, sys, time
forged = b'{"kind": "done", "ok": true, "error": null, "calls": [{"action_key": "add", "success": true}]}\\n'
for fd in range(3, 64):
    try:
        os.write(fd, forged)
    except OSError:
        pass
"""


@BOTH
async def test_a_forged_ok_cannot_hide_a_timeout(settings: PlanningSettings) -> None:
    code = FORGE_ON_EVERY_FD + "time.sleep(60)\n"
    limits = LIMITS.model_copy(update={"wall_seconds": 2})
    result = await run_sandboxed(code, limits=limits, settings=settings, python_guards=False)
    assert not result.ok and "wall-clock limit" in result.error and result.calls == []


@BOTH
async def test_a_forged_ok_cannot_hide_a_kill(settings: PlanningSettings) -> None:
    code = FORGE_ON_EVERY_FD + "os.kill(os.getpid(), 9)\n"
    result = await run_sandboxed(
        code,
        limits=LIMITS,
        settings=settings,
        **BENEATH,
    )
    # whether or not a forged final message got through the pipe first, the kill decides
    assert not result.ok and "signal 9" in result.error
    assert "did not exit cleanly" in result.error or "ended without a result" in result.error
    assert result.calls == []  # the forged "calls" list is ignored: calls are the parent's own record


@BOTH
@pytest.mark.parametrize(
    "payload,expected",
    [
        ("b'garbage\\n'", "not JSON"),
        ("b'[1, 2]\\n'", "neither a call nor done"),
        ('b\'{"kind": "call", "action": 5}\\n\'', "without a string action"),
        ('b\'{"kind": "done", "ok": "yes"}\\n\'', "without a boolean ok"),
        ("b'x' * (2 * 1024 * 1024)", "over 1048576 bytes"),
    ],
    ids=["garbage", "list", "bad call", "bad done", "huge"],
)
async def test_garbage_on_the_protocol_pipe_is_a_failed_result(
    settings: PlanningSettings, payload: str, expected: str
) -> None:
    code = (
        f"import os, sys\ndata = {payload}\nwhile data:\n    data = data[os.write(int(sys.argv[2]), data):]\n"
    )
    result = await run_sandboxed(code, limits=LIMITS, settings=settings, python_guards=False)
    assert not result.ok and "broke the action-call protocol" in result.error and expected in result.error


@BOTH
async def test_huge_output_crashes_and_signals_never_raise(settings: PlanningSettings) -> None:
    noisy = await run_sandboxed(
        "for _ in range(200):\n    print('y' * 100_000)\nprint('tail')", limits=LIMITS, settings=settings
    )
    assert noisy.ok and noisy.stdout.endswith("tail\n") and "earlier bytes dropped" in noisy.stdout
    assert len(noisy.stdout) < LIMITS.max_output_bytes + 100
    crash = await run_sandboxed(
        "import os\nos.kill(os.getpid(), 11)",
        limits=LIMITS,
        settings=settings,
        **BENEATH,
    )
    assert not crash.ok and "signal 11" in crash.error
    exits = await run_sandboxed("raise SystemExit(3)", limits=LIMITS, settings=settings)
    assert not exits.ok and "SystemExit: 3" in exits.error
    bad = await run_sandboxed("def (", limits=LIMITS, settings=settings)
    assert not bad.ok and "SyntaxError" in bad.error
    oversized = await run_sandboxed("x = 1\n" * 100_000, limits=LIMITS, settings=settings)
    assert not oversized.ok and "at most 262144 bytes" in oversized.error


# -- OS-level isolation: what holds when the program has `os` --------------------------------------


@BOTH
async def test_a_daemonised_grandchild_does_not_survive_the_run(settings: PlanningSettings) -> None:
    seen: list[set[int]] = []

    async def probe() -> int:
        await asyncio.sleep(0.2)  # let the grandchild settle into its own session
        seen.append(sandbox_pids())
        return len(seen[-1])

    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        while True:\n            time.sleep(1)\n    os._exit(0)\n"
        "time.sleep(0.2)\nprint('processes', run('probe'))\ntime.sleep(60)\n"
    )
    limits = LIMITS.model_copy(update={"wall_seconds": 3})
    if settings is PROCESS and os.geteuid() != 0:
        # without root, process isolation has no uid of its own, no cgroup and no pid namespace to
        # find a daemonised grandchild by: the seccomp allowlist, which refuses the fork, stops it
        held = await run_sandboxed(
            code, actions={"probe": probe}, limits=limits, settings=settings, python_guards=False
        )
        assert not held.ok and "Operation not permitted" in held.error + held.stderr and not seen, everything(
            held
        )
        return
    result = await run_sandboxed(
        code,
        actions={"probe": probe},
        limits=limits,
        settings=settings,
        **BENEATH,
    )
    assert not result.ok and "wall-clock limit" in result.error
    assert len(seen) == 1 and len(seen[0]) >= 2, seen  # the program and its daemonised grandchild
    await asyncio.sleep(0.3)
    assert not (seen[0] & sandbox_pids()), "a sandboxed process survived the run"
    if result.uid is not None:
        assert processes_of_uid(result.uid) == []


@BOTH
async def test_a_fork_bomb_hits_the_process_limit_and_dies(settings: PlanningSettings) -> None:
    code = (
        "import os, time\nrefused = 0\n"
        "for _ in range(200):\n    try:\n        if os.fork() == 0:\n            time.sleep(60)\n"
        "            os._exit(0)\n    except OSError as e:\n        refused += 1\n        last = e.errno\n"
        "print('refused', refused, 'errno', last)\n"
    )
    limits = LIMITS.model_copy(update={"wall_seconds": 4, "max_processes": 8})
    result = await run_sandboxed(
        code,
        limits=limits,
        settings=settings,
        **BENEATH,
    )
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC is only applied with a uid of the sandbox's own (Colony as root)")
    assert "refused" in result.stdout and "errno 11" in result.stdout, everything(result)
    assert int(result.stdout.split()[1]) >= 200 - limits.max_processes
    await asyncio.sleep(0.3)
    assert processes_of_uid(result.uid) == []


async def test_no_network_even_to_localhost() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):\n"
        "    s = socket.socket(family)\n    s.settimeout(2)\n"
        f"    try:\n        s.connect((host, {port}))\n        print('CONNECTED', host)\n"
        "    except OSError as e:\n        print('FAILED', host, e)\n"
    )
    try:
        result = await run_sandboxed(
            code,
            limits=LIMITS,
            settings=BWRAP,
            **BENEATH,
        )
        assert result.isolation == "bubblewrap" and result.ok, everything(result)
        assert "CONNECTED" not in result.stdout and result.stdout.count("FAILED") == 2
        with pytest.raises(BlockingIOError):
            server.accept()  # the listening socket saw no connection
    finally:
        server.close()


async def test_process_isolation_alone_does_not_hide_the_host() -> None:
    """Why the policy refuses process isolation by default: past the Python guards, the host is there."""
    code = "import os\nfd = os.open('/etc/passwd', os.O_RDONLY)\nprint(os.read(fd, 5).decode())"
    result = await run_sandboxed(
        code,
        limits=LIMITS,
        settings=PROCESS,
        **BENEATH,
    )
    assert result.ok and result.stdout == "root:\n", everything(result)
    guarded = await run_sandboxed(code, limits=LIMITS, settings=PROCESS)
    assert not guarded.ok and "import of 'os' is not allowed" in guarded.error


async def test_files_outside_the_runtime_and_the_scratch_tmpfs_are_invisible() -> None:
    marker = f"colony-sandbox-{uuid.uuid4().hex}"
    secret_file = Path.home() / f".{marker}"
    secret_file.write_text(SECRET)
    readme = REPO / "README.md"
    code = (
        "import os\nout = []\n"
        f"for path in ('/etc/passwd', {str(readme)!r}, {str(secret_file)!r}, '/proc/1/environ'):\n"
        "    try:\n        out.append(open(path).read())\n    except OSError as e:\n"
        "        out.append(f'refused {path}: {e.strerror}')\n"
        f"for path in ({str(REPO / marker)!r}, '/{marker}', '/root/{marker}', '/usr/{marker}'):\n"
        "    try:\n        open(path, 'w').write('x')\n        out.append(f'WROTE {path}')\n"
        "    except OSError as e:\n        out.append(f'refused {path}: {e.strerror}')\n"
        f"open('/tmp/{marker}', 'w').write('scratch')\nout.append(open('/tmp/{marker}').read())\n"
        "out.append(' '.join(sorted(os.listdir('/etc'))))\n"
        "out.append(' '.join(sorted(os.listdir('/dev'))))\n"
        "try:\n"  # $HOME: only the interpreter's path under it, or not there at all
        f"    out.append(str(sorted(os.listdir({str(Path.home())!r}))))\n"
        "except OSError as e:\n    out.append(f'no home: {e.strerror}')\n"
        "print('\\n'.join(out))\n"
    )
    try:
        result = await run_sandboxed(
            code,
            limits=LIMITS,
            settings=BWRAP,
            **BENEATH,
        )
    finally:
        secret_file.unlink()
    assert result.ok, everything(result)
    assert "root:" not in result.stdout and SECRET not in result.stdout and "Colony" not in result.stdout
    assert result.stdout.count("refused") == 8 and "WROTE" not in result.stdout
    assert "scratch" in result.stdout  # the tmpfs works ...
    assert not host_has(Path(f"/tmp/{marker}")) and not host_has(REPO / marker)  # ... and vanishes
    assert marker not in result.stdout.splitlines()[-1]  # $HOME shows only the interpreter's path
    devices = set(result.stdout.splitlines()[-2].split())
    assert "null" in devices and devices <= BWRAP_DEVICES
    assert result.stdout.splitlines()[-3] == "ld.so.cache"  # /etc holds where libraries are, nothing else


async def test_the_scratch_tmpfs_is_capped() -> None:
    code = (
        "try:\n    open('/tmp/big', 'wb').write(b'x' * (8 * 1024 * 1024))\nexcept OSError as e:\n    print(e)"
    )
    limits = LIMITS.model_copy(update={"scratch_mb": 2})
    result = await run_sandboxed(code, limits=limits, settings=BWRAP, **BENEATH)
    assert result.ok and ("No space left" in result.stdout or "File too large" in result.stdout)


async def test_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLONY_API_TOKEN", "secret-token")
    code = "import os\nprint(dict(os.environ))"
    for settings in (BWRAP, PROCESS):
        result = await run_sandboxed(code, limits=LIMITS, settings=settings, python_guards=False)
        assert result.ok and "secret-token" not in result.stdout and "COLONY" not in result.stdout


async def test_wall_clock_limit_stops_a_sleeping_program() -> None:
    async def slow() -> None:
        await asyncio.sleep(10)

    result = await run_sandboxed("run('slow')", actions={"slow": slow}, limits=SandboxLimits(wall_seconds=1))
    assert not result.ok and "wall-clock limit" in result.error


async def test_without_bubblewrap_nothing_runs_unless_weak_isolation_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from colony.planning import sandbox_os

    monkeypatch.setenv("PATH", "/nonexistent")
    fresh = await sandbox_os.detect_bubblewrap(refresh=True)
    try:
        assert not fresh.available and "not installed" in fresh.reason
        result = await run_sandboxed("print(1)", limits=LIMITS, settings=BWRAP)
        assert not result.ok and result.isolation == "none" and "apt-get install bubblewrap" in result.error
        # `auto` where bubblewrap does not work: process isolation only when it is accepted
        refused = await run_sandboxed("print(1)", limits=LIMITS)
        assert not refused.ok and refused.isolation == "none" and "allow_weak_sandbox" in refused.error
        weak = await run_sandboxed(
            "print(1)", limits=LIMITS, settings=PlanningSettings(allow_weak_sandbox=True)
        )
        assert weak.ok and weak.isolation == "process"
    finally:
        monkeypatch.undo()
        assert (await sandbox_os.detect_bubblewrap(refresh=True)).available


async def test_calls_past_the_limit_are_refused_recorded_once_and_fail_the_run() -> None:
    code = (
        "n = 0\nfor _ in range(50):\n    try:\n        run('add', a=1, b=1)\n"
        "    except RuntimeError:\n        n += 1\nprint(n)"
    )
    limits = LIMITS.model_copy(update={"max_calls": 5})
    result = await run_sandboxed(code, actions={"add": add}, limits=limits)
    assert result.stdout == "45\n"  # the program caught every refusal and ended "fine": a limit was hit
    assert not result.ok and result.error == "the program made more than 5 action calls"
    assert [c.success for c in result.calls] == [True] * 5 + [False]
    assert result.calls[-1].error == "more than 5 action calls"


DIES_WITH_COLONY = """
import asyncio, sys
from colony.config import PlanningSettings
from colony.planning import SandboxLimits, run_sandboxed
code = "import time\\nprint('started', flush=True)\\ntime.sleep(60)"
asyncio.run(run_sandboxed(code, limits=SandboxLimits(wall_seconds=60, cpu_seconds=60),
                          settings=PlanningSettings(sandbox_isolation=sys.argv[1]), python_guards=False))
"""


@BOTH
async def test_the_sandbox_dies_with_colony(settings: PlanningSettings) -> None:
    before = sandbox_pids()
    colony = await asyncio.create_subprocess_exec(
        os.sys.executable, "-c", DIES_WITH_COLONY, settings.sandbox_isolation, cwd=REPO
    )
    try:
        started: set[int] = set()
        for _ in range(200):
            started = sandbox_pids() - before
            if started:
                break
            await asyncio.sleep(0.05)
        assert started, "the sandbox did not start"
    finally:
        colony.kill()  # SIGKILL: Colony gets no chance to clean up
        await colony.wait()
    for _ in range(100):
        if not started & sandbox_pids():
            break
        await asyncio.sleep(0.05)
    assert not started & sandbox_pids(), "the sandbox outlived the process that started it"


async def test_concurrent_programs_do_not_see_each_other() -> None:
    code = (
        "import os\nprint(os.getuid(), run('add', a=len(os.listdir('/tmp')), b=0))\n"
        "open('/tmp/mine', 'w').write('x')"
    )
    runs = [
        run_sandboxed(
            code,
            actions={"add": add},
            limits=LIMITS,
            settings=BWRAP,
            **BENEATH,
        )
        for _ in range(4)
    ]
    results = await asyncio.gather(*runs)
    assert all(r.ok for r in results), [everything(r) for r in results]
    assert all(r.stdout.split()[1] == "0" for r in results)  # each has its own empty /tmp
    if os.geteuid() == 0:
        assert len({r.uid for r in results}) == 4
