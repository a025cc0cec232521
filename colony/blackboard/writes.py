"""One entry's write through the WRITE script: the call's arguments and the entry its reply
describes (`Blackboard.write`, and `retention.retire_group`, whose write goes in its round trip)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.blackboard.models import BlackboardEntry, ttl_to_ms
from colony.errors import ConcurrentModificationError

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard


def opt(value: int | float | None) -> str:
    """An optional number as a script argument ("" for None)."""
    return "" if value is None else str(value)


def write_args(
    board: Blackboard,
    key: str,
    value: str,
    tags: str,
    created_by: str | None,
    ttl_seconds: float | None,
    expected_version: int | None,
    with_value: bool = False,
) -> list[str]:
    """The write script's arguments; `with_value`: this write's event carries the value."""
    return [
        key,
        value,
        tags,
        created_by or "",
        ttl_to_ms(ttl_seconds),
        opt(expected_version),
        board.keyspace.tag_prefix,
        board._maxlen,
        "1" if with_value else board._include_values,
        board.keyspace.entry_prefix,
    ]


def written_entry(
    key: str, value: str, tags: str, writer: str | None, expected: int | None, reply: list[Any]
) -> BlackboardEntry:
    """The entry a WRITE script reply describes (raises on a failed version check)."""
    if not reply[0]:
        metrics.BLACKBOARD_CONFLICTS.inc()
        raise ConcurrentModificationError(key, expected, int(reply[1]))
    _, version, created_at, created_by, _event_id, expires_at, now = reply
    fields = {
        "v": value,
        "ver": version,
        "tags": tags,
        "cb": created_by,
        "ub": writer or "",
        "ca": created_at,
        "ua": now,
        "exp": expires_at,
    }
    return BlackboardEntry.from_hash(key, fields)
