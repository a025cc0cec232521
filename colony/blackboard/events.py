"""Durable blackboard events: subscriptions that resume, and consumer groups that reclaim.

Every write/delete of a scope appends to that scope's Redis Stream. A subscription is read by the
process's shared reader (one XREAD BLOCK over many streams, colony/blackboard/event_reader.py)
and remembers the last id it saw, so passing that id back after a disconnect yields every later
event exactly once. A consumer group hands each event to one consumer, keeps it
pending until acknowledged, and lets a live consumer XAUTOCLAIM what a dead one left pending.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from redis.exceptions import ResponseError

from colony import metrics
from colony.blackboard.event_reader import EventReader, Slot, format_id, parse_id, reader_for, release_later
from colony.blackboard.models import BlackboardEvent
from colony.blackboard.protocol import validate_segment

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard

log = logging.getLogger(__name__)

_READ_COUNT = 256


_GLOB = frozenset("*?[")


class KeyContains:
    """The matcher of a `*text*` glob (text without glob characters), the form a run's event
    stream subscribes with: a substring test instead of a regex compiled anew for every run."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def match(self, key: str) -> bool:
        return self.text in key


KeyMatcher = re.Pattern[str] | KeyContains


def compile_pattern(pattern: str) -> KeyMatcher | None:
    """A matcher for the key glob (None matches everything); `.match(key)` is true when the whole
    key matches, as `fnmatch` would have it."""
    if pattern == "*":
        return None
    inner = pattern[1:-1]
    if len(pattern) > 2 and pattern[0] == "*" and pattern[-1] == "*" and not _GLOB.intersection(inner):
        return KeyContains(inner)
    return re.compile(fnmatch.translate(pattern))


def _block_ms(bb: Blackboard) -> int:
    """XREAD BLOCK time: the configured one, but always well inside the operation's time bound
    (a BLOCK as long as the bound would time out every idle read)."""
    return max(10, min(bb.settings.subscribe_block_ms, int(bb.settings.op_timeout_seconds * 500)))


def _lag(event: BlackboardEvent, mode: str) -> None:
    metrics.BLACKBOARD_EVENTS_RECEIVED.labels(mode).inc()
    metrics.BLACKBOARD_EVENT_LAG_SECONDS.observe(max(0.0, time.time() - event.ts))


