"""The sandbox generated code runs in: a separate process with limits, an import allow-list and
audit hooks; action calls proxied back to the parent."""

from __future__ import annotations

import time

import pytest

from colony.planning import SandboxLimits, run_sandboxed

LIMITS = SandboxLimits(wall_seconds=5, cpu_seconds=2, memory_mb=512)


async def add(a: int, b: int) -> int:
    return a + b


async def fail() -> None:
    raise ValueError("nope")


async def test_program_calls_actions_in_the_parent() -> None:
    code = (
        "x = run('add', a=2, b=3)\nprint('x =', x)\n"
        "try:\n    run('fail')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    result = await run_sandboxed(code, actions={"add": add, "fail": fail}, limits=LIMITS)
    assert result.ok, result.error
    assert [(c.action_key, c.success) for c in result.calls] == [("add", True), ("fail", False)]
    assert result.calls[0].parameters == {"a": 2, "b": 3} and result.calls[0].output == 5
    assert result.stdout == "x = 5\nfail failed: ValueError: nope\n"


@pytest.mark.parametrize(
    "code,expected",
    [
        ("import os", "import of 'os' is not allowed"),
        ("print(open('/etc/passwd').read())", "'open' is not defined"),
        ("__import__('socket')", "import of 'socket' is not allowed"),
        ("while True:\n    pass", "CPU-time limit"),
        ("x = bytearray(4 * 1024 ** 3)", "memory limit"),
        (
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
            ".__init__.__globals__['system']('echo pwned')",
            "os.system is not allowed",
        ),
        ("run('rm_rf')", "unknown action 'rm_rf'"),
    ],
    ids=["import os", "open", "socket", "infinite loop", "4 GB", "subclass escape", "unknown action"],
)
async def test_escapes_and_runaways_are_stopped_with_a_clear_error(code: str, expected: str) -> None:
    started = time.monotonic()
    result = await run_sandboxed(code, actions={"add": add}, limits=LIMITS)
    assert not result.ok and expected in (result.error or "")
    assert time.monotonic() - started < LIMITS.wall_seconds + 2


async def test_wall_clock_limit_stops_a_sleeping_program() -> None:
    async def slow() -> None:
        import asyncio

        await asyncio.sleep(10)

    result = await run_sandboxed("run('slow')", actions={"slow": slow}, limits=SandboxLimits(wall_seconds=1))
    assert not result.ok and "wall-clock limit" in result.error


async def test_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLONY_API_TOKEN", "secret-token")
    code = (
        "env = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
        ".__init__.__globals__['environ']\nprint(dict(env))"
    )
    result = await run_sandboxed(code, limits=LIMITS)
    assert "secret-token" not in result.stdout
