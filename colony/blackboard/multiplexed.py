"""One pipelined Redis connection shared by every concurrent caller of a client (`RedisLane`), and
the redis-py client that sends its commands over it (`ColonyRedis`).

Why: redis-py's asyncio client borrows a pooled connection for each command and waits for its
reply under a per-read timeout; on this project's hot paths that costs about 85-120 us of CPU per
round trip (measured: `python benchmarks/redis_lane.py`), several times the cost of Redis running
the command. A run of an agent makes dozens of round trips, in the API and on the engine replica,
so the client was a large share of a run's CPU. A lane writes each command as soon as it is called
onto one connection and matches replies to callers in order (Redis answers a connection's commands
in the order they came), with hiredis parsing the replies: no pool, no lock, no timer per command.

What goes over the lane: every command that neither blocks nor changes the connection's state.
Blocking reads (`XREAD ... BLOCK`, `BLPOP`, ...), `WATCH`/`MULTI` transactions, pub/sub and
connection commands (`CLIENT`, `SELECT`, `AUTH`, ...) go through redis-py's pool as before, as do
all commands of a TLS (`rediss://`) client. Pipelines without a transaction go over the lane as
one write. Errors are redis-py's (`ConnectionError`, `TimeoutError`, `ResponseError` and its
subclasses such as `NoScriptError`), and a lost connection is retried with the client's `Retry`
like redis-py does, so callers see the same behaviour either way.

A reply that does not come within the client's `socket_timeout` means the connection is stuck: it
is closed, every caller waiting on it gets a `TimeoutError`, and the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import socket
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser  # redis-py's map of error replies to exceptions
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import DEFAULT_RESP_VERSION

_BLOCKING = frozenset(
    {
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP",
        "WAIT", "WAITAOF", "MONITOR", "SYNC", "PSYNC", "REPLCONF",
    }
)  # fmt: skip
# Commands that change or read the state of the connection they run on: never on a shared one.
# Pub/sub is here too: under RESP3 its replies are pushes, which no caller's reply may be.
_CONNECTION_STATE = frozenset(
    {
        "WATCH", "UNWATCH", "MULTI", "EXEC", "DISCARD", "SELECT", "AUTH", "HELLO", "RESET", "QUIT",
        "CLIENT", "READONLY", "READWRITE", "ASKING", "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE",
        "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE",
    }
)  # fmt: skip


def _on_lane(args: Sequence[Any]) -> bool:
    """Whether a command may share the lane: not blocking, no connection state."""
    head = args[0]
    first = (head.decode() if isinstance(head, bytes) else str(head)).split(" ", 1)[0].upper()
    if first in _BLOCKING or first in _CONNECTION_STATE:
        return False
    if first in ("XREAD", "XREADGROUP"):
        return not any(isinstance(a, str | bytes) and a.upper() in ("BLOCK", b"BLOCK") for a in args[1:])
    return True


_NOT_ENOUGH_DATA = object()  # hiredis: no whole reply buffered yet
_PUSH = getattr(hiredis, "PushNotification", None)


class _Wire(asyncio.Protocol):
    """The connection's socket: parses what arrives and hands each reply to the oldest caller."""

    def __init__(self, lane: RedisLane, decoding: tuple[str, str] | None) -> None:
        kwargs: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": BaseParser.parse_error,
            "notEnoughData": _NOT_ENOUGH_DATA,
        }
        if decoding is not None:  # the client's encoder's: its `encoding` and `encoding_errors`
            kwargs.update(encoding=decoding[0], errors=decoding[1])
        self._reader = hiredis.Reader(**kwargs)
        self._lane = lane
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[asyncio.Future[Any], bool, float]] = deque()  # future, raw, sent at
        self.lost: BaseException | None = None
        self.watchdog: asyncio.TimerHandle | None = None
        self.outbox: list[bytes] = []  # commands of this loop iteration, written together
        self.progress = 0.0  # loop time of the last reply: a long batch answering is not stuck

    def send(self, payload: bytes) -> None:
        """Write `payload`. On a connection with replies owed (other callers are busy: more
        commands are likely to come in this event-loop iteration) it is queued and written at the
        end of the iteration with the others, one system call for many; on an idle one it is
        written at once (a lone caller does not wait an iteration)."""
        if self.outbox:
            self.outbox.append(payload)
            return
        if not self.waiting and self.transport is not None:  # nothing owed before this one
            self.transport.write(payload)
            self.progress = asyncio.get_running_loop().time()
            return
        asyncio.get_running_loop().call_soon(self.flush)
        self.outbox.append(payload)

    def flush(self) -> None:
        outbox, self.outbox = self.outbox, []
        if outbox and self.lost is None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(outbox) if len(outbox) > 1 else outbox[0])
            self.progress = asyncio.get_running_loop().time()  # replies are owed from now on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self.waiting
        stamp = True
        while waiting:
            future, raw, _ = waiting[0]
            try:
                reply = reader.gets(False) if raw else reader.gets()
            except UnicodeDecodeError as exc:  # that reply only (hiredis consumed it): its caller's error
                waiting.popleft()
                if not future.done():
                    future.set_exception(exc)
                continue
            except (InvalidResponse, hiredis.ProtocolError) as exc:
                self.fail(InvalidResponse(f"unreadable reply from Redis: {exc}"))
                return
            if reply is _NOT_ENOUGH_DATA:
                return
            if _PUSH is not None and isinstance(reply, _PUSH):
                continue  # an out-of-band RESP3 push (none is asked for): no caller's reply
            waiting.popleft()
            if stamp:  # the watchdog's measure of progress: once per arrival, not per reply
                self.progress, stamp = asyncio.get_running_loop().time(), False
            if not future.done():  # a caller that was cancelled meanwhile: its reply is dropped
                future.set_result(reply)
        if reader.has_data():
            self.fail(InvalidResponse("Redis sent a reply no command was waiting for"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(
            RedisConnectionError(f"connection to Redis lost: {exc}" if exc else "Redis closed the connection")
        )

    def fail(self, error: BaseException) -> None:
        """The connection is unusable: every waiting caller gets `error`, the lane opens a new one."""
        if self.lost is None:
            self.lost = error
        self._lane.forget(self)
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        while self.waiting:
            future, _raw, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a pipeline's caller raises the first of its replies' only
        if self.transport is not None:
            self.transport.close()

    def _since(self) -> float:
        """Since when the oldest waiting reply is owed: its write, or the last reply if later
        (Redis answering a long batch in order is making progress, not stuck)."""
        return max(self.waiting[0][2], self.progress)

    def arm(self, timeout: float | None) -> None:
        """One timer per connection, set for when its oldest waiting reply would be overdue."""
        if timeout is None or self.watchdog is not None or not self.waiting:
            return
        loop = asyncio.get_running_loop()
        self.watchdog = loop.call_at(self._since() + timeout, self._check, timeout)

    def _check(self, timeout: float) -> None:
        self.watchdog = None
        if not self.waiting or self.lost is not None:
            return
        if asyncio.get_running_loop().time() - self._since() >= timeout:
            self.fail(RedisTimeoutError(f"Redis did not answer within {timeout}s"))
            return
        self.arm(timeout)


class RedisLane:
    """One pipelined connection of a client, opened on first use in the running event loop (and
    opened again after it is lost, or when the client is used from another loop)."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        self._kwargs = pool.connection_kwargs
        self._unix = pool.connection_class is UnixDomainSocketConnection
        self._timeout: float | None = self._kwargs.get("socket_timeout")
        self._resp3 = int(self._kwargs.get("protocol") or DEFAULT_RESP_VERSION) == 3
        self._encoder = encoder = pool.get_encoder()
        self._decoding = (encoder.encoding, encoder.encoding_errors) if encoder.decode_responses else None
        self._wire: _Wire | None = None
        self._opening: asyncio.Task[_Wire] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0  # bumped by aclose(): a connection opened before it is not kept

    @staticmethod
    def usable(pool: aioredis.ConnectionPool) -> bool:
        """TCP and Unix-socket pools (a TLS one keeps redis-py's own connections)."""
        return pool.connection_class in (Connection, UnixDomainSocketConnection)

    def forget(self, wire: _Wire) -> None:
        if self._wire is wire:
            self._wire = None

    async def _connected(self) -> _Wire:
        loop = asyncio.get_running_loop()
        wire = self._wire
        if wire is not None and self._loop is loop:
            return wire
        if self._loop is not loop:  # used from another event loop: that loop's connection is no use here
            self._drop(RedisConnectionError("the Redis client moved to another event loop"))
            self._loop, self._opening = loop, None
        opening = self._opening
        if opening is None:  # one connection attempt at a time, whoever waits for it
            opening = self._opening = loop.create_task(self._open(loop), name="colony-redis-lane-connect")
            opening.add_done_callback(functools.partial(self._opened, self._generation))
        return await asyncio.shield(opening)

    def _opened(self, generation: int, task: asyncio.Task[_Wire]) -> None:
        if self._opening is task:
            self._opening = None
        if task.cancelled() or task.exception() is not None:
            return
        wire = task.result()
        if generation != self._generation or self._loop is not asyncio.get_running_loop():
            wire.fail(RedisConnectionError("the Redis client was closed while this connection opened"))
        elif wire.lost is None:
            self._wire = wire

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Wire:
        kwargs = self._kwargs

        def wire_factory() -> _Wire:
            return _Wire(self, self._decoding)

        try:
            async with asyncio.timeout(kwargs.get("socket_connect_timeout") or self._timeout):
                if self._unix:
                    _, wire = await loop.create_unix_connection(wire_factory, kwargs["path"])
                else:
                    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
                    _, wire = await loop.create_connection(wire_factory, host, port)
                    sock = wire.transport.get_extra_info("socket") if wire.transport is not None else None
                    if sock is not None and kwargs.get("socket_keepalive"):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                handshake: list[tuple[Any, ...]] = []
                password, user = kwargs.get("password"), kwargs.get("username")
                if self._resp3:  # redis-py's default protocol: the same reply shapes as its pool
                    hello: tuple[Any, ...] = ("HELLO", 3)
                    if password is not None:
                        hello += ("AUTH", user or "default", password)
                    handshake.append(hello)
                elif password is not None:
                    handshake.append(("AUTH", user, password) if user else ("AUTH", password))
                if kwargs.get("db"):
                    handshake.append(("SELECT", kwargs["db"]))
                if kwargs.get("client_name"):
                    handshake.append(("CLIENT", "SETNAME", kwargs["client_name"]))
                try:
                    for reply in await self._send(wire, handshake, raw=False) if handshake else ():
                        if isinstance(reply, Exception):  # NOAUTH/WRONGPASS: an AuthenticationError
                            raise reply
                except BaseException:  # refused, timed out or cancelled: no half-open connection left
                    wire.fail(RedisConnectionError("the connection's handshake did not complete"))
                    raise
        except TimeoutError as exc:  # asyncio.timeout's (the builtin)
            raise RedisTimeoutError(f"timed out connecting to Redis: {exc}") from None
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from None
        return wire

    def _drop(self, error: BaseException) -> None:
        wire, self._wire = self._wire, None
        if wire is not None:
            with contextlib.suppress(RuntimeError):  # its event loop is closed: nobody waits on it
                wire.fail(error)

    def _encode(self, args: Sequence[Any]) -> bytes:
        head = args[0]
        parts = tuple((head.encode() if isinstance(head, str) else head).split()) + tuple(args[1:])
        try:
            return hiredis.pack_command(
                tuple(
                    a
                    if type(a) in (str, bytes, int)
                    else bytes(a)
                    if isinstance(a, bytearray | memoryview)
                    else self._encoder.encode(a)
                    for a in parts
                )
            )
        except TypeError as exc:
            raise DataError(f"invalid argument in Redis command {str(head)!r}: {exc}") from None

    async def _send(self, wire: _Wire, commands: Sequence[Sequence[Any]], raw: bool) -> list[Any]:
        """Write the commands in one go and wait for their replies (error replies as values)."""
        payload = b"".join([self._encode(c) for c in commands])
        if wire.lost is not None or wire.transport is None or wire.transport.is_closing():
            raise RedisConnectionError(f"connection to Redis lost: {wire.lost}")
        loop = asyncio.get_running_loop()
        now = loop.time()
        futures = [loop.create_future() for _ in commands]
        wire.send(payload)  # before the replies are owed: `send` looks at what was owed before
        wire.waiting.extend([(f, raw, now) for f in futures])
        wire.arm(self._timeout)
        replies = [await f for f in futures]
        for reply in replies:  # LOADING, NOAUTH...: errors redis-py's connections retry, so does this
            if isinstance(reply, RedisConnectionError | RedisTimeoutError):
                raise reply
        return replies

    async def execute(self, commands: Sequence[Sequence[Any]], *, raw: bool = False) -> list[Any]:
        """The replies to `commands`, sent as one write; error replies come back as exception
        values. A connection lost before the replies came is retried (the client's `Retry`, the
        same number of tries and backoff as redis-py's connections)."""
        wire = self._wire
        try:
            if wire is None or self._loop is not asyncio.get_running_loop():
                wire = await self._connected()
            return await self._send(wire, commands, raw)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            retry = self._kwargs.get("retry")
            if retry is None:
                raise
            first: BaseException | None = exc

        async def attempt() -> list[Any]:
            nonlocal first
            if first is not None:  # the try above, as the Retry's first
                error, first = first, None
                raise error
            return await self._send(await self._connected(), commands, raw)

        async def on_failure(error: Exception) -> None:
            pass  # the lost connection dropped itself: the next attempt opens a new one

        return await retry.call_with_retry(attempt, on_failure)

    async def aclose(self) -> None:
        """Close the connection; like redis-py's client, a later call opens a new one."""
        self._generation += 1
        self._opening = None
        self._drop(RedisConnectionError("the Redis client was closed"))


def _apply_callback(callbacks: dict[str, Any], command_name: str, reply: Any, options: dict[str, Any]) -> Any:
    """redis-py's parse_response after the read: EMPTY_RESPONSE, then the command's callback."""
    if isinstance(reply, Exception):  # an error reply, as redis-py's parser builds it
        if isinstance(reply, ResponseError) and EMPTY_RESPONSE in options:
            return options[EMPTY_RESPONSE]
        return reply
    if command_name not in callbacks:  # a case-insensitive mapping: `in` and `[]`, not `.get`
        return reply
    if options:
        options = {k: v for k, v in options.items() if k not in (EMPTY_RESPONSE, NEVER_DECODE, "keys")}
    return callbacks[command_name](reply, **options)


class ColonyRedis(aioredis.Redis):
    """redis-py's asyncio client, whose commands share one pipelined connection (`RedisLane`)
    where that is safe; the rest go through its pool as usual."""

    def __init__(self, *, connection_pool: aioredis.ConnectionPool, **kwargs: Any) -> None:
        super().__init__(connection_pool=connection_pool, **kwargs)
        self.lane: RedisLane | None = (
            RedisLane(connection_pool) if RedisLane.usable(connection_pool) else None
        )

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        lane = self.lane
        if lane is None or self.connection is not None or not _on_lane(args):
            return await super().execute_command(*args, **options)
        (reply,) = await lane.execute([args], raw=NEVER_DECODE in options)
        result = _apply_callback(self.response_callbacks, args[0], reply, options)
        if isinstance(result, Exception):
            raise result
        return await result if inspect.isawaitable(result) else result

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = LanePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.lane = self.lane
        return pipe

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.lane is not None:
            await self.lane.aclose()
        await super().aclose(close_connection_pool)


class LanePipeline(Pipeline):
    """A pipeline without a transaction (nor WATCH, nor scripts to load first) goes over the lane
    as one write; any other goes through the pool as redis-py sends it."""

    lane: RedisLane | None = None

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        lane = self.lane
        if (
            lane is None
            or not stack
            or self.is_transaction
            or self.explicit_transaction
            or self.watching
            or self.scripts
            or self.connection is not None
            or not all(_on_lane(args) for args, _ in stack)
            or any(NEVER_DECODE in options for _, options in stack)
        ):
            return await super().execute(raise_on_error)
        try:
            replies = await lane.execute([args for args, _ in stack])
            results = []
            for (args, options), reply in zip(stack, replies, strict=True):
                result = _apply_callback(self.response_callbacks, args[0], reply, options)
                if isinstance(result, Exception) and not isinstance(result, ResponseError):
                    raise result  # e.g. NOAUTH: redis-py raises these from a pipeline too
                results.append(await result if inspect.isawaitable(result) else result)
            if raise_on_error:
                self.raise_first_error(stack, results)
            return results
        finally:
            await self.reset()