class EventSubscription:
    """Async iterator of one scope's events whose key matches a glob; see `Blackboard.subscribe`.

    Shared (the default): the process's `EventReader` (colony/blackboard/event_reader.py) reads
    for it, one XREAD over every subscription of the Redis client; from `start()` until `close()`
    it buffers what arrives (bounded). Not shared (`Blackboard(..., shared_events=False)`): it
    runs its own XREAD BLOCK per `next()`, one connection per waiting subscription (the path the
    density benchmark measures as its baseline).
    """

    def __init__(self, bb: Blackboard, pattern: str, from_id: str, *, shared: bool = True) -> None:
        self._bb = bb
        self._regex = compile_pattern(pattern)
        self.pattern = pattern
        if from_id != "$":
            from_id = format_id(parse_id(from_id))
        self.last_id = from_id
        self._started = from_id != "$"
        self._buffer: deque[tuple[str, dict[str, str]]] = deque()
        self._closed = False
        self._shared = shared
        self._slot: Slot | None = None
        self._reader: EventReader | None = None
        self._finalizer: weakref.finalize[..., EventSubscription] | None = None

    async def start(self) -> EventSubscription:
        """Pin "$" to the newest event now, so nothing appended after this call is missed; a shared
        subscription joins the process's reader here."""
        if not self._started:
            self.last_id = await self._bb.latest_event_id()
            self._started = True
        if self._shared and self._slot is None and not self._closed:
            self._join()
        return self

    def _join(self) -> None:
        bb = self._bb
        reader = reader_for(bb.redis, bb.url, bb.settings)
        slot = Slot(bb.keyspace.events_key, self._regex, parse_id(self.last_id))
        reader.add(slot)
        self._slot, self._reader = slot, reader
        # dropped without close(): the reader lets go of its slot all the same (on its loop, later)
        self._finalizer = weakref.finalize(self, release_later, asyncio.get_running_loop(), reader, slot)

    async def __aenter__(self) -> EventSubscription:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving: the stream leaves the shared XREAD (when no other subscription reads it)."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._slot is not None and self._reader is not None:
            self._reader.remove(self._slot)
            self._slot.buffer.clear()

    def __aiter__(self) -> EventSubscription:
        return self

    async def __anext__(self) -> BlackboardEvent:
        event = await self.next()
        if event is None:
            raise StopAsyncIteration
        return event

    def ready(self) -> bool:
        """Whether `next()` has a matching event at hand (returns it without waiting for Redis):
        a reader can gather the events that arrived together and pass them on as one batch."""
        if self._shared:
            return self._slot is not None and bool(self._slot.buffer)
        regex = self._regex
        return any(regex is None or regex.match(fields["key"]) for _id, fields in self._buffer)

    async def next(self, timeout: float | None = None) -> BlackboardEvent | None:
        """The next matching event; None when `timeout` seconds pass first or the subscription is closed.

        A Redis outage raises `BlackboardUnavailable` (the read made for this subscription failed);
        calling `next()` again later carries on after the last event returned, nothing lost.
        """
        await self.start()
        if self._shared:
            return await self._next_shared(timeout)
        return await self._next_private(timeout)

    async def _next_shared(self, timeout: float | None) -> BlackboardEvent | None:
        slot = self._slot
        if slot is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            if slot.buffer:
                event_id, fields = slot.buffer.popleft()
                slot.taken()
                self.last_id = event_id
                if not slot.buffer and slot.delivered > parse_id(event_id):
                    self.last_id = format_id(slot.delivered)  # rows the filter skipped are seen too
                event = BlackboardEvent.from_stream(self._bb.scope_id, event_id, fields)
                _lag(event, "subscribe")
                return event
            if slot.delivered > parse_id(self.last_id):
                self.last_id = format_id(slot.delivered)
            if slot.error is not None:
                error, slot.error = slot.error, None
                raise error
            if slot.lane is None:  # the reader was closed under it
                return None
            wait = None
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return None
            slot.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(slot.waiter, wait)
            except asyncio.CancelledError:
                if slot.lane is not None:  # an outage told to a wait nobody resumes: stale later
                    slot.error = None
                raise
            except TimeoutError:
                if not slot.buffer and slot.delivered > parse_id(self.last_id):
                    self.last_id = format_id(slot.delivered)  # seen, though none matched
                return None
            finally:
                slot.waiter = None
        return None

    async def _next_private(self, timeout: float | None) -> BlackboardEvent | None:
        """One XREAD BLOCK of its own per wait (the path before the shared reader)."""
        bb = self._bb
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            while self._buffer:
                event_id, fields = self._buffer.popleft()
                self.last_id = event_id
                if self._regex is None or self._regex.match(fields["key"]):
                    event = BlackboardEvent.from_stream(bb.scope_id, event_id, fields)
                    _lag(event, "subscribe")
                    return event
            block = _block_ms(bb)
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return None
                block = min(block, left_ms)
            async with bb.guard("xread"):
                reply = await bb.redis.xread(
                    {bb.keyspace.events_key: self.last_id}, count=_READ_COUNT, block=block
                )
            for _stream, rows in reply or ():
                self._buffer.extend(rows)
        return None


@dataclass
class ConsumedEvent:
    """An event delivered by a consumer group; `ack()` it once handled, or it is redelivered."""

    event: BlackboardEvent
    delivery: Literal["new", "pending", "reclaimed"]
    _consumer: EventConsumer = field(repr=False)

    async def ack(self) -> None:
        await self._consumer.ack(self.event.id)


