"""Batches of writes that go to Redis in one round trip: `write_many` (one scope's writes, as
pipelined script calls of a chunk each) and `write_group` (a group's writes with the expiry of its
tag set: what a submitted run stores). `Blackboard` delegates here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.blackboard import retention
from colony.blackboard.models import BlackboardEntry, WriteRequest, encode_tags, encode_value, ttl_to_ms
from colony.blackboard.protocol import validate_tag
from colony.blackboard.script_calls import ScriptCall, run_scripts, scripts_of
from colony.errors import BatchConflictError, InvalidArgument

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard

Writes = Iterable[WriteRequest | Mapping[str, Any]]
Chunk = list[tuple[WriteRequest, str, str]]  # (request, encoded value, encoded tags)


def batch_calls(board: Blackboard, writes: Writes, chunk_size: int) -> tuple[list[Chunk], list[ScriptCall]]:
    """The WRITE_BATCH script calls of `writes` on `board`, `chunk_size` writes per call."""
    requests = [w if isinstance(w, WriteRequest) else WriteRequest.model_validate(w) for w in writes]
    encoded = [(r, encode_value(r.value), encode_tags(r.tags)) for r in requests]
    ks = board.keyspace
    head = [ks.entry_prefix, ks.tag_prefix, board._maxlen, board._include_values]
    chunks = [encoded[i : i + chunk_size] for i in range(0, len(encoded), chunk_size)]
    calls: list[ScriptCall] = []
    for chunk in chunks:
        batch = [
            (
                r.key,
                value,
                tags,
                r.created_by or "",
                ttl_to_ms(r.ttl_seconds),
                "" if r.expected_version is None else str(r.expected_version),
            )
            for r, value, tags in chunk
        ]
        args = [*head, json.dumps(batch, separators=(",", ":"))]
        calls.append((board._write_batch, [ks.events_key, ks.expiry_key], args))
    return chunks, calls


def applied_entries(chunks: Sequence[Chunk], replies: Sequence[Any]) -> list[BlackboardEntry]:
    """The entries the calls of `chunks` wrote; `BatchConflictError` if any write's expected
    version did not match (listing the conflicts and what was applied)."""
    applied: list[BlackboardEntry] = []
    conflicts: list[tuple[str, int | None, int]] = []
    for chunk, reply in zip(chunks, replies, strict=True):
        now = reply[0]
        for n, (r, value, tags) in enumerate(chunk):
            ok, version, created_at, created_by, expires_at = reply[1 + 5 * n : 6 + 5 * n]
            if not ok:
                conflicts.append((r.key, r.expected_version, int(version)))
                continue
            fields = {
                "v": value,
                "ver": version,
                "tags": tags,
                "cb": created_by,
                "ub": r.created_by or "",
                "ca": created_at,
                "ua": now,
                "exp": expires_at,
            }
            applied.append(BlackboardEntry.from_hash(r.key, fields))
    if conflicts:
        metrics.BLACKBOARD_CONFLICTS.inc(len(conflicts))
        raise BatchConflictError(conflicts, applied)
    return applied


async def write_many(board: Blackboard, writes: Writes, chunk_size: int) -> list[BlackboardEntry]:
    chunks, calls = batch_calls(board, writes, chunk_size)
    if not calls:
        return []
    async with board.guard("write_many"):
        replies = await run_scripts(board.redis, calls)
    return applied_entries(chunks, replies)


async def write_group(
    board: Blackboard,
    writes: Writes,
    *,
    tag: str,
    ttl_seconds: float,
    first: tuple[Blackboard, Writes] | None = None,
    outlive: str | None = None,
) -> list[BlackboardEntry]:
    """In one round trip, in this order: `first`'s writes on its board (another scope on the same
    Redis), `writes` on `board`, then the expiry of the tag set `tag` (its index set alone: its
    members carry their own), and with `outlive`, a tag of `first`'s board whose set is kept at
    least `ttl_seconds` longer (an index of entries written over time: it outlives the newest).
    What was written on `board`; a conflict raises `BatchConflictError` once everything else is
    applied (one among the first writes too)."""
    group = validate_tag(tag)
    before: list[Chunk] = []
    calls: list[ScriptCall] = []
    if first is not None:
        other, other_writes = first
        if other.redis is not board.redis:
            raise InvalidArgument("write_group's first writes go to a scope on the same Redis client only")
        before, calls = batch_calls(other, other_writes, 256)
    chunks, own = batch_calls(board, writes, 256)
    calls += own
    calls.append((board._expire_key, [board.keyspace.tag_key(group)], [ttl_to_ms(ttl_seconds)]))
    if outlive is not None and first is not None:
        index = first[0].keyspace.tag_key(validate_tag(outlive))
        calls.append((scripts_of(board.redis).extend_key, [index], [ttl_to_ms(ttl_seconds)]))
    async with board.guard("write_group"):
        replies = await run_scripts(board.redis, calls)
    applied_entries(before, replies[: len(before)])
    written = applied_entries(chunks, replies[len(before) : len(before) + len(chunks)])
    expired = replies[len(before) + len(chunks)]
    if written and not int(expired):  # the set did not exist yet: the writes were run again
        await retention.expire_tag(board, group, ttl_seconds)  # after it (their script reloaded), so again
    return written
