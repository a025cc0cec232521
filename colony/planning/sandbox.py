"""Run generated Python in an isolated child process and answer its action calls.

Why this shape: the program is hostile and has read this file. So it runs in a child that shares
no Python object with Colony (a fresh interpreter under bubblewrap, or a plain process where
bwrap is unavailable, see `sandbox_os`), and everything it can send back is treated as input:

- Action calls and the final verdict travel over a dedicated pipe pair, not stdout. stdout and
  stderr are captured as bounded plain text; a line there is never a message.
- The program can reach the pipe itself (it lives in the same process as the child's protocol
  code), so the parent validates every message and decides the result: `ok` needs a valid
  `done` message, a clean exit and no limit hit. A forged `done` gains nothing an honest program
  could not get by catching its own exceptions; a timeout, a kill or a protocol violation the
  parent observed always wins. Recorded calls are the parent's own record of what it dispatched.
- At the wall-clock limit (and after every run) the whole sandbox is killed: the bwrap process
  group (its pid namespace dies with it) or, in process isolation, the session plus every
  process of the run's uid.

`run_sandboxed` never raises for anything the program does; its failures are the result.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from colony.config import PlanningSettings
from colony.errors import InvalidArgument
from colony.planning import sandbox_os

Action = Callable[..., Awaitable[Any]]
MAX_ERROR_CHARS = 4000
Isolation = Literal["bubblewrap", "process", "none"]

ALLOWED_MODULES = (
    "json",
    "math",
    "re",
    "itertools",
    "functools",
    "collections",
    "statistics",
    "datetime",
    "random",
    "string",
    "typing",
    "dataclasses",
    "decimal",
    "fractions",
    "heapq",
    "bisect",
    "operator",
    "textwrap",
    "enum",
    "copy",
    "difflib",
    "unicodedata",
)

PIDS_OVERHEAD = 3  # the cgroup's pids.max adds the shell/bwrap processes and the child to max_processes
# imported lazily by allowed modules (datetime's strptime, date.today, strftime); loaded before
# the audit hook
PRELOAD_MODULES = ("_strptime", "time")


class SandboxLimits(BaseModel):
    wall_seconds: float = Field(10.0, gt=0, le=3600, description="wall-clock limit of one program")
    cpu_seconds: int = Field(5, ge=1, le=3600, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(
        512,
        ge=64,
        description="RLIMIT_AS of each process; with a cgroup, memory_mb + 2 * scratch_mb bounds all of them",
    )
    max_calls: int = Field(100, ge=1, description="action calls one program may make")
    max_processes: int = Field(
        8,
        ge=1,
        le=4096,
        description="RLIMIT_NPROC for the program's own uid; the cgroup's pids.max is this + 3",
    )
    scratch_mb: int = Field(
        16, ge=1, le=4096, description="size of each of /tmp and /dev/shm and RLIMIT_FSIZE"
    )
    max_output_bytes: int = Field(64 * 1024, ge=1024, description="stdout/stderr kept (the tail)")
    max_code_bytes: int = Field(256 * 1024, ge=1024, description="largest program accepted")
    max_message_bytes: int = Field(1024 * 1024, ge=1024, description="largest protocol message")
    max_total_message_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="protocol bytes one program may send in all"
    )


class SandboxCall(BaseModel):
    action_key: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    success: bool
    output: Any = None
    error: str | None = None
    seconds: float = 0.0


class SandboxResult(BaseModel):
    ok: bool
    error: str | None = None
    calls: list[SandboxCall] = Field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: Isolation = "none"
    uid: int | None = Field(None, description="the uid the program ran as (when Colony is root)")
    cgroup: str | None = Field(
        None, description="the run's own cgroup (memory.max, pids.max), where cgroups are usable"
    )


class _ProtocolError(Exception):
    """The program sent something on the protocol pipe that is not a valid message."""


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json")
        return repr(value)


async def resolve_isolation(settings: PlanningSettings) -> tuple[Isolation, str]:
    """(isolation that would be used, why) for these settings, probing bubblewrap once. Process
    isolation only when asked for: chosen (`planning.sandbox_isolation` "process"), or accepted
    where bubblewrap is unavailable (`planning.allow_weak_sandbox`); else nothing runs ("none")."""
    if settings.sandbox_isolation == "process":
        return "process", "process isolation was chosen in planning.sandbox_isolation"
    detection = await sandbox_os.detect_bubblewrap()
    if detection.available:
        return "bubblewrap", detection.reason
    if settings.sandbox_isolation == "bubblewrap":
        return "none", f"planning.sandbox_isolation is 'bubblewrap' but {detection.reason}"
    if not settings.allow_weak_sandbox:
        return "none", (
            f"bubblewrap is unavailable ({detection.reason}) and process isolation alone is not "
            "accepted: install bubblewrap, or set planning.allow_weak_sandbox "
            "(COLONY_PLANNING__ALLOW_WEAK_SANDBOX=true)"
        )
    return "process", detection.reason


class _Output:
    """The tail of one output stream, at most `cap` bytes, drained continuously."""

    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            self.data.extend(chunk)
            if len(self.data) > self.cap:
                self.dropped += len(self.data) - self.cap
                del self.data[: len(self.data) - self.cap]

    def text(self) -> str:
        body = self.data.decode("utf-8", errors="replace")
        return f"[{self.dropped} earlier bytes dropped]\n{body}" if self.dropped else body


MAX_MESSAGE_DEPTH = 32
MAX_MESSAGE_VALUES = 50_000  # of one message (found by review: a megabyte of `{}` was 20 MB parsed)
RECORDED_PARAMETER_CHARS = 4_000  # of a call's parameters kept in its record (the run's state)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number that fits a float (found by review: `1e999` passed as infinity)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:40]} is beyond a float")
    return number


def _check_value(value: Any, depth: int = 0, seen: list[int] | None = None) -> None:
    """Bounded nesting and size, and only what JSON (and Redis, and pydantic) can carry back out."""
    seen = seen if seen is not None else [0]
    seen[0] += 1
    if seen[0] > MAX_MESSAGE_VALUES:
        raise _ProtocolError(f"a message of more than {MAX_MESSAGE_VALUES} values")
    if depth > MAX_MESSAGE_DEPTH:
        raise _ProtocolError(f"a message nested deeper than {MAX_MESSAGE_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _ProtocolError("a message with a lone surrogate (not UTF-8 text)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_value(key, depth + 1, seen)
            _check_value(item, depth + 1, seen)
    elif isinstance(value, list):
        for item in value:
            _check_value(item, depth + 1, seen)


def recorded_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """A call's parameters as its record keeps them: whole up to RECORDED_PARAMETER_CHARS of JSON,
    else a preview (found by review: a program's 60 calls of a megabyte each made 70 MB of state)."""
    text = json.dumps(params, default=str)
    if len(text) <= RECORDED_PARAMETER_CHARS:
        return params
    return {"_preview": text[: RECORDED_PARAMETER_CHARS // 4] + "...", "_chars": len(text)}


def _message(line: bytes) -> dict[str, Any]:
    """One protocol message, validated: strict UTF-8 JSON, no NaN/Infinity (nor numbers beyond a
    float), bounded depth and size, no surrogates."""
    try:
        message = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _ProtocolError(f"a message that is not JSON ({str(exc)[:200]})") from None
    _check_value(message)
    if not isinstance(message, dict) or message.get("kind") not in ("call", "done"):
        raise _ProtocolError("a message that is neither a call nor done")
    return message


async def run_sandboxed(
    code: str,
    *,
    actions: Mapping[str, Action] | None = None,
    limits: SandboxLimits | None = None,
    settings: PlanningSettings | None = None,
    python_guards: bool = True,
    syscalls: Literal["allowlist", "namespaces"] = "allowlist",
) -> SandboxResult:
    """Run `code` in a fresh sandbox; never raises for anything the program does.

    `python_guards=False` leaves out the in-process import allow-list and audit hook, and
    `syscalls="namespaces"` swaps the seccomp allowlist for a filter that refuses only new
    namespaces and memfds, so tests can show what each layer beneath stops (files, processes,
    network, memory); production callers keep the defaults.
    """
    limits = limits or SandboxLimits()
    settings = settings or PlanningSettings()
    actions = dict(actions or {})
    started = time.perf_counter()
    launch = await _plan_launch(code, limits, settings)
    if isinstance(launch, SandboxResult):
        return launch
    try:
        fds = _open_pipes()
    except OSError as exc:  # out of file descriptors: the host's problem, reported, not raised
        if launch.cgroup is not None:
            launch.cgroup.remove()
        return SandboxResult(
            ok=False, error=f"the sandbox could not be started: {exc}", isolation=launch.isolation
        )
    to_child_r, to_child_w, from_child_r, from_child_w = fds
    result = SandboxResult(
        ok=False,
        isolation=launch.isolation,
        uid=launch.uid,
        cgroup=launch.cgroup and launch.cgroup.name,
    )
    try:
        process = await _spawn(launch.argv, to_child_r, from_child_w)
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        result.error = f"the sandbox could not be started: {exc}"
        if launch.cgroup is not None:
            launch.cgroup.remove()
        result.seconds = time.perf_counter() - started
        return result
    os.close(to_child_r)
    os.close(from_child_w)
    request = {
        "code": code,
        "limits": limits.model_dump(),
        "actions": sorted(actions),
        "allowed_modules": ALLOWED_MODULES,
        "preload": PRELOAD_MODULES,
        "uid": launch.uid,
        "nproc": launch.uid is not None,  # a uid of the run's own: RLIMIT_NPROC counts only its processes
        "guards": python_guards,
        "syscalls": syscalls,
        "die_with_parent": launch.isolation == "process",
    }
    await _supervise(process, launch, (from_child_r, to_child_w), request, actions, limits, result)
    result.seconds = time.perf_counter() - started
    return result


@dataclass
class _Launch:
    """How a run is started: its isolation, the uid it runs as, the command line and its cgroup."""

    isolation: Isolation
    uid: int | None
    argv: list[str]
    cgroup: sandbox_os.RunCgroup | None


async def _plan_launch(
    code: str, limits: SandboxLimits, settings: PlanningSettings
) -> _Launch | SandboxResult:
    """How to start `code`, or the result saying why it is not run (too large, no isolation to be
    had, no uid or cgroup for it)."""
    if not isinstance(code, str) or len(code.encode("utf-8", errors="replace")) > limits.max_code_bytes:
        return SandboxResult(
            ok=False, error=f"the program must be text of at most {limits.max_code_bytes} bytes"
        )
    isolation, why = await resolve_isolation(settings)
    if isolation == "none":
        return SandboxResult(ok=False, error=f"the program was not run: {why}", isolation="none")
    try:
        uid = sandbox_os.pick_uid(settings.sandbox_uid_base, settings.sandbox_uid_span)
    except InvalidArgument as exc:
        return SandboxResult(ok=False, error=f"the program was not run: {exc}", isolation=isolation)
    if isolation == "bubblewrap":
        argv = sandbox_os.bubblewrap_argv(uid=uid, scratch_mb=limits.scratch_mb)
    else:
        argv = sandbox_os.process_argv()
    try:
        cgroup = _make_cgroup(settings, limits)
    except InvalidArgument as exc:
        return SandboxResult(ok=False, error=f"the program was not run: {exc}", isolation=isolation)
    if cgroup is not None:
        argv = cgroup.enter_argv(argv)
    return _Launch(isolation, uid, argv, cgroup)


def _open_pipes() -> list[int]:
    """The protocol's two pipes, (to child: read, write, from child: read, write); raises OSError
    with none of them left open."""
    fds: list[int] = []
    try:
        for _ in range(2):
            fds.extend(os.pipe())
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


async def _spawn(argv: list[str], to_child_r: int, from_child_w: int) -> asyncio.subprocess.Process:
    """The sandbox's process, in a session of its own with an empty environment, handed the
    protocol pipe ends it reads and writes as its last two arguments."""
    return await asyncio.create_subprocess_exec(
        *argv,
        str(to_child_r),
        str(from_child_w),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={},
        pass_fds=(to_child_r, from_child_w),
        start_new_session=True,
        cwd="/",
    )


async def _supervise(
    process: asyncio.subprocess.Process,
    launch: _Launch,
    pipes: tuple[int, int],
    request: dict[str, Any],
    actions: Mapping[str, Action],
    limits: SandboxLimits,
    result: SandboxResult,
) -> None:
    """Converse with the started program over `pipes` (from the child, to it) within the
    wall-clock limit, then kill the whole sandbox; fill `result` with the verdict and the output."""
    from_child_r, to_child_w = pipes
    outputs = (_Output(limits.max_output_bytes), _Output(limits.max_output_bytes))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limits.max_message_bytes, loop=loop)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(from_child_r, "rb", 0)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(to_child_w, "wb", 0)
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    drains = [
        asyncio.create_task(out.drain(s))
        for out, s in zip(outputs, (process.stdout, process.stderr), strict=True)
    ]
    try:
        await asyncio.wait_for(
            _converse(process, reader, writer, request, actions, limits, result), limits.wall_seconds
        )
    except TimeoutError:
        result.ok = False
        result.error = (
            f"the sandboxed program ran past its {limits.wall_seconds}s wall-clock limit and was stopped"
        )
    except Exception as exc:  # whatever the program provoked becomes its result
        result.ok = False
        result.error = f"the sandbox failed: {type(exc).__name__}: {exc}"
    finally:
        await _terminate(process, launch.isolation, launch.uid, launch.cgroup)
        if launch.cgroup is not None:
            _judge_memory(launch.cgroup, limits, result)
            launch.cgroup.remove()
        read_transport.close()
        write_transport.close()
        await asyncio.wait(drains, timeout=2)
        for task in drains:
            task.cancel()
    result.stdout, result.stderr = outputs[0].text(), outputs[1].text()


def _judge_memory(cgroup: sandbox_os.RunCgroup, limits: SandboxLimits, result: SandboxResult) -> None:
    """A run its memory cgroup killed for going over memory.max failed, whatever it reported."""
    if cgroup.oom_killed():
        result.ok = False
        result.error = (
            f"the sandboxed program went over its memory limit ({memory_max_mb(limits)} MiB for all "
            "its processes and scratch files, memory cgroup) and was killed"
        )


async def _converse(
    process: asyncio.subprocess.Process,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: dict[str, Any],
    actions: Mapping[str, Action],
    limits: SandboxLimits,
    result: SandboxResult,
) -> None:
    """Serve the program's calls until it exits; fill `result` with the parent's verdict."""
    done: dict[str, Any] | None = None
    violation: str | None = None
    try:
        writer.write((json.dumps(request) + "\n").encode())
        await writer.drain()
        received = 0
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise _ProtocolError(f"a message over {limits.max_message_bytes} bytes") from None
            if not line:
                break
            received += len(line)  # the parent's work is bounded, not only each message
            if received > limits.max_total_message_bytes:
                raise _ProtocolError(f"more than {limits.max_total_message_bytes} bytes of messages in all")
            message = _message(line)
            if message["kind"] == "done":
                if not isinstance(message.get("ok"), bool) or not isinstance(
                    message.get("error"), str | None
                ):
                    raise _ProtocolError("a final message without a boolean ok")
                done = message  # nothing is read after it: the process must now exit on its own
                break
            reply = await _serve_call(message, actions, limits, result)
            writer.write((json.dumps(reply) + "\n").encode())
            await writer.drain()
    except _ProtocolError as exc:
        violation = str(exc)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child went away; its exit status below says why
    if violation is not None:
        result.ok, result.error = False, f"the program broke the action-call protocol: it sent {violation}"
        return
    code = await process.wait()
    if done is None:
        result.ok, result.error = False, f"the sandboxed program ended without a result: {_exit_reason(code)}"
    elif code != 0:
        detail = str(done.get("error"))[:MAX_ERROR_CHARS] if done.get("setup") else _exit_reason(code)
        result.ok, result.error = False, f"the sandboxed program did not exit cleanly: {detail}"
    elif len(result.calls) > limits.max_calls:  # the over-limit call is recorded: a limit was hit
        result.ok, result.error = False, f"the program made more than {limits.max_calls} action calls"
    else:
        error = None if done["ok"] else (done.get("error") or "failed")[:MAX_ERROR_CHARS]
        result.ok, result.error = done["ok"], error


def _exit_reason(code: int) -> str:
    signo = -code if code < 0 else code - 128 if code > 128 else 0
    if signo in (24, 9):
        return f"it went over its CPU-time limit or was killed (signal {signo})"
    if signo:
        return f"signal {signo}"
    return f"exit code {code}"


async def _serve_call(
    message: dict[str, Any], actions: Mapping[str, Action], limits: SandboxLimits, result: SandboxResult
) -> dict[str, Any]:
    key, params = message.get("action"), message.get("params")
    if not isinstance(key, str) or not isinstance(params, dict):
        raise _ProtocolError("a call without a string action and an object of parameters")
    if len(result.calls) >= limits.max_calls:
        error = f"more than {limits.max_calls} action calls"
        if len(result.calls) == limits.max_calls:  # recorded once: the record stays bounded
            result.calls.append(SandboxCall(action_key=key[:200], parameters={}, success=False, error=error))
        return {"ok": False, "error": error}
    if key not in actions:
        error = f"unknown action {key[:200]!r}"
        result.calls.append(SandboxCall(action_key=key[:200], parameters={}, success=False, error=error))
        return {"ok": False, "error": error}
    call_started = time.perf_counter()
    output: Any = None
    error: str | None = None
    try:
        output = _jsonable(await actions[key](**params))
    except Exception as exc:  # the action's failure goes back to the program
        error = f"{type(exc).__name__}: {exc}"
    result.calls.append(
        SandboxCall(
            action_key=key,
            parameters=recorded_parameters(params),
            success=error is None,
            output=output,
            error=error,
            seconds=time.perf_counter() - call_started,
        )
    )
    return {"ok": False, "error": error} if error is not None else {"ok": True, "result": output}


async def _terminate(
    process: asyncio.subprocess.Process,
    isolation: Isolation,
    uid: int | None,
    cgroup: sandbox_os.RunCgroup | None,
) -> None:
    """Kill everything the run started: its cgroup where there is one, else session and uid."""
    sandbox_os.kill_group(process.pid)
    if cgroup is not None:  # every process of the run, daemonised or not, and nothing else
        await cgroup.kill()
    try:
        await asyncio.wait_for(process.wait(), 5)
    except TimeoutError:
        process.kill()
        await process.wait()
    if cgroup is None and isolation == "process" and uid is not None:
        await sandbox_os.kill_uid(uid)


def memory_max_mb(limits: SandboxLimits) -> int:
    """The run's cgroup memory.max: its memory plus its two scratch tmpfs (/tmp, /dev/shm)."""
    return limits.memory_mb + 2 * limits.scratch_mb


def _make_cgroup(settings: PlanningSettings, limits: SandboxLimits) -> sandbox_os.RunCgroup | None:
    """The run's own cgroup (None where cgroups are off or unusable and not required)."""
    if settings.sandbox_cgroups == "off":
        return None
    support = sandbox_os.detect_cgroups()
    if not support.version:
        if settings.sandbox_cgroups == "required":
            raise InvalidArgument(
                f"planning.sandbox_cgroups is 'required' but {support.reason}; run Colony as root on a "
                "host with the memory and pids cgroup controllers, or set it to 'auto'"
            )
        return None
    try:
        return sandbox_os.RunCgroup.create(
            support,
            f"run-{os.getpid()}-{secrets.token_hex(6)}",
            memory_bytes=memory_max_mb(limits) * 1024 * 1024,
            pids_max=limits.max_processes + PIDS_OVERHEAD,
        )
    except OSError as exc:
        raise InvalidArgument(f"the run's cgroup could not be made under {support.memory}: {exc}") from None
