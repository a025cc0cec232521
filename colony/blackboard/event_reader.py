"""One multiplexed event reader per Redis client: idle subscribers share a few connections.

Before this module every `EventSubscription` ran its own XREAD BLOCK, so every idle agent held
a Redis connection and woke Redis once per block period. Here the subscriptions of one client
(one process or replica) are served by an `EventReader`: its lanes each issue ONE XREAD BLOCK
over all the streams their subscriptions wait on, and dispatch the rows to per-subscription
buffers. Connections = lanes (a lane holds at most `STREAMS_PER_LANE` streams, so a reply and
a request stay bounded; at most `MAX_LANES` lanes, past that lanes grow beyond the soft cap).

Positions. Each subscription (`Slot`) knows the last row handed to it (`delivered`). A stream is
read from `pos`, the oldest active subscription's `delivered`; a read's rows reach only the
subscriptions that had everything up to the position it was read from (one that joined meanwhile
at an older position waits for the next read), and only the rows newer than what each has, so
each subscription gets every matching row exactly once, in order, whatever position it joined
at (subscribers of one stream share one read). A subscription whose buffer is full stops
counting (`active` False) until its consumer drains it, so one slow consumer neither grows memory
nor holds the others back.

Waking. A subscription that joins while the lane's XREAD blocks must not wait for the block to
time out: the lane also reads a private wake stream (from the last wake id it saw, so a wake
sent before the XREAD reaches Redis is not missed), and a join XADDs to it (MAXLEN 1, with an
expiry), at most once per XREAD, after `WAKE_DELAY` seconds so a burst of joins costs one wake.

Outages. A read failed for an outage is handed to every subscription waiting at that moment (its
`next()` raises `BlackboardUnavailable` as a private XREAD did); the lane retries with bounded
backoff and carries on from the positions it had, so nothing the stream still holds is lost or
repeated. A read Redis refuses (`ResponseError`: a key of another type) is pinned on the streams
to blame, whose subscriptions alone end (`EventStreamRefused`). Anything else escaping a round
restarts the lane: its task never ends while it has streams (waiters would hang).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from colony.blackboard.connection import Guard, OutageBackoff
from colony.blackboard.protocol import EventReaderKeys
from colony.errors import EventStreamRefused, InvalidArgument

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from colony.blackboard.events import KeyMatcher
    from colony.config import BlackboardSettings

log = logging.getLogger(__name__)

STREAMS_PER_LANE = 1024  # streams one XREAD carries (soft cap: exceeded only past MAX_LANES)
MAX_LANES = 16  # blocking connections one reader holds at most
READ_COUNT = 64  # rows per stream per read
BUFFER_ROWS = 1024  # rows a subscription buffers before it stops being read for
WAKE_DELAY = 0.05  # joins within this many seconds share one wake
WAKE_TTL_MS = 60_000  # a wake stream left by a dead process expires
# A read answered sooner than this after it was sent (rows were waiting: a busy stream) is followed
# by a pause of the rest of it before the next read, so rows arriving meanwhile come in one reply
# instead of one read each. An idle lane's read blocks longer than this: no pause, no latency added.
COALESCE_SECONDS = 0.002

StreamId = tuple[int, int]
_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
_ID_MAX = 2**64 - 1  # each part of a stream id is an unsigned 64-bit number (Redis refuses more)


def parse_id(text: str) -> StreamId:
    """A stream id ("ms-seq", or "ms" meaning "ms-0") as a comparable pair; InvalidArgument otherwise."""
    match = _ID.fullmatch(text) if isinstance(text, str) else None
    parsed = (int(match.group(1)), int(match.group(2) or 0)) if match is not None else None
    if parsed is None or max(parsed) > _ID_MAX:
        # one id Redis refuses would fail the shared XREAD of every subscription on its lane
        raise InvalidArgument(
            f"event id {str(text)[:40]!r} is not a stream id (ids look like 1700000000000-0, each "
            "part at most 18446744073709551615; '0' replays everything, '$' starts now)"
        )
    return parsed


def format_id(value: StreamId) -> str:
    return f"{value[0]}-{value[1]}"


def release_later(loop: asyncio.AbstractEventLoop, reader: EventReader, slot: Slot) -> None:
    """Finalizer of a subscription dropped without close(): it runs inside any garbage collection,
    on any thread, maybe while the lane iterates its slots, so it only hands the removal to the
    reader's loop (a closed loop reads nothing any more)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(reader.remove, slot)


