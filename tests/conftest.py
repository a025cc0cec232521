"""Shared fixtures: a real redis-server per test session, started through Colony's own EmbeddedRedis."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# one colony secret for the test process and every Ray worker it starts (they inherit the env), so
# blueprints signed in one verify in the other, and no test writes ~/.colony/secret
os.environ.setdefault("COLONY_SECRET", "colony-test-secret-0123456789abcdef")

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis, RedisServerInfo
from colony.config import BlackboardSettings


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServerInfo]:
    """A real redis-server on a free port, for the whole session."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis-session"))
    info = server.start()
    yield info
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServerInfo) -> str:
    return redis_server.url


@pytest.fixture
def bb_settings() -> BlackboardSettings:
    return BlackboardSettings()


@pytest.fixture
async def bb(redis_url: str, bb_settings: BlackboardSettings) -> AsyncIterator[Blackboard]:
    """A blackboard on a fresh, unique scope (tests never see each other's keys)."""
    client = create_redis(redis_url, bb_settings)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}", settings=bb_settings)
    yield board
    await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """An embedded server of a test's own, for tests that stop or kill it."""
    server = EmbeddedRedis(tmp_path / "data")
    yield server
    server.stop()


@pytest.fixture
async def runtime(bb: Blackboard) -> AsyncIterator[object]:
    """A LocalAgentRuntime on its own colony id (tests never see each other's agents)."""
    from colony.agents import LocalAgentRuntime

    rt = LocalAgentRuntime(bb, colony_id=f"c{uuid.uuid4().hex[:10]}")
    yield rt
    await rt.shutdown()


@pytest.fixture(scope="session")
def serve_instance() -> Iterator[int]:
    """One local Ray cluster (2 CPUs, no dashboard) with Serve started, for every Serve test; the
    HTTP port of Serve's proxy. Modules deploy their own application on it and delete it after."""
    import ray
    from ray import serve

    from colony.blackboard.redis_server import free_port

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
