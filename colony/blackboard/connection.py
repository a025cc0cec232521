"""Redis connections for the blackboard, and the guard that bounds every operation.

The guard turns connection failures and hangs into `BlackboardUnavailable` within the
configured time (a refused password into `BlackboardAuthError`, which says where the password
lives), and records the operation's count, latency and errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from colony import metrics
from colony.blackboard.multiplexed import ColonyRedis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import BlackboardAuthError, BlackboardUnavailable, ColonyError

T = TypeVar("T")
log = logging.getLogger(__name__)

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError)


IDLE_CONNECTIONS_KEPT = 16  # idle connections a client's pool keeps open (more are closed)
TRIM_AFTER_SECONDS = 2.0  # how long a surplus of idle connections may last before it is closed


class TrimmingConnectionPool(aioredis.BlockingConnectionPool):
    """A blocking pool that keeps at most `IDLE_CONNECTIONS_KEPT` idle connections open.

    redis-py's pool never closes a connection it opened, so one burst (e.g. many agents spawned at
    once) would leave its peak of connections open for the life of the process, counted by Redis
    as clients. A surplus is closed `TRIM_AFTER_SECONDS` after it appears, least recently used
    first, not at once: during a burst the connections are handed out again instead of being
    closed and reopened (a new connection costs a handshake of several round trips); a closed
    one reconnects if it is ever handed out again."""

    _trimmer: asyncio.Task[None] | None = None

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        idle: list[Any] | None = getattr(self, "_available_connections", None)
        if idle is None or len(idle) <= IDLE_CONNECTIONS_KEPT:
            return
        if self._trimmer is None or self._trimmer.done():
            self._trimmer = asyncio.create_task(self._trim_later(), name="colony-redis-pool-trim")

    async def _trim_later(self) -> None:
        await asyncio.sleep(TRIM_AFTER_SECONDS)
        idle: list[Any] = getattr(self, "_available_connections", [])
        surplus = idle[: max(0, len(idle) - IDLE_CONNECTIONS_KEPT)]  # the front: used least recently
        del idle[: len(surplus)]  # out of the pool before any await: nobody is handed one mid-close
        for extra in surplus:
            try:
                await extra.disconnect()
            except Exception:  # closing a surplus connection is best effort
                log.debug("surplus Redis connection not closed cleanly", exc_info=True)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if self._trimmer is not None and not self._trimmer.done():
            self._trimmer.cancel()
        await super().disconnect(inuse_connections)


def create_redis(url: str, settings: BlackboardSettings | None = None) -> aioredis.Redis:
    """An asyncio Redis client whose every wait is bounded by the blackboard settings (its pool
    keeps at most `IDLE_CONNECTIONS_KEPT` idle connections open). With
    `pipelined_connection` (the default) its non-blocking commands share one pipelined connection
    (colony/blackboard/multiplexed.py)."""
    settings = settings or BlackboardSettings()
    tcp: dict[str, Any] = {} if url.startswith("unix:") else {"socket_keepalive": True}  # TCP only
    pool = TrimmingConnectionPool.from_url(
        url,
        max_connections=settings.max_connections,
        timeout=settings.op_timeout_seconds,
        socket_connect_timeout=settings.connect_timeout_seconds,
        socket_timeout=settings.op_timeout_seconds,
        health_check_interval=30,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), retries=2),
        **tcp,
    )
    if settings.pipelined_connection:
        return ColonyRedis(connection_pool=pool)
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
        count, seconds = metrics.blackboard_op(self._op)
        count.inc()
        seconds.observe(time.perf_counter() - self._start)
        if exc is None:
            return False
        metrics.BLACKBOARD_OP_ERRORS.labels(self._op, type(exc).__name__).inc()
        if isinstance(exc, AuthenticationError):  # a ConnectionError, but no retry or wait will help
            raise BlackboardAuthError(self._op, self._url, exc) from exc
        if isinstance(exc, _UNAVAILABLE):
            raise BlackboardUnavailable(self._op, self._url, exc) from exc
        return False


class OutageBackoff:
    """Bounded exponential backoff for a loop that waits out a Redis outage: the first failure
    of an outage is logged (a warning), later ones only at debug level, and `recovered()` logs
    once how long it lasted. Delays grow from `first` to at most `cap` seconds."""

    def __init__(self, what: str, logger: logging.Logger, *, first: float = 0.1, cap: float = 2.0) -> None:
        self.what = what
        self._log = logger
        self._first = first
        self._cap = cap
        self._delay = first
        self.since: float | None = None  # monotonic time the current outage began

    @property
    def failing(self) -> bool:
        return self.since is not None

    def note(self, exc: BaseException) -> None:
        """Note a failure of the outage (logged as a warning only when it is the first)."""
        if self.since is None:
            self.since = time.monotonic()
            self._log.warning("%s: Redis unavailable (%s); retrying with backoff", self.what, exc)
        else:
            self._log.debug("%s: still unavailable (%s)", self.what, exc)

    async def wait(self, exc: BaseException) -> None:
        """Note a failure of the outage and sleep the next delay."""
        self.note(exc)
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, self._cap)

    def recovered(self) -> None:
        """The operation succeeded: end the outage (logged once) and reset the delay."""
        if self.since is not None:
            self._log.warning(
                "%s: Redis is back after %.1fs; carrying on", self.what, time.monotonic() - self.since
            )
            self.since = None
        self._delay = self._first


async def retry_unavailable(
    operation: Callable[[], Awaitable[T]],
    what: str,
    logger: logging.Logger,
    *,
    cap: float = 2.0,
    answers: Callable[[], Awaitable[bool]] | None = None,
    tries_while_up: int = 3,
) -> T:
    """`await operation()` until it does not raise `BlackboardUnavailable`, with bounded backoff
    (cancel the caller to give up). Other errors propagate at once. With `answers` (a ping of
    Redis), an operation that fails `tries_while_up` times in a row while Redis answers is not
    an outage: its error propagates."""
    backoff = OutageBackoff(what, logger, cap=cap)
    up_failures = 0
    while True:
        try:
            result = await operation()
        except BlackboardUnavailable as exc:
            if answers is not None and await answers():
                up_failures += 1
                if up_failures >= tries_while_up:
                    raise
            else:
                up_failures = 0
            await backoff.wait(exc)
            continue
        backoff.recovered()
        return result


async def redis_answers(client: aioredis.Redis, timeout: float = 1.0) -> bool:
    """Whether Redis answers a PING within `timeout` seconds (never raises)."""
    try:
        async with asyncio.timeout(timeout):
            return bool(await client.ping())
    except Exception:
        return False