class Slot:
    """The reader's side of one subscription: its stream, filter, position, buffer and waiter."""

    __slots__ = ("__weakref__", "active", "buffer", "delivered", "error", "lane", "regex", "stream", "waiter")

    def __init__(self, stream: str, regex: KeyMatcher | None, position: StreamId) -> None:
        self.stream = stream
        self.regex = regex
        self.delivered = position  # newest row handed to this slot (matching or not)
        self.buffer: deque[tuple[str, dict[str, str]]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.active = True
        self.lane: Lane | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def offer(self, rows: list[tuple[StreamId, str, dict[str, str]]]) -> None:
        """Take the rows newer than `delivered` (those matching the filter go to the buffer)."""
        if not rows or rows[-1][0] <= self.delivered:
            return
        added = False
        for rid, text, fields in rows:
            if rid <= self.delivered:
                continue
            if self.regex is None or self.regex.match(fields.get("key", "")):
                self.buffer.append((text, fields))
                added = True
        self.delivered = rows[-1][0]
        if added:
            self.wake()
        if len(self.buffer) >= BUFFER_ROWS:
            self.active = False

    def taken(self) -> None:
        """The consumer took a row: a full slot that drained to half rejoins the read."""
        if not self.active and len(self.buffer) <= BUFFER_ROWS // 2 and self.lane is not None:
            self.active = True
            self.lane.rejoin(self)


class _Stream:
    __slots__ = ("pos", "seen", "slots")

    def __init__(self, pos: StreamId) -> None:
        self.pos = pos  # read from here: never later than an active slot's `delivered`
        self.seen: StreamId | None = None  # the newest row Redis handed this lane (a real one)
        self.slots: set[Slot] = set()

    def wanted(self) -> bool:
        return any(slot.active for slot in self.slots)


def _bulk(text: str) -> bytes:
    """One RESP bulk string."""
    data = text.encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


class XreadPacker:
    """A lane's XREAD as RESP bytes, from pieces kept between rounds: each round re-sends every
    stream of the lane, and redis-py would encode its 2,000 arguments anew each time (most of a
    spawn's client CPU at 10,000 agents). A stream's key is packed once; positions are packed once
    each (the cache is dropped when it grows past the lane's streams)."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.ids: dict[str, bytes] = {}

    def xread(self, request: dict[str, str], wake_key: str, wake_id: str, block_ms: int) -> bytes:
        keys, ids = self.keys, self.ids
        if len(ids) > 4 * STREAMS_PER_LANE:
            ids.clear()
        parts = [
            b"*%d\r\n" % (8 + 2 * len(request)),
            _bulk("XREAD"),
            _bulk("COUNT"),
            _bulk(str(READ_COUNT)),
            _bulk("BLOCK"),
            _bulk(str(block_ms)),
            _bulk("STREAMS"),
        ]
        for key in request:
            chunk = keys.get(key)
            if chunk is None:
                chunk = keys[key] = _bulk(key)
            parts.append(chunk)
        parts.append(_bulk(wake_key))
        for position in request.values():
            chunk = ids.get(position)
            if chunk is None:
                chunk = ids[position] = _bulk(position)
            parts.append(chunk)
        parts.append(_bulk(wake_id))
        return b"".join(parts)

    def forget(self, key: str) -> None:
        self.keys.pop(key, None)


async def send_packed(redis: aioredis.Redis, command: bytes, name: str) -> Any:
    """Send a command already packed (`XreadPacker`) on a pool connection and parse its reply as
    redis-py would (`name`'s response callback). A connection whose exchange did not complete
    (an error, a cancellation) is disconnected before it goes back to the pool, so no later
    command reads this one's reply."""
    await redis.initialize()
    pool = redis.connection_pool
    conn = await pool.get_connection()
    try:
        try:
            await conn.send_packed_command(command)
        except (RedisConnectionError, OSError):  # a stale pooled connection: once more, reconnected
            await conn.disconnect()
            await conn.send_packed_command(command)
        return await redis.parse_response(conn, name)
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


class Lane:
    """One task, one blocking XREAD at a time over up to `STREAMS_PER_LANE` streams."""

    def __init__(self, reader: EventReader) -> None:
        self.reader = reader
        self.streams: dict[str, _Stream] = {}
        self.wake_key = EventReaderKeys.wake_key(uuid.uuid4().hex)
        self.wake_id = "0-0"
        self.requested: dict[str, str] = {}  # what the XREAD in flight asks for
        self.blocked = False
        self.wake_pending = False
        self.failing: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        # the XREAD's streams and positions as sent (positions rewritten as rows come), rebuilt
        # only when membership changes: an idle round re-sends it without a pass over the slots
        self.request: dict[str, str] | None = None
        self.idle = asyncio.Event()  # set to end an idle wait (every subscription full)
        self.packer = XreadPacker()

    # -- membership ---------------------------------------------------------------------------

    def add(self, slot: Slot) -> None:
        slot.lane = self
        stream = self.streams.get(slot.stream)
        if stream is None:
            stream = self.streams[slot.stream] = _Stream(slot.delivered)
        stream.slots.add(slot)
        stream.pos = min(stream.pos, slot.delivered)
        self._refresh(slot.stream, stream)
        self._ensure_running()
        self._need(slot)

    def remove(self, slot: Slot) -> None:
        stream = self.streams.get(slot.stream)
        slot.lane = None
        slot.wake()
        if stream is None:
            return
        stream.slots.discard(slot)
        if not stream.slots:  # left out of the next XREAD (no wake: a closed stream costs nothing)
            del self.streams[slot.stream]
            self.packer.forget(slot.stream)
            self.reader.forget(slot.stream, self)
        self._refresh(slot.stream, self.streams.get(slot.stream))

    def rejoin(self, slot: Slot) -> None:
        stream = self.streams.get(slot.stream)
        if stream is not None:
            stream.pos = min(stream.pos, slot.delivered)
            self._refresh(slot.stream, stream)
            self._need(slot)

    def _refresh(self, key: str, stream: _Stream | None) -> None:
        """Bring one stream's entry of the cached XREAD request up to date (O(its subscriptions))."""
        if self.request is None:
            return
        if stream is not None and stream.wanted():
            self.request[key] = format_id(stream.pos)
        else:
            self.request.pop(key, None)

    def _need(self, slot: Slot) -> None:
        """Wake the blocked XREAD if it does not already read what `slot` waits for."""
        asked = self.requested.get(slot.stream)
        if not self.blocked or self.wake_pending or (asked is not None and parse_id(asked) <= slot.delivered):
            return
        self.wake_pending = True
        asyncio.get_running_loop().call_later(WAKE_DELAY, self.reader.send_wake, self)

    def _ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="colony-event-reader")

    # -- the read loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        """The read loop, restarted (after a logged pause) if anything unexpected escapes a round:
        a lane task that ended would leave every subscription on it waiting forever."""
        backoff = OutageBackoff("shared event reader", log, cap=1.0)
        pause = 0.1
        while True:
            try:
                await self._loop(backoff)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("shared event reader: a read round failed; the lane restarts in %.1fs", pause)
                self.blocked = False
                self.requested = {}
                self.request = None  # rebuilt from the streams' positions: rows read again are skipped
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _loop(self, backoff: OutageBackoff) -> None:
        reader = self.reader
        me = asyncio.current_task()
        loop = asyncio.get_running_loop()
        while self.streams:
            if me is not None and me.cancelling():  # a cancel swallowed inside redis-py: honour it
                raise asyncio.CancelledError
            if self.request is None:
                self.request = {k: format_id(st.pos) for k, st in list(self.streams.items()) if st.wanted()}
            if not self.request:  # every subscription is full: woken by the first that drains
                self.requested = {}
                self.blocked = True
                self.wake_pending = False
                await reader.idle_wait(self)
                self.blocked = False
                continue
            self.requested = dict(self.request)
            command = self.packer.xread(self.request, self.wake_key, self.wake_id, reader.block_ms())
            self.blocked = True
            self.wake_pending = False
            sent = loop.time()
            try:
                async with Guard("xread", reader.url, reader.settings.op_timeout_seconds):
                    reply = await send_packed(reader.redis, command, "XREAD")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an outage (or any failed read): the waiting subscriptions hear it
                self.blocked = False
                if isinstance(exc, ResponseError) and await self._isolate(exc):
                    continue  # the streams Redis refuses are out of the lane; the others read on
                self.failing = exc
                self._fail_waiting(exc)
                await backoff.wait(exc)
                continue
            self.blocked = False
            self.failing = None
            backoff.recovered()
            self._dispatch(reply or ())
            busy = COALESCE_SECONDS - (loop.time() - sent)
            if busy > 0 and self.streams:
                await asyncio.sleep(busy)
        self.requested = {}

    def _dispatch(self, reply: Any) -> None:
        for key, rows in reply:
            if key == self.wake_key:
                self.wake_id = rows[-1][0]
                continue
            stream = self.streams.get(key)
            asked = self.requested.get(key)
            if stream is None or asked is None or not rows:
                continue
            # rows from `asked` on: only a subscription that has everything up to `asked` may take
            # them (one that joined meanwhile at an older position would skip the rows between)
            start = parse_id(asked)
            parsed = [(parse_id(rid), rid, fields) for rid, fields in rows]
            if stream.seen is None or parsed[-1][0] > stream.seen:
                stream.seen = parsed[-1][0]
            lowest: StreamId | None = None
            for slot in list(stream.slots):
                if not slot.active:
                    continue
                if slot.delivered >= start:
                    slot.offer(parsed)
                if slot.active and (lowest is None or slot.delivered < lowest):
                    lowest = slot.delivered
            stream.pos = lowest if lowest is not None else parsed[-1][0]
            self._refresh(key, stream)  # a full subscription stops counting

    async def _isolate(self, exc: ResponseError) -> bool:
        """Redis refused the XREAD (not an outage: a key of another type, say): find the streams it
        refuses, one non-blocking XREAD each (pipelined), and end only their subscriptions, with
        `EventStreamRefused`, so one bad stream does not fail every subscription of the lane.
        False when no stream is to blame (the error then goes to every waiting subscription)."""
        reader = self.reader
        keys = [*self.requested, self.wake_key]
        ids = [*self.requested.values(), self.wake_id]
        try:
            guard = Guard("xread_probe", reader.url, reader.settings.op_timeout_seconds)
            async with guard, reader.redis.pipeline(transaction=False) as pipe:
                for key, pos in zip(keys, ids, strict=True):
                    pipe.execute_command("XREAD", "COUNT", 1, "STREAMS", key, pos)
                replies = await pipe.execute(raise_on_error=False)
        except Exception:  # an outage meanwhile: handled as one by the caller
            return False
        refused = [(key, r) for key, r in zip(keys, replies, strict=True) if isinstance(r, ResponseError)]
        for key, error in refused:
            if key == self.wake_key:  # someone overwrote our wake stream: use a new one
                self.wake_key = EventReaderKeys.wake_key(uuid.uuid4().hex)
                self.wake_id = "0-0"
                continue
            stream = self.streams.get(key)
            if stream is None:
                continue
            log.warning(
                "events of %s cannot be read (Redis: %s): its %d subscription(s) end",
                key,
                error,
                len(stream.slots),
            )
            ended = EventStreamRefused(key, error)
            for slot in list(stream.slots):
                slot.error = ended
                self.remove(slot)
        return bool(refused)

    def _fail_waiting(self, exc: BaseException) -> None:
        for stream in list(self.streams.values()):
            for slot in list(stream.slots):
                if slot.waiter is not None and not slot.waiter.done():
                    slot.error = exc
                    slot.wake()


class EventReader:
    """The shared reader of one Redis client (see the module docstring); `reader_for(client)`."""

    def __init__(self, redis: aioredis.Redis, url: str, settings: BlackboardSettings) -> None:
        self.redis = redis
        self.url = url
        self.settings = settings
        self.lanes: list[Lane] = []
        self._where: dict[str, Lane] = {}  # stream key -> the lane reading it
        self._wakes: set[asyncio.Task[None]] = set()

    def block_ms(self) -> int:
        """A lane blocks for half the operation bound (2.5 s by default; `subscribe_block_ms` is the
        per-subscription path's): joins wake it, so a long block costs them no latency, while each
        round re-sends every stream of the lane (the idle cost, 2.4x lower than at 1 s)."""
        s = self.settings
        return max(10, int(s.op_timeout_seconds * 500))

    def add(self, slot: Slot) -> None:
        lane = self._where.get(slot.stream)
        if lane is None:
            lane = self._pick()
            self._where[slot.stream] = lane
        lane.add(slot)

    def remove(self, slot: Slot) -> None:
        if slot.lane is not None:
            slot.lane.remove(slot)

    def forget(self, stream: str, lane: Lane) -> None:
        if self._where.get(stream) is lane:
            del self._where[stream]

    def position(self, stream: str) -> str | None:
        """Where this reader reads `stream` from, while a healthy lane reads it for a subscription
        and has read rows of it: every row appended from now on lies after this id, so a
        subscription started there misses nothing (and a lane already reading there needs no wake).
        Never later than the newest row Redis handed the lane: a subscription that asked for a
        position past the stream's end (a replay's `Last-Event-ID` of a stream that is gone)
        cannot carry it to new runs. None otherwise."""
        lane = self._where.get(stream)
        state = lane.streams.get(stream) if lane is not None else None
        if lane is None or state is None or state.seen is None or lane.failing is not None:
            return None
        return format_id(min(state.pos, state.seen)) if state.wanted() else None

    def _pick(self) -> Lane:
        """The lane being filled (fill one lane before opening the next: joins disturb one XREAD)."""
        self.lanes = [
            lane for lane in self.lanes if lane.streams or lane.task is None or not lane.task.done()
        ]
        for lane in self.lanes:
            if len(lane.streams) < STREAMS_PER_LANE:
                return lane
        if len(self.lanes) < MAX_LANES:
            lane = Lane(self)
            self.lanes.append(lane)
            return lane
        return min(self.lanes, key=lambda lane: len(lane.streams))

    async def idle_wait(self, lane: Lane) -> None:
        lane.idle.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lane.idle.wait(), self.block_ms() / 1000)

    def send_wake(self, lane: Lane) -> None:
        """Wake a blocked lane (scheduled by `Lane._need`)."""
        if not lane.blocked:
            lane.wake_pending = False
            return
        if not lane.requested:  # idle (every subscription full), not in an XREAD
            lane.idle.set()
            return
        task = asyncio.create_task(self._xadd_wake(lane.wake_key), name="colony-event-reader-wake")
        self._wakes.add(task)
        task.add_done_callback(self._wakes.discard)

    async def _xadd_wake(self, key: str) -> None:
        try:
            guard = Guard("reader_wake", self.url, self.settings.op_timeout_seconds)
            async with guard, self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(key, {"w": "1"}, maxlen=1, approximate=False)
                pipe.pexpire(key, WAKE_TTL_MS)
                await pipe.execute()
        except Exception as exc:  # the lane's own read reports an outage; a lost wake costs one block
            log.debug("event reader wake not sent: %r", exc)

    def stats(self) -> dict[str, int]:
        """Lanes, streams and subscriptions now (for tests and benchmarks)."""
        lanes = [lane for lane in self.lanes if lane.streams]
        return {
            "lanes": len(lanes),
            "streams": sum(len(lane.streams) for lane in lanes),
            "subscriptions": sum(len(s.slots) for lane in lanes for s in lane.streams.values()),
        }

    async def aclose(self) -> None:
        """Stop every lane (their subscriptions' `next()` then returns None)."""
        tasks = [lane.task for lane in self.lanes if lane.task is not None]
        for lane in list(self.lanes):
            for stream in list(lane.streams.values()):
                for slot in list(stream.slots):
                    slot.lane = None
                    slot.wake()
            lane.streams.clear()
        self.lanes.clear()
        self._where.clear()
        from colony.aio import cancel_and_wait

        await cancel_and_wait([*tasks, *self._wakes])


_ATTR = "_colony_event_reader"  # the client's (loop, reader), kept on the client itself


def reader_for(redis: aioredis.Redis, url: str, settings: BlackboardSettings) -> EventReader:
    """The shared reader of `redis` in the running event loop (made on first use).

    It lives on the client object, not in a module registry: a registry keyed by the client whose
    value (the reader) refers to the client would keep every client ever used alive. The reader
    takes `url` and `settings` (its block time, its operation bound) from the first blackboard
    that subscribes through this client; blackboards sharing a client share its settings."""
    loop = asyncio.get_running_loop()
    found: tuple[asyncio.AbstractEventLoop, EventReader] | None = getattr(redis, _ATTR, None)
    if found is None or found[0] is not loop:
        found = (loop, EventReader(redis, url, settings))
        setattr(redis, _ATTR, found)
    return found[1]


def existing_reader(redis: aioredis.Redis) -> EventReader | None:
    found: tuple[asyncio.AbstractEventLoop, EventReader] | None = getattr(redis, _ATTR, None)
    return found[1] if found is not None else None


def running_reader(redis: aioredis.Redis) -> EventReader | None:
    """The client's shared reader if it reads in the running event loop (made by none)."""
    found: tuple[asyncio.AbstractEventLoop, EventReader] | None = getattr(redis, _ATTR, None)
    if found is None or found[0] is not asyncio.get_running_loop():
        return None
    return found[1]


def drop_reader(redis: aioredis.Redis) -> EventReader | None:
    """Detach the client's reader (when the client closes) and return it to be closed."""
    found: tuple[asyncio.AbstractEventLoop, EventReader] | None = getattr(redis, _ATTR, None)
    if found is None:
        return None
    with contextlib.suppress(AttributeError):
        delattr(redis, _ATTR)
    return found[1]
