"""Paged queries over one scope's entries, by key pattern and tags, without KEYS.

Candidates come from SCAN over the scope's entry keys, or from SSCAN over tag-index sets when
the filter names tags. A cursor says which source, which SCAN cursor, and the last key handed
out from that SCAN batch (batches are sorted), so a page holds exactly `limit` entries and the
next page resumes mid-batch. Index members whose entry expired are removed on the way.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from colony.blackboard.models import BlackboardEntry, QueryPage, TagFilter, _ms, decode_tags
from colony.blackboard.protocol import validate_key, validate_tag
from colony.errors import InvalidKey

MAX_SCAN_ROUNDS = 64  # SCAN calls per page at most; a page may come back short, with a cursor
OLDEST_SAMPLE = 256  # tag members `oldest_tagged` compares at least (the whole set when smaller)

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard


@dataclass
class _Cursor:
    tags: list[str] | None  # None: SCAN the scope; else SSCAN these tag sets in order
    index: int  # which tag set
    scan: int  # Redis cursor of the batch being read
    last_key: str | None  # last key handed out from that batch
    count: int  # SCAN COUNT: fixed for the whole iteration, so a re-read batch is the same batch

    def encode(self) -> str:
        raw = json.dumps(
            {"t": self.tags, "i": self.index, "c": self.scan, "k": self.last_key, "n": self.count}
        )
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def decode(cls, text: str) -> _Cursor:
        try:
            raw = json.loads(base64.urlsafe_b64decode(text.encode()))
            return cls(raw["t"], int(raw["i"]), int(raw["c"]), raw["k"], int(raw["n"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidKey(f"query cursor {text[:40]!r} is not one this blackboard handed out") from exc


def _first_cursor(tag_filter: TagFilter | None, limit: int) -> _Cursor:
    count = min(max(2 * limit, 256), 5000)
    if tag_filter is not None and tag_filter.all_of:
        # Any one all_of set holds every answer; the filter checks the rest.
        return _Cursor(sorted(tag_filter.all_of)[:1], 0, 0, None, count)
    if tag_filter is not None and tag_filter.any_of:
        return _Cursor(sorted(tag_filter.any_of), 0, 0, None, count)
    return _Cursor(None, 0, 0, None, count)


async def run_query(
    bb: Blackboard, pattern: str, tag_filter: TagFilter | None, limit: int, cursor_text: str | None
) -> QueryPage:
    cursor = _Cursor.decode(cursor_text) if cursor_text else _first_cursor(tag_filter, limit)
    keyspace, redis = bb.keyspace, bb.redis
    out: list[BlackboardEntry] = []
    for _round in range(MAX_SCAN_ROUNDS):
        tag: str | None = None
        if cursor.tags is None:
            next_scan, raw = await redis.scan(
                cursor.scan, match=keyspace.entry_match(pattern), count=cursor.count
            )
            keys = [keyspace.logical_key(k) for k in raw]
        else:
            tag = cursor.tags[cursor.index]
            next_scan, keys = await redis.sscan(
                keyspace.tag_key(tag), cursor.scan, match=pattern, count=cursor.count
            )
        keys = sorted(set(keys))
        if cursor.last_key is not None:
            keys = [k for k in keys if k > cursor.last_key]
        entries = await _fetch(bb, keys, tag)
        earlier_tags = frozenset(cursor.tags[: cursor.index]) if cursor.tags else frozenset()
        for position, entry in enumerate(entries):
            if entry is None or (tag_filter is not None and not tag_filter.matches(entry.tags)):
                continue
            if earlier_tags and not earlier_tags.isdisjoint(entry.tags):
                continue  # any_of: already handed out while reading an earlier tag's set
            out.append(entry)
            if len(out) == limit:
                if position < len(entries) - 1:
                    resume = _Cursor(cursor.tags, cursor.index, cursor.scan, entry.key, cursor.count)
                    return QueryPage(entries=out, cursor=resume.encode())
                break
        next_cursor = _advance(cursor, int(next_scan))
        if next_cursor is None or len(out) == limit:
            return QueryPage(entries=out, cursor=next_cursor.encode() if next_cursor else None)
        cursor = next_cursor
    # A selective pattern over a large database: hand back what was found and where to go on,
    # rather than scanning everything inside one bounded operation.
    return QueryPage(entries=out, cursor=cursor.encode())


def _advance(cursor: _Cursor, next_scan: int) -> _Cursor | None:
    if next_scan != 0:
        return _Cursor(cursor.tags, cursor.index, next_scan, None, cursor.count)
    if cursor.tags is not None and cursor.index + 1 < len(cursor.tags):
        return _Cursor(cursor.tags, cursor.index + 1, 0, None, cursor.count)
    return None


async def _fetch(bb: Blackboard, keys: list[str], tag: str | None) -> list[BlackboardEntry | None]:
    """Entries of `keys` (None where gone). Read from a tag's index set, members whose entry is gone
    or no longer carries the tag (it expired and came back with other tags) are None, and pruned."""
    if not keys:
        return []
    async with bb.redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hgetall(bb.keyspace.entry_key(key))
        replies = await pipe.execute()
    entries = [BlackboardEntry.from_hash(k, f) if f else None for k, f in zip(keys, replies, strict=True)]
    if tag is not None:
        stale = [k for k, e in zip(keys, entries, strict=True) if e is None or tag not in e.tags]
        if stale:
            await bb.prune_tag_index(
                keys=[bb.keyspace.tag_key(tag)], args=[bb.keyspace.entry_prefix, tag, *stale]
            )
        entries = [e if e is not None and tag in e.tags else None for e in entries]
    return entries


async def oldest_tagged(
    bb: Blackboard, tag: str, limit: int, needs: Callable[[str], str] | None = None
) -> list[str]:
    """Up to `limit` keys of the entries carrying `tag`, oldest first (creation time, then key),
    among a sample of the tag's set: all of it up to `OLDEST_SAMPLE` (or 2 * `limit`) members,
    else about that many read from a random place in it (each call another place). One pipelined
    HMGET reads their creation times and tags: no value is read or parsed, so picking the head of a
    backlog costs a fraction of a query. Members whose entry is gone or no longer carries the tag
    are left out, and pruned. With `needs`, a member is left out (not pruned) unless the entry
    `needs(member)` names exists too, checked in the same round trip (a queue marker whose item
    is not written yet)."""
    keyspace, redis = bb.keyspace, bb.redis
    tag_set = keyspace.tag_key(tag)
    sample = max(2 * limit, OLDEST_SAMPLE)
    members: set[str] = set()
    # The set's size comes with a first page read from its start, in one round trip: a set the
    # page holds whole (the usual case: an empty or short backlog) needs nothing more. A larger one
    # is sampled from a random place instead (its hash table's buckets, wrapping round once), so no
    # member is passed over for good while others keep coming.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.scard(tag_set)
        pipe.sscan(tag_set, 0, count=sample)
        size, (cursor, page) = await pipe.execute()
    members.update(page)
    if cursor != 0 and len(members) < int(size):
        members.clear()
        cursor = random.getrandbits(32)
        wrapped = False
        for _round in range(MAX_SCAN_ROUNDS):
            cursor, page = await redis.sscan(tag_set, cursor, count=sample)
            members.update(page)
            if len(members) >= sample or (cursor == 0 and wrapped):
                break
            if cursor == 0:
                wrapped = True
    dated = await _dated(bb, tag, sorted(members), needs)
    return [key for _at, key in dated[:limit]]


async def newest_tagged(
    bb: Blackboard, tag: str, limit: int, most: int, member_ok: Callable[[str], bool] | None = None
) -> tuple[list[str], int, bool]:
    """Up to `limit` keys of the entries carrying `tag`, newest first (creation time, then key,
    both descending); how many live entries carry it; and whether the set held more than `most`
    members, in which case only `most` of them (in the set's own order) were compared and the
    keys are the newest among those, not necessarily the newest of all (the count is then the
    set's size less the stale members seen). `member_ok`: members it refuses are left out and not
    counted (a member that is no key of the kind listed). Stale members are pruned as
    `oldest_tagged` prunes them."""
    validate_tag(tag)
    redis, tag_set = bb.redis, bb.keyspace.tag_key(tag)
    size = int(await redis.scard(tag_set))
    members: set[str] = set()
    cursor = 0
    for _round in range(MAX_SCAN_ROUNDS + most // 1000):
        cursor, page = await redis.sscan(tag_set, cursor, count=min(most, 1000))
        members.update(page)
        if cursor == 0 or len(members) >= most:
            break
    keys = sorted(members)[:most]  # (SSCAN's count is a hint: a page may hold more)
    truncated = len(keys) < size
    refused = {k for k in keys if member_ok is not None and not member_ok(k)}
    dated = await _dated(bb, tag, [k for k in keys if k not in refused], None)
    live = size - (len(keys) - len(dated)) if truncated else len(dated)
    dated.reverse()  # newest first (ties: the greater key first)
    return [key for _at, key in dated[:limit]], live, truncated


async def _dated(
    bb: Blackboard, tag: str, keys: list[str], needs: Callable[[str], str] | None
) -> list[tuple[float, str]]:
    """(creation time, key) of the members `keys` of the tag's set, oldest first, read in one
    pipelined round trip (no value is read or parsed); members whose entry is gone or no longer
    carries the tag are pruned, and with `needs` those whose companion is missing are left out."""
    if not keys:
        return []
    keyspace, redis = bb.keyspace, bb.redis
    companions = [_companion(needs, key) if needs is not None else None for key in keys]
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hmget(keyspace.entry_key(key), "ca", "tags")
        for companion in companions:
            if companion is not None:
                pipe.exists(keyspace.entry_key(companion))
        replies = await pipe.execute()
    exists = iter(replies[len(keys) :])
    present = [needs is None or (c is not None and bool(next(exists))) for c in companions]
    dated: list[tuple[float, str]] = []
    stale: list[str] = []
    for key, (created, tags), there in zip(keys, replies[: len(keys)], present, strict=True):
        if created is None or tag not in decode_tags(tags):
            stale.append(key)
        elif there:
            dated.append((_ms(created) or 0.0, key))
    if stale:
        await bb.prune_tag_index(keys=[keyspace.tag_key(tag)], args=[keyspace.entry_prefix, tag, *stale])
    dated.sort()
    return dated


def _companion(needs: Callable[[str], str], key: str) -> str | None:
    """The entry `key` needs (`oldest_tagged`), or None when that is no valid key: the member is
    left out rather than failing every call (a tag set's members are read back from Redis)."""
    try:
        return validate_key(needs(key))
    except InvalidKey:
        return None
