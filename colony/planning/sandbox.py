"""Run generated Python in a separate, locked-down process.

The child (`sandbox_child.py`, run as `python -I -S` with an empty environment) gets CPU-time,
address-space, file-size (0) and process-count (0) limits, an import allow-list, and audit hooks
that refuse files, processes, sockets and ctypes. The parent enforces a wall-clock limit and
answers the program's `run(action_key, **params)` calls by awaiting the given async callables,
so actions run in the agent's process, never in the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

CHILD = Path(__file__).with_name("sandbox_child.py")
Action = Callable[..., Awaitable[Any]]


class SandboxLimits(BaseModel):
    wall_seconds: float = Field(10.0, gt=0, description="wall-clock limit of one program")
    cpu_seconds: int = Field(5, ge=1, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address-space limit (RLIMIT_AS)")
    max_calls: int = Field(100, ge=1, description="action calls one program may make")


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
    seconds: float = 0.0


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json")
        return repr(value)


async def run_sandboxed(
    code: str, *, actions: Mapping[str, Action] | None = None, limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run `code` in a fresh sandbox process; never raises for the program's own failures."""
    limits = limits or SandboxLimits()
    actions = dict(actions or {})
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        str(CHILD),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={},
        limit=8 * 1024 * 1024,
    )
    assert process.stdin is not None and process.stdout is not None
    request = {"code": code, "limits": limits.model_dump(), "actions": sorted(actions)}
    process.stdin.write((json.dumps(request) + "\n").encode())
    await process.stdin.drain()
    calls: list[SandboxCall] = []

    async def converse() -> SandboxResult:
        assert process.stdin is not None and process.stdout is not None
        while True:
            line = await process.stdout.readline()
            if not line:
                code_ = await process.wait()
                reason = "it went over its CPU-time limit" if code_ in (-24, -9) else f"exit code {code_}"
                return SandboxResult(
                    ok=False, error=f"the sandboxed program was killed: {reason}", calls=calls
                )
            message = json.loads(line)
            if message.get("done"):
                return SandboxResult(
                    ok=bool(message["ok"]),
                    error=message.get("error"),
                    calls=calls,
                    stdout=message.get("stdout", ""),
                )
            key, params = message["call"], message.get("params") or {}
            call_started = time.perf_counter()
            if len(calls) >= limits.max_calls:
                reply = {"ok": False, "error": f"more than {limits.max_calls} action calls"}
                calls.append(
                    SandboxCall(action_key=key, parameters=params, success=False, error=reply["error"])
                )
            else:
                try:
                    output = _jsonable(await actions[key](**params))
                    reply = {"ok": True, "result": output}
                    calls.append(
                        SandboxCall(
                            action_key=key,
                            parameters=params,
                            success=True,
                            output=output,
                            seconds=time.perf_counter() - call_started,
                        )
                    )
                except Exception as exc:  # the action's failure goes back to the program
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    calls.append(
                        SandboxCall(
                            action_key=key,
                            parameters=params,
                            success=False,
                            error=reply["error"],
                            seconds=time.perf_counter() - call_started,
                        )
                    )
            process.stdin.write((json.dumps(reply) + "\n").encode())
            await process.stdin.drain()

    try:
        result = await asyncio.wait_for(converse(), limits.wall_seconds)
    except TimeoutError:
        result = SandboxResult(
            ok=False,
            error=f"the sandboxed program ran past its {limits.wall_seconds}s "
            "wall-clock limit and was stopped",
            calls=calls,
        )
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    result.seconds = time.perf_counter() - started
    return result
