"""The keys that let several agents share one run scope (an agent pool, colony.system.pools) and
let the API bound how many runs a role admits.

- `pending:{kind}:{request_id}`: the index of open unclaimed requests. The submitter writes it
  beside the request (same expiry, the request's tag too, so it goes with the request); the member
  that claims the request deletes it. An idle member looks here for work, so a request nobody
  could claim when it arrived (every member busy) is picked up without a keyspace SCAN: the tag
  set `pending:{kind}` lists exactly these entries.
- `serving:{kind}`: the role's serving declaration (`RunServing`), written by its agent when it
  starts if it differs from the default, so the API knows whether to write a pending marker and
  how many runs to admit without unpickling a blueprint.

Every key is built from a validated segment (a request id the API or a handle made), never from
raw input.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from colony.agents.models import RunServing
from colony.blackboard import Blackboard
from colony.blackboard.protocol import RequestResultProtocol, validate_segment

API_WRITER = "api"  # who the API's writes are by (colony.system.runs.API_WRITER): it indexes its requests
# the writer of a request the API indexed as pending itself, its marker written before it: a busy
# pool member that sees it knows the marker is there and writes none (one wasted create per busy
# member per run, before); any other writer's request is indexed by the busy members as before
API_INDEXED_WRITER = "api-indexed"
PICK_UP_PAGE = 32  # oldest pending requests an idle member considers (of a sample of 256 or more)


def pending_tag(protocol: type[RequestResultProtocol]) -> str:
    """The tag (index set) of the open unclaimed requests of a run scope."""
    return f"pending:{protocol.kind}"


def pending_key(protocol: type[RequestResultProtocol], request_id: str) -> str:
    return f"pending:{protocol.kind}:{validate_segment(request_id, 'request_id')}"


def serving_key(protocol: type[RequestResultProtocol]) -> str:
    return f"serving:{protocol.kind}"


def pending_write(
    protocol: type[RequestResultProtocol], request_id: str, ttl_seconds: float | None, created_by: str
) -> dict[str, Any]:
    """The pending marker as a `write_many` item (written after the request, in one round trip)."""
    return {
        "key": pending_key(protocol, request_id),
        "value": {"request_id": request_id, "at": time.time()},
        "tags": [pending_tag(protocol), protocol.request_tag(request_id)],
        "created_by": created_by,
        "ttl_seconds": ttl_seconds,
    }


async def drop_pending(board: Blackboard, protocol: type[RequestResultProtocol], request_id: str) -> None:
    """The request is claimed: out of the pending index (absent already: nothing to do)."""
    await board.delete(pending_key(protocol, request_id))


async def pending_requests(
    board: Blackboard,
    protocol: type[RequestResultProtocol],
    limit: int = PICK_UP_PAGE,
    *,
    written_only: bool = False,
) -> list[str]:
    """Up to `limit` open unclaimed request ids, oldest first (among those one index scan gives),
    read without their markers' values: an idle member picks from a backlog cheaply. With
    `written_only`, only requests that exist (checked in the same round trip: an admission
    reservation's request is not written yet, a failed submit's is gone)."""
    prefix = f"pending:{protocol.kind}:"

    def request_of(marker: str) -> str:
        return protocol.request_key(marker[len(prefix) :])

    keys = await board.oldest_tagged(pending_tag(protocol), limit, needs=request_of if written_only else None)
    return [key[len(prefix) :] for key in keys if key.startswith(prefix)]


class ScopeAtStart(NamedTuple):
    """What a starting run capability needs to know of its run scope (`scope_at_start`)."""

    open_claims: int  # members of the open-claims index
    pending: int  # members of the pending index
    declared: bool  # a serving declaration is stored


async def scope_at_start(board: Blackboard, protocol: type[RequestResultProtocol]) -> ScopeAtStart:
    """How many open claims and pending markers the run scope holds, and whether a serving
    declaration is stored (two SCARDs and an EXISTS, one round trip): a starting member reads
    either index only when it is not empty, and a role's agent serving with the default removes
    a declaration an earlier agent of the id left."""
    async with board.guard("count"), board.redis.pipeline(transaction=False) as pipe:
        pipe.scard(board.keyspace.tag_key(protocol.open_claims_tag()))
        pipe.scard(board.keyspace.tag_key(pending_tag(protocol)))
        pipe.exists(board.keyspace.entry_key(serving_key(protocol)))
        claims, pending, declared = await pipe.execute()
    return ScopeAtStart(int(claims), int(pending), bool(declared))


async def count_tag(board: Blackboard, tag: str) -> int:
    """Members of a tag index set (SCARD: O(1))."""
    async with board.guard("count"):
        return int(await board.redis.scard(board.keyspace.tag_key(tag)))


async def open_runs(board: Blackboard, protocol: type[RequestResultProtocol]) -> int:
    """Runs of a run scope admitted and not ended: the distinct requests claimed and unanswered, or
    pending (a request being claimed right now has both a claim and its marker for a moment: it
    counts once). Reads both index sets (their size is about the admission bound; only bounded
    agents are counted)."""
    async with board.guard("count"), board.redis.pipeline(transaction=False) as pipe:
        pipe.smembers(board.keyspace.tag_key(protocol.open_claims_tag()))
        pipe.smembers(board.keyspace.tag_key(pending_tag(protocol)))
        claimed, pending = await pipe.execute()
    ids: set[str] = set()
    for member in (*claimed, *pending):
        key = member.decode() if isinstance(member, bytes) else str(member)
        ids.add(key.split(":", 2)[-1])  # claim:{kind}:{id} and pending:{kind}:{id}
    return len(ids)


async def publish_serving(
    board: Blackboard, protocol: type[RequestResultProtocol], serving: RunServing, created_by: str
) -> None:
    """Record the role's serving declaration in its run scope; only a non-default one, so the start
    of an ordinary agent (most of them) costs no write."""
    if serving != RunServing():
        await board.write(serving_key(protocol), serving.model_dump(mode="json"), created_by=created_by)


async def retire_serving(
    board: Blackboard, protocol: type[RequestResultProtocol], ttl_seconds: float
) -> None:
    """The role's agent stopped serving (stopped, suspended, moved): its declaration expires after
    `ttl_seconds` unless a start writes it again first."""
    await board.expire([serving_key(protocol)], ttl_seconds)


async def read_serving(board: Blackboard, protocol: type[RequestResultProtocol]) -> RunServing:
    entry = await board.read(serving_key(protocol))
    if entry is None or not isinstance(entry.value, dict):
        return RunServing()
    try:
        return RunServing.model_validate(entry.value)
    except ValueError:  # written by another version: the default, rather than no runs at all
        return RunServing()
