"""The blackboard: versioned entries of one scope, in Redis, with durable change events.

One Redis hash per entry plus tag-index sets; every mutation (version check, write, tag index,
event append) is one Lua script, so it is applied whole or not at all.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from colony import metrics
from colony.blackboard import batches, retention
from colony.blackboard.connection import Guard, create_redis, redis_url_of, resolve_redis_url
from colony.blackboard.models import (
    EVENT_VALUE_BYTES,
    BlackboardEntry,
    BlackboardEvent,
    QueryPage,
    TagFilter,
    WriteRequest,
    decode_value,
    encode_tags,
    encode_value,
    ttl_to_ms,
)
from colony.blackboard.protocol import BlackboardKeyspace, validate_key, validate_pattern, validate_tag
from colony.blackboard.query import oldest_tagged, run_query
from colony.blackboard.script_calls import ScriptCall, scripts_of
from colony.blackboard.writes import opt, write_args, written_entry
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import ConcurrentModificationError, InvalidArgument

if TYPE_CHECKING:
    from colony.blackboard.events import EventConsumer, EventSubscription
    from colony.blackboard.transaction import Transaction

TAGGED_PAGE = 256  # tag-set members `read_many_and_tagged` looks through in its one SSCAN call

UpdateFn = Callable[[Any], Any] | Callable[[Any], Awaitable[Any]]


def _check_client(redis: Any) -> None:
    """Refuse a client the blackboard cannot use before anything is written: its Lua replies and
    hashes are parsed as `str`, so a bytes-returning client (redis-py's default) would write an
    entry and then fail reading the reply back."""
    hint = "create one with colony.blackboard.create_redis(url)"
    if not isinstance(redis, aioredis.Redis):
        raise InvalidArgument(
            f"Blackboard needs an asyncio client (redis.asyncio.Redis), not {type(redis).__name__}; {hint}"
        )
    if not redis.connection_pool.connection_kwargs.get("decode_responses", False):
        raise InvalidArgument(
            "Blackboard needs a Redis client created with decode_responses=True (this one returns bytes); "
            f"{hint}, or pass decode_responses=True to redis.asyncio.Redis"
        )


class Blackboard:
    """Entries of one scope. Cheap to create: many `Blackboard`s may share one Redis client.

    `shared_events` (default True): subscriptions of every blackboard on this client share one
    event reader (colony/blackboard/event_reader.py); False gives each subscription its own
    blocking XREAD (one connection per waiting subscriber: the baseline `benchmarks/density.py`
    compares with). Blackboards made by `scoped()` inherit it."""

    def __init__(
        self,
        redis: aioredis.Redis,
        scope_id: str,
        *,
        settings: BlackboardSettings | None = None,
        shared_events: bool = True,
    ) -> None:
        _check_client(redis)
        self.redis = redis
        self.shared_events = shared_events
        self.settings = settings or BlackboardSettings()
        self.keyspace = BlackboardKeyspace(scope_id)
        self.scope_id = self.keyspace.scope_id
        self.url = redis_url_of(redis)
        registered = scripts_of(redis)
        self._write = registered.write
        self._write_batch = registered.write_batch
        self._delete = registered.delete
        self._commit = registered.commit
        self.prune_tag_index = registered.prune_tag_index
        self._expire = registered.expire
        self._expire_key = registered.expire_key
        self._maxlen = str(self.settings.events_maxlen)
        self._include_values = "1" if self.settings.include_values_in_events else "0"

    @classmethod
    def connect(cls, scope_id: str, settings: ColonySettings) -> Blackboard:
        """A blackboard on the Redis named by the settings (`redis_url`, else the embedded one)."""
        client = create_redis(resolve_redis_url(settings), settings.blackboard)
        return cls(client, scope_id, settings=settings.blackboard)

    def scoped(self, scope_id: str) -> Blackboard:
        """The blackboard of another scope on the same Redis client."""
        return Blackboard(self.redis, scope_id, settings=self.settings, shared_events=self.shared_events)

    def guard(self, op: str) -> Guard:
        return Guard(op, self.url, self.settings.op_timeout_seconds)

    async def close(self) -> None:
        """Close the underlying Redis client (shared clients: close once, from their owner), and
        stop its shared event reader (its subscriptions then end: `next()` returns None)."""
        from colony.blackboard.event_reader import drop_reader

        reader = drop_reader(self.redis)
        if reader is not None:
            await reader.aclose()
        await self.redis.aclose()

    # -- single entries ---------------------------------------------------------------------

    async def write(
        self,
        key: str,
        value: Any,
        *,
        tags: Iterable[str] = (),
        created_by: str | None = None,
        ttl_seconds: float | None = None,
        expected_version: int | None = None,
        value_in_event: bool = False,
    ) -> BlackboardEntry:
        """Write `value` under `key`; with `expected_version` (0 = must not exist), only if it matches.
        `value_in_event`: the write's event carries the value too when it is at most
        `EVENT_VALUE_BYTES` encoded (a subscriber then needs no read; a run's events use it)."""
        validate_key(key)
        encoded, encoded_tags = encode_value(value), encode_tags(tags)
        with_value = value_in_event and len(encoded) <= EVENT_VALUE_BYTES
        args = write_args(
            self, key, encoded, encoded_tags, created_by, ttl_seconds, expected_version, with_value
        )
        async with self.guard("write"):
            reply = await self._write(
                keys=[self.keyspace.entry_key(key), self.keyspace.events_key, self.keyspace.expiry_key],
                args=args,
            )
        return written_entry(key, encoded, encoded_tags, created_by, expected_version, reply)

    async def read(self, key: str) -> BlackboardEntry | None:
        validate_key(key)
        async with self.guard("read"):
            fields = await self.redis.hgetall(self.keyspace.entry_key(key))
        return BlackboardEntry.from_hash(key, fields) if fields else None

    async def read_many(self, keys: Sequence[str]) -> list[BlackboardEntry | None]:
        """Entries of `keys`, in order (None where absent), in one round trip."""
        entries, _ = await self.read_many_and_tagged(keys)
        return entries

    async def read_many_and_tagged(
        self, keys: Sequence[str], tag: str | None = None, pattern: str = "*"
    ) -> tuple[list[BlackboardEntry | None], list[str] | None]:
        """`read_many`, and in the same round trip the keys carrying `tag` that match `pattern`
        (one SSCAN page of TAGGED_PAGE): that list when the page covered the whole tag set, None
        when the set is larger (the caller queries it), or without a `tag`."""
        for key in keys:
            validate_key(key)
        if tag is not None:
            validate_tag(tag)
            validate_pattern(pattern)
        async with self.guard("read_many"), self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(self.keyspace.entry_key(key))
            if tag is not None:
                pipe.sscan(self.keyspace.tag_key(tag), 0, match=pattern, count=TAGGED_PAGE)
            replies = await pipe.execute()
        found = zip(keys, replies[: len(keys)], strict=True)
        entries = [BlackboardEntry.from_hash(k, f) if f else None for k, f in found]
        if tag is None:
            return entries, None
        cursor, tagged = replies[-1]
        return entries, (sorted(set(tagged)) if int(cursor) == 0 else None)

    async def delete(
        self, key: str, *, expected_version: int | None = None, created_by: str | None = None
    ) -> bool:
        """Delete `key`; True if it existed. With `expected_version`, only if it matches."""
        validate_key(key)
        ks = self.keyspace
        args = [key, opt(expected_version), created_by or "", ks.tag_prefix, self._maxlen, ks.entry_prefix]
        async with self.guard("delete"):
            ok, version = await self._delete(
                keys=[ks.entry_key(key), ks.events_key, ks.expiry_key], args=args
            )
        if not ok:
            metrics.BLACKBOARD_CONFLICTS.inc()
            raise ConcurrentModificationError(key, expected_version, int(version))
        return int(version) > 0

    # -- batches ----------------------------------------------------------------------------

    async def write_many(
        self, writes: Iterable[WriteRequest | Mapping[str, Any]], *, chunk_size: int = 256
    ) -> list[BlackboardEntry]:
        """Write a batch in one round trip; each write is checked and applied on its own.

        The batch goes to Redis as pipelined script calls of `chunk_size` writes, each call
        atomic. Raises `BatchConflictError` (listing conflicts and the entries applied) if any
        write's `expected_version` did not match; the others are applied all the same.
        """
        return await batches.write_many(self, writes, chunk_size)

    async def write_group(
        self,
        writes: Iterable[WriteRequest | Mapping[str, Any]],
        *,
        tag: str,
        ttl_seconds: float,
        first: tuple[Blackboard, Iterable[WriteRequest | Mapping[str, Any]]] | None = None,
        outlive: str | None = None,
    ) -> list[BlackboardEntry]:
        """`write_many` and then the expiry of the group's tag set `tag` (`retention.expire_tag`), in one
        round trip; `first`: writes of another scope on the same Redis, applied before them in
        that round trip; `outlive`: a tag of `first`'s scope whose set is kept at least as long
        (colony.blackboard.batches)."""
        return await batches.write_group(
            self, writes, tag=tag, ttl_seconds=ttl_seconds, first=first, outlive=outlive
        )

    # -- read-modify-write --------------------------------------------------------------------

    async def update(
        self,
        key: str,
        fn: UpdateFn,
        *,
        tags: Iterable[str] | None = None,
        created_by: str | None = None,
        ttl_seconds: float | None = None,
        retries: int | None = None,
    ) -> BlackboardEntry:
        """Set `key` to `fn(current value or None)`, retrying on conflict; `fn` may be async.

        `tags=None` keeps the entry's tags and `ttl_seconds=None` its expiry (if it has one).
        Raises `ConcurrentModificationError` when every retry lost the race.
        """
        attempts = retries if retries is not None else self.settings.update_retries
        metrics.BLACKBOARD_OPS.labels("update").inc()
        delay = 0.0005
        for attempt in range(attempts + 1):
            current = await self.read(key)
            new_value = fn(current.value if current else None)
            if inspect.isawaitable(new_value):
                new_value = await new_value
            keep_tags = current.tags if (tags is None and current) else (tags or ())
            ttl = ttl_seconds
            if ttl is None and current is not None and current.expires_at is not None:
                ttl = max(0.001, current.expires_at - time.time())
            try:
                return await self.write(
                    key,
                    new_value,
                    tags=keep_tags,
                    created_by=created_by,
                    ttl_seconds=ttl,
                    expected_version=current.version if current else 0,
                )
            except ConcurrentModificationError as exc:
                if attempt == attempts:
                    raise ConcurrentModificationError(
                        key,
                        exc.expected,
                        exc.actual,
                        f"update of {key!r} lost the race {attempts + 1} times; "
                        "raise retries or reduce contention",
                    ) from exc
                metrics.BLACKBOARD_UPDATE_RETRIES.inc()
                await asyncio.sleep(random.uniform(0, delay))
                delay = min(delay * 2, 0.05)
        raise AssertionError("unreachable")

    # -- retention (colony.blackboard.retention) ---------------------------------------------

    async def expire(
        self, keys: Iterable[str], ttl_seconds: float, *, tag: str | None = None, trim_events: bool = False
    ) -> int:
        """Make entries expire in `ttl_seconds` (unless they already expire sooner; never extends).

        With `tag`, every entry carrying it and the tag's index set expire too: that is how a
        group of keys (e.g. all keys of one finished run) is retired without knowing each key.
        The tag set is paged through with SSCAN, one script call per `EXPIRE_CHUNK` members, so no
        call blocks Redis for long however large the group. With `trim_events`, this scope's events
        older than `ttl_seconds` are trimmed from its stream (besides the MAXLEN cap every append
        applies). Returns how many entries got the expiry.
        """
        return await retention.expire(self, keys, ttl_seconds, tag=tag, trim_events=trim_events)

    async def refresh(self, keys: Iterable[str], ttl_seconds: float) -> int:
        """Set the expiry of existing entries to `ttl_seconds` from now, sooner or later than it
        was (e.g. a page used again); missing entries are skipped. Returns how many were set."""
        return await retention.refresh(self, keys, ttl_seconds)

    async def retire_group(
        self,
        key: str,
        value: Any,
        *,
        created_by: str | None,
        ttl_seconds: float,
        tag: str,
        trim_events: bool = False,
        elsewhere: Iterable[tuple[Blackboard, Sequence[str]]] = (),
    ) -> None:
        """In one round trip, in this order: write `key` (expiring in `ttl_seconds`), then make
        the group `tag` expire (`expire(..., tag=tag, trim_events=...)`), then the listed keys of
        other scopes on the same Redis (`elsewhere`). What a finished request leaves is retired
        so. A group larger than EXPIRE_CHUNK is paged afterwards, as `expire` pages it."""
        await retention.retire_group(
            self,
            key,
            value,
            created_by=created_by,
            ttl_seconds=ttl_seconds,
            tag=tag,
            trim_events=trim_events,
            elsewhere=elsewhere,
        )

    def retire_calls(
        self,
        *,
        ttl_seconds: float,
        tag: str,
        trim_events: bool = False,
        elsewhere: Iterable[tuple[Blackboard, Sequence[str]]] = (),
    ) -> list[ScriptCall]:
        """The script calls of `retire_group` after its write, for a caller that sends them in a
        round trip of its own (`Transaction.followed_by`); `group_retired` reads the first's reply."""
        return retention.retire_calls(
            self, ttl_seconds=ttl_seconds, tag=tag, trim_events=trim_events, elsewhere=elsewhere
        )

    group_retired = staticmethod(retention.group_retired)

    async def expire_ring(self, name: str, ttl_seconds: float) -> bool:
        """Make a ring expire in `ttl_seconds` (unless it expires sooner); False if there is none."""
        async with self.guard("expire_ring"):
            return bool(
                await self._expire_key(keys=[self.keyspace.ring_key(name)], args=[ttl_to_ms(ttl_seconds)])
            )

    async def expire_scope(self, ttl_seconds: float) -> None:
        """Make this scope's event stream and expiry index expire in `ttl_seconds` (unless sooner),
        for a scope that is done for good (a stopped agent's). A later write does not undo it."""
        ttl = ttl_to_ms(ttl_seconds)
        async with self.guard("expire_scope"):
            for key in (self.keyspace.events_key, self.keyspace.expiry_key):
                await self._expire_key(keys=[key], args=[ttl])

    async def ring(self, name: str) -> list[Any]:
        """The items of a ring, oldest first (see `Transaction.ring_push`)."""
        async with self.guard("ring"):
            items = await self.redis.lrange(self.keyspace.ring_key(name), 0, -1)
        return [decode_value(item) for item in items]

    def transaction(self) -> Transaction:
        """`async with bb.transaction() as tx:` — reads recorded, writes applied atomically at exit."""
        from colony.blackboard.transaction import Transaction

        return Transaction(self)

    # -- queries ------------------------------------------------------------------------------

    async def query(
        self,
        pattern: str = "*",
        *,
        tags: TagFilter | Mapping[str, Iterable[str]] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> QueryPage:
        """Entries whose key matches the glob `pattern` and whose tags pass `tags`, a page at a time.

        Uses SCAN/SSCAN (never KEYS): pages cost O(page), not O(keyspace). Like SCAN, an entry
        written during the iteration may or may not be seen.
        """
        validate_pattern(pattern)
        if limit < 1:
            raise InvalidArgument(f"limit must be >= 1, got {limit}")
        tag_filter = tags if isinstance(tags, TagFilter) or tags is None else TagFilter.model_validate(tags)
        async with self.guard("query"):
            return await run_query(self, pattern, tag_filter, limit, cursor)

    async def oldest_tagged(
        self, tag: str, limit: int = 100, needs: Callable[[str], str] | None = None
    ) -> list[str]:
        """Keys of up to `limit` entries carrying `tag`, oldest first, without reading their values
        (a backlog's head; with `needs`, only those whose companion entry `needs(key)` exists; see
        `colony.blackboard.query.oldest_tagged`)."""
        validate_tag(tag)
        async with self.guard("oldest_tagged"):
            return await oldest_tagged(self, tag, max(1, limit), needs)

    async def iter_query(
        self,
        pattern: str = "*",
        *,
        tags: TagFilter | Mapping[str, Iterable[str]] | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[BlackboardEntry]:
        """Every matching entry, fetched page by page."""
        cursor: str | None = None
        while True:
            page = await self.query(pattern, tags=tags, limit=page_size, cursor=cursor)
            for entry in page.entries:
                yield entry
            if page.cursor is None:
                return
            cursor = page.cursor

    # -- events -------------------------------------------------------------------------------

    def subscribe(self, pattern: str = "*", *, from_id: str = "$") -> EventSubscription:
        """Async iterator over this scope's events whose key matches `pattern`.

        `from_id="$"` starts at the moment `start()` (or the first iteration) runs; pass the
        `id` of the last event seen to resume after it with nothing lost; "0" replays all (any
        other text: `InvalidArgument`). Close it when done (`close()` or `async with`): until
        then the process's shared reader keeps reading for it (bounded buffer).
        """
        from colony.blackboard.events import EventSubscription

        return EventSubscription(self, validate_pattern(pattern), from_id, shared=self.shared_events)

    def consume(
        self,
        group: str,
        consumer: str,
        pattern: str = "*",
        *,
        start_id: str = "0",
        min_idle_ms: int | None = None,
    ) -> EventConsumer:
        """At-least-once delivery of events to the consumers of `group` (each event to one of them).

        Events must be acknowledged (`await event.ack()`); events a dead consumer left pending for
        `min_idle_ms` are reclaimed by a live one.
        """
        from colony.blackboard.events import EventConsumer

        return EventConsumer(self, group, consumer, validate_pattern(pattern), start_id, min_idle_ms)

    def read_event_position(self) -> str | None:
        """An id every event this scope appends from now on comes after, known without asking
        Redis: where the process's shared reader reads this scope's stream, while it reads it for
        some subscription (None otherwise: use `latest_event_id`)."""
        from colony.blackboard.event_reader import running_reader

        reader = running_reader(self.redis) if self.shared_events else None
        return reader.position(self.keyspace.events_key) if reader is not None else None

    async def latest_event_id(self) -> str:
        """Id of the newest event of this scope ("0-0" if none)."""
        async with self.guard("latest_event_id"):
            newest = await self.redis.xrevrange(self.keyspace.events_key, count=1)
        return newest[0][0] if newest else "0-0"

    async def last_generated_event_id(self) -> str | None:
        """The id of the newest event this scope ever appended, even if trimmed since; None when
        the scope has no event stream (none yet, or it expired)."""
        async with self.guard("last_generated_event_id"):
            try:
                info = await self.redis.xinfo_stream(self.keyspace.events_key)
            except ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return None
                raise
        return str(info["last-generated-id"])

    async def events(
        self, from_id: str = "-", to_id: str = "+", *, count: int = 1000
    ) -> list[BlackboardEvent]:
        """Stored events between two ids, inclusive (replay / audit)."""
        async with self.guard("events"):
            rows = await self.redis.xrange(self.keyspace.events_key, min=from_id, max=to_id, count=count)
        return [BlackboardEvent.from_stream(self.scope_id, event_id, fields) for event_id, fields in rows]
