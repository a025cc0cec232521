"""What a request's stored run events say, read back when a restored agent adopts the request:
the last sequence number, the attempt, whether it started or ended, and the events of the current
attempt (what a restart may supersede). Read through the request's tag index, bounded, and
validated: Redis content is untrusted."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from colony.blackboard import Blackboard, TagFilter
from colony.blackboard.protocol import RequestResultProtocol
from colony.wire.run_events import RESTARTED, STARTED, TERMINAL_EVENTS

log = logging.getLogger(__name__)

MAX_ATTEMPT = 1_000_000  # an `attempt` read back from Redis above this is not one this code wrote


@dataclass(frozen=True)
class StoredEvents:
    """What a request's stored events say, read (bounded, validated) when the request is adopted.

    `current` lists `(seq, during_step)` of the events of the current attempt: those after the
    newest `restarted` event (all of them when there is none)."""

    last_seq: int = 0
    attempt: int = 1
    started: bool = False
    ended: bool = False  # a terminal event is stored
    current: tuple[tuple[int, int | None], ...] = ()


async def read_stored_events(
    board: Blackboard, protocol: type[RequestResultProtocol], request_id: str, *, limit: int
) -> StoredEvents:
    """Read the request's stored events (through its tag index, never a SCAN). Untrusted: a key
    whose name is not `{seq}.{type}` is skipped, a bad `attempt`/`during_step` reads as absent,
    and at most `limit` entries are read (the caller's bound: more were never written)."""
    tags = TagFilter(all_of=frozenset({protocol.request_tag(request_id)}))
    pattern = protocol.event_pattern(request_id)
    found: list[tuple[int, str, int, int | None]] = []  # (seq, type, attempt, during_step)
    async for entry in board.iter_query(pattern, tags=tags):
        if len(found) >= limit:
            log.warning("request %s has more than %d events stored; read the first", request_id, limit)
            break
        identified = protocol.identify(entry.key)
        if identified is None or identified[0] != "event":
            continue
        seq_text, _, kind = identified[1]["event_name"].partition(".")
        if not (seq_text.isdigit() and len(seq_text) <= 9):
            continue
        value = entry.value if isinstance(entry.value, dict) else {}
        attempt = value.get("attempt")
        during = value.get("during_step")
        found.append(
            (
                int(seq_text),
                kind,
                attempt if _is_int(attempt) and 1 <= attempt <= MAX_ATTEMPT else 1,
                during if _is_int(during) and 0 <= during <= 10**9 else None,
            )
        )
    if not found:
        return StoredEvents()
    found.sort()
    restarts = [seq for seq, kind, _, _ in found if kind == RESTARTED]
    since = restarts[-1] if restarts else 0
    return StoredEvents(
        last_seq=found[-1][0],
        attempt=max(attempt for _, _, attempt, _ in found),
        started=any(kind == STARTED for _, kind, _, _ in found),
        ended=any(kind in TERMINAL_EVENTS for _, kind, _, _ in found),
        current=tuple((seq, during) for seq, _, _, during in found if seq > since),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
