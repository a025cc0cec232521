"""The embedded redis-server requires a generated password, keeps it private and across restarts,
hands it out only inside the URL, and never shows it in logs or status output."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from pathlib import Path

import pytest
import redis

from colony.blackboard import Blackboard, create_redis, resolve_redis_url
from colony.blackboard.redis_server import EmbeddedRedis, mask_url
from colony.cli import main as colony_main
from colony.config import ColonySettings, EmbeddedRedisSettings
from colony.errors import BlackboardAuthError, BlackboardUnavailable, RedisServerError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def _write(url: str) -> int:
    client = create_redis(url)
    try:
        return (await Blackboard(client, "test:auth").write("k", {"v": 1})).version
    finally:
        await client.aclose()


def test_unauthenticated_and_wrong_password_clients_are_refused(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    assert info.password and info.password in info.url
    bare = f"redis://{info.host}:{info.port}/0"
    for url in (bare, f"redis://:{'0' * 64}@{info.host}:{info.port}/0"):
        with pytest.raises(BlackboardAuthError, match=r"redis/password") as refused:
            asyncio.run(_write(url))
        assert isinstance(refused.value, BlackboardUnavailable)  # callers catching that still do
        assert info.password not in str(refused.value)
    raw = redis.Redis(host=info.host, port=info.port)
    with pytest.raises(redis.AuthenticationError):
        raw.ping()
    raw.close()
    assert asyncio.run(_write(info.url)) >= 1


def test_password_config_and_state_files_are_private(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    folder = Path(info.data_dir)
    assert _mode(folder) == 0o700
    for name in ("password", "server.json", "redis.conf"):
        assert _mode(folder / name) == 0o600, name
    assert (folder / "password").read_text().strip() == info.password
    assert json.loads((folder / "server.json").read_text())["password"] == info.password
    assert not list(folder.glob(".*.tmp"))  # atomic writes leave no temporary behind


def test_password_survives_a_restart_and_data_with_it(private_redis: EmbeddedRedis) -> None:
    first = private_redis.start()
    asyncio.run(_write(first.url))
    private_redis.stop()
    second = private_redis.start()
    assert second.pid != first.pid
    assert second.password == first.password
    assert asyncio.run(_write(second.url)) == 2  # same data, same password


def test_listens_on_loopback_only(tmp_path: Path) -> None:
    with pytest.raises(RedisServerError, match="loopback"):
        EmbeddedRedis(tmp_path / "d", EmbeddedRedisSettings(host="0.0.0.0")).start()
    assert not (tmp_path / "d" / "redis" / "server.json").exists()


def test_the_url_reaches_clients_but_never_logs_or_status_output(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    data_dir = tmp_path / "colony"
    monkeypatch.setenv("COLONY_DATA_DIR", str(data_dir))
    monkeypatch.delenv("COLONY_REDIS_URL", raising=False)
    server = EmbeddedRedis(data_dir)
    try:
        with caplog.at_level(logging.DEBUG, logger="colony"):
            info = server.start()
        assert info.password not in caplog.text and "****" in caplog.text
        assert info.password not in repr(info)
        assert info.masked_url == f"redis://:****@{info.host}:{info.port}/0"
        assert resolve_redis_url(ColonySettings(data_dir=data_dir)) == info.url
        empty = tmp_path / "empty.yaml"
        empty.write_text("{}\n")
        assert colony_main(["--config", str(empty), "redis", "status"]) == 0
        out = capsys.readouterr().out
        assert info.password not in out
        assert "redis://:****@" in out and str(info.password_file) in out
    finally:
        server.stop()


def test_mask_url_hides_any_password() -> None:
    assert mask_url("redis://:s3cret@db:6379/0") == "redis://:****@db:6379/0"
    assert mask_url("rediss://user:s3cret@db:6380/1") == "rediss://user:****@db:6380/1"
    assert mask_url("redis://db:6379/0") == "redis://db:6379/0"
