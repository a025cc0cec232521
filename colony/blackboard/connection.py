"""Redis connections for the blackboard, and the guard that bounds every operation.

The guard turns connection failures and hangs into `BlackboardUnavailable` within the
configured time (a refused password into `BlackboardAuthError`, which says where the password
lives), and records the operation's count, latency and errors.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from colony import metrics
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import BlackboardAuthError, BlackboardUnavailable, ColonyError

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError)


def create_redis(url: str, settings: BlackboardSettings | None = None) -> aioredis.Redis:
    """An asyncio Redis client whose every wait is bounded by the blackboard settings."""
    settings = settings or BlackboardSettings()
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=settings.max_connections,
        timeout=settings.op_timeout_seconds,
        socket_connect_timeout=settings.connect_timeout_seconds,
        socket_timeout=settings.op_timeout_seconds,
        socket_keepalive=True,
        health_check_interval=30,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), retries=2),
    )
    return aioredis.Redis(connection_pool=pool)


def resolve_redis_url(settings: ColonySettings) -> str:
    """`redis_url` if set, else the running embedded server's URL."""
    if settings.redis_url:
        return settings.redis_url
    info = EmbeddedRedis(settings.data_dir, settings.embedded_redis).status()
    if info is None:
        raise ColonyError(
            f"no Redis to connect to: COLONY_REDIS_URL is unset and no embedded redis-server runs under "
            f"{settings.data_dir}. Start one with `colony redis start` or set COLONY_REDIS_URL."
        )
    return info.url


def redis_url_of(client: aioredis.Redis) -> str:
    """A printable address of the server behind `client` (for error messages)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


class Guard:
    """`async with Guard(op, url, timeout):` — bounded time, typed errors, metrics."""

    __slots__ = ("_op", "_start", "_timeout", "_url")

    def __init__(self, op: str, url: str, timeout: float) -> None:
        self._op = op
        self._url = url
        self._timeout = asyncio.timeout(timeout)

    async def __aenter__(self) -> None:
        self._start = time.perf_counter()
        await self._timeout.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as timeout_exc:
            exc_type, exc = TimeoutError, timeout_exc
        metrics.BLACKBOARD_OPS.labels(self._op).inc()
        metrics.BLACKBOARD_OP_SECONDS.labels(self._op).observe(time.perf_counter() - self._start)
        if exc is None:
            return False
        metrics.BLACKBOARD_OP_ERRORS.labels(self._op, type(exc).__name__).inc()
        if isinstance(exc, AuthenticationError):  # a ConnectionError, but no retry or wait will help
            raise BlackboardAuthError(self._op, self._url, exc) from exc
        if isinstance(exc, _UNAVAILABLE):
            raise BlackboardUnavailable(self._op, self._url, exc) from exc
        return False
