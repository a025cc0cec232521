"""The blackboard's Redis pool (colony.blackboard.connection.TrimmingConnectionPool), on a real
redis-server: a burst's connections are handed out again while the burst lasts, and the surplus
over `IDLE_CONNECTIONS_KEPT` is closed once it has lasted `TRIM_AFTER_SECONDS`."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from colony.blackboard import connection, create_redis
from colony.config import BlackboardSettings


def connected_idle(client: object) -> list[object]:
    pool = client.connection_pool  # type: ignore[attr-defined]
    return [c for c in pool._available_connections if c.is_connected]


async def test_a_burst_reuses_its_connections_then_the_surplus_is_closed(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "TRIM_AFTER_SECONDS", 0.5)
    client = create_redis(redis_url, BlackboardSettings(max_connections=64))
    key = f"test:pool:{uuid.uuid4().hex[:8]}"
    burst = 40  # each BLPOP holds its connection for its 0.1 s: 40 connections at once

    async def wave() -> None:
        await asyncio.gather(*(client.blpop([f"{key}:{n}"], timeout=0.1) for n in range(burst)))

    try:
        await wave()
        first = set(map(id, connected_idle(client)))
        assert len(first) == burst  # not closed on release: the burst may go on
        await wave()
        assert set(map(id, connected_idle(client))) == first  # the same connections, none reopened
        await asyncio.sleep(0.8)  # the surplus has lasted past TRIM_AFTER_SECONDS
        assert len(connected_idle(client)) == connection.IDLE_CONNECTIONS_KEPT
        assert await client.ping()  # a trimmed pool still serves
    finally:
        await client.aclose()
    assert client.connection_pool._trimmer is None or client.connection_pool._trimmer.done()
