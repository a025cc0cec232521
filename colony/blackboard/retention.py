"""Giving entries an expiry: one scope's keys or a whole tag group (what a finished run leaves),
paged through the EXPIRE script a bounded chunk at a time, and a finished request's retirement in
one round trip (`retire_group`, or its calls sent after a commit: `retire_calls`). `Blackboard`
delegates here (docs/blackboard.md, Retention)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from colony.blackboard.models import encode_tags, encode_value, ttl_to_ms
from colony.blackboard.protocol import validate_key, validate_tag
from colony.blackboard.script_calls import ScriptCall, run_scripts
from colony.blackboard.writes import write_args, written_entry
from colony.errors import InvalidArgument

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard

EXPIRE_CHUNK = 500  # members of a tag set one expire script call handles (bounded work per call)


async def expire(
    board: Blackboard, keys: Iterable[str], ttl_seconds: float, *, tag: str | None, trim_events: bool
) -> int:
    """`Blackboard.expire`."""
    names = [validate_key(k) for k in keys]
    group = validate_tag(tag) if tag else ""
    ttl = ttl_to_ms(ttl_seconds)
    async with board.guard("expire"):
        if group:  # a small group (one run's keys) in one call, with the names and the trim
            tag_set = board.keyspace.tag_key(group)
            done = await _expire_chunk(
                board, _expire_call(board, names, ttl, group, trim_events, extend=False, whole=tag_set)
            )
            if done >= 0:
                return done
        count = 0
        if names or trim_events:
            count = await _expire_chunk(
                board, _expire_call(board, names, ttl, group, trim_events, extend=False)
            )
        if not group:
            return count
        cursor = 0
        while True:
            cursor, members = await board.redis.sscan(tag_set, cursor, count=EXPIRE_CHUNK)
            for start in range(0, len(members), EXPIRE_CHUNK):
                chunk = members[start : start + EXPIRE_CHUNK]
                count += await _expire_chunk(
                    board, _expire_call(board, chunk, ttl, group, False, extend=False)
                )
            if cursor == 0:
                break
        await board._expire_key(keys=[tag_set], args=[ttl])  # the set last: its scan is over
        return count


async def expire_tag(board: Blackboard, tag: str, ttl_seconds: float) -> bool:
    """Make a tag's index set alone expire in `ttl_seconds` (unless sooner), e.g. the tag set of
    a group whose members already carry an expiry. False if the set does not exist."""
    key = board.keyspace.tag_key(validate_tag(tag))
    async with board.guard("expire_tag"):
        return bool(await board._expire_key(keys=[key], args=[ttl_to_ms(ttl_seconds)]))


async def refresh(board: Blackboard, keys: Iterable[str], ttl_seconds: float) -> int:
    """`Blackboard.refresh`."""
    names = [validate_key(k) for k in keys]
    ttl = ttl_to_ms(ttl_seconds)
    count = 0
    async with board.guard("refresh"):
        for start in range(0, len(names), EXPIRE_CHUNK):
            count += await _expire_chunk(
                board, _expire_call(board, names[start : start + EXPIRE_CHUNK], ttl, "", False, extend=True)
            )
    return count


async def retire_group(
    board: Blackboard,
    key: str,
    value: Any,
    *,
    created_by: str | None,
    ttl_seconds: float,
    tag: str,
    trim_events: bool,
    elsewhere: Iterable[tuple[Blackboard, Sequence[str]]],
) -> None:
    """`Blackboard.retire_group`."""
    validate_key(key)
    encoded, encoded_tags = encode_value(value), encode_tags(())
    args = write_args(board, key, encoded, encoded_tags, created_by, ttl_seconds, None)
    ks = board.keyspace
    entry_keys = [ks.entry_key(key), ks.events_key, ks.expiry_key]
    calls: list[ScriptCall] = [(board._write, entry_keys, args)]
    calls += retire_calls(
        board, ttl_seconds=ttl_seconds, tag=tag, trim_events=trim_events, elsewhere=elsewhere
    )
    async with board.guard("retire"):
        replies = await run_scripts(board.redis, calls)
    written_entry(key, encoded, encoded_tags, created_by, None, replies[0])
    if not group_retired(replies[1]):  # a large group: paged, with the trim
        await expire(board, [], ttl_seconds, tag=tag, trim_events=trim_events)


def retire_calls(
    board: Blackboard,
    *,
    ttl_seconds: float,
    tag: str,
    trim_events: bool,
    elsewhere: Iterable[tuple[Blackboard, Sequence[str]]],
) -> list[ScriptCall]:
    """The script calls of `retire_group` after its write: the group `tag`'s expiry, then the
    listed keys of other scopes on the same Redis. The first call's reply says whether the group
    was done (`group_retired`)."""
    group = validate_tag(tag)
    ttl = ttl_to_ms(ttl_seconds)
    whole = board.keyspace.tag_key(group)
    calls: list[ScriptCall] = [
        (board._expire, *_expire_call(board, [], ttl, group, trim_events, extend=False, whole=whole))
    ]
    for other, names in elsewhere:
        if other.redis is not board.redis:
            raise InvalidArgument("retire_group retires keys of scopes on the same Redis client only")
        checked = [validate_key(n) for n in names]
        calls.append((other._expire, *_expire_call(other, checked, ttl, "", False, extend=False)))
    return calls


def group_retired(reply: Any) -> bool:
    """False when the first of `retire_calls` found the group too large for one call: nothing of
    it was done, and it is to be paged (`expire(..., tag=...)`)."""
    return int(reply) >= 0


async def _expire_chunk(board: Blackboard, call: tuple[list[str], list[str]]) -> int:
    """One EXPIRE script call (`_expire_call`'s keys and arguments); with the group's whole tag
    set, the set's members too when it has at most EXPIRE_CHUNK of them, else -1 and nothing
    done."""
    keys, args = call
    return int(await board._expire(keys=keys, args=args))


def _expire_call(
    board: Blackboard,
    names: Sequence[str],
    ttl: str,
    group: str,
    trim: bool,
    *,
    extend: bool,
    whole: str = "",
) -> tuple[list[str], list[str]]:
    """The EXPIRE script's keys and arguments (see scripts.EXPIRE)."""
    ks = board.keyspace
    args = [
        ks.entry_prefix,
        ks.tag_prefix,
        ttl,
        group,
        "1" if trim else "0",
        "1" if extend else "0",
        str(EXPIRE_CHUNK),
        *names,
    ]
    return [ks.expiry_key, ks.events_key, *([whole] if whole else [])], args