class EventConsumer:
    """One consumer of a consumer group over a scope's events; see `Blackboard.consume`.

    Order of delivery: this consumer's own pending events (after a restart under the same name),
    then events other consumers left pending past `min_idle_ms` (reclaimed, checked again every
    `min_idle_ms / 2`), then new events. Events whose key does not match are acknowledged and skipped.
    """

    def __init__(
        self, bb: Blackboard, group: str, consumer: str, pattern: str, start_id: str, min_idle_ms: int | None
    ) -> None:
        self._bb = bb
        self.group = validate_segment(group, "group")
        self.consumer = validate_segment(consumer, "consumer")
        self._regex = compile_pattern(pattern)
        self._start_id = start_id
        self.min_idle_ms = min_idle_ms if min_idle_ms is not None else bb.settings.reclaim_idle_ms
        self._buffer: deque[tuple[str, dict[str, str], Literal["new", "pending", "reclaimed"]]] = deque()
        self._created = False
        self._pending_from: str | None = "0"  # where re-reading our own pending list goes on; None = done
        self._next_reclaim = 0.0
        self._closed = False

    async def start(self) -> EventConsumer:
        """Create the group if needed (MKSTREAM); idempotent."""
        if not self._created:
            async with self._bb.guard("xgroup_create"):
                try:
                    await self._bb.redis.xgroup_create(
                        self._bb.keyspace.events_key, self.group, id=self._start_id, mkstream=True
                    )
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
            self._created = True
        return self

    def _lost_group(self, exc: ResponseError) -> bool:
        """A NOGROUP reply: Redis came back without the group (restarted with its data lost, or
        the stream was deleted). Re-create it on the next read, from the start of what the stream
        holds now (nothing appended since the restart is missed); our pending list went with it."""
        if "NOGROUP" not in str(exc):
            return False
        log.warning(
            "consumer group %s of %s is gone (Redis lost it); re-creating it",
            self.group,
            self._bb.keyspace.events_key,
        )
        self._created = False
        self._start_id = "0"
        self._pending_from = "0"
        self._next_reclaim = 0.0
        return True

    def close(self) -> None:
        self._closed = True

    def __aiter__(self) -> EventConsumer:
        return self

    async def __anext__(self) -> ConsumedEvent:
        await self.start()
        while not self._closed:
            while self._buffer:
                event_id, fields, delivery = self._buffer.popleft()
                if not fields:  # deleted from the stream while pending (trimmed)
                    await self.ack(event_id)
                    continue
                if self._regex is not None and not self._regex.match(fields["key"]):
                    await self.ack(event_id)
                    continue
                event = BlackboardEvent.from_stream(self._bb.scope_id, event_id, fields)
                _lag(event, "consume")
                return ConsumedEvent(event, delivery, self)
            try:
                await self._fill()
            except ResponseError as exc:
                if not self._lost_group(exc):
                    raise
                await self.start()
        raise StopAsyncIteration

    async def ack(self, *event_ids: str) -> int:
        """Acknowledge events (0 when the group is gone: nothing is pending in it any more)."""
        try:
            async with self._bb.guard("xack"):
                return int(await self._bb.redis.xack(self._bb.keyspace.events_key, self.group, *event_ids))
        except ResponseError as exc:
            if not self._lost_group(exc):
                raise
            return 0

    async def _fill(self) -> None:
        bb, stream = self._bb, self._bb.keyspace.events_key
        if self._pending_from is not None:
            # Our own pending list, read once through (after a restart under the same name).
            async with bb.guard("xreadgroup"):
                reply = await bb.redis.xreadgroup(
                    self.group, self.consumer, {stream: self._pending_from}, count=_READ_COUNT
                )
            rows = [r for _s, rs in reply or () for r in rs]
            self._pending_from = rows[-1][0] if rows else None
            self._buffer.extend((i, f, "pending") for i, f in rows)
            if rows:
                return
        now = time.monotonic()
        if now >= self._next_reclaim:
            self._next_reclaim = now + self.min_idle_ms / 2000.0
            if await self._reclaim():
                return
        block = min(_block_ms(bb), max(10, int((self._next_reclaim - now) * 1000)))
        async with bb.guard("xreadgroup"):
            reply = await bb.redis.xreadgroup(
                self.group, self.consumer, {stream: ">"}, count=_READ_COUNT, block=block
            )
        self._buffer.extend((i, f, "new") for _s, rs in reply or () for i, f in rs)

    async def _reclaim(self) -> bool:
        bb, start, claimed = self._bb, "0-0", 0
        while True:
            async with bb.guard("xautoclaim"):
                reply = await bb.redis.xautoclaim(
                    bb.keyspace.events_key,
                    self.group,
                    self.consumer,
                    self.min_idle_ms,
                    start_id=start,
                    count=_READ_COUNT,
                )
            start, rows = reply[0], reply[1]
            # Entries trimmed while pending come back as None (Redis 6.2) or in reply[2] (Redis 7).
            live = [(i, f) for i, f in rows if f]
            self._buffer.extend((i, f, "reclaimed") for i, f in live)
            claimed += len(live)
            if start in ("0-0", b"0-0"):
                break
        if claimed:
            metrics.BLACKBOARD_EVENTS_RECLAIMED.inc(claimed)
        return claimed > 0
