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

import functools
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

from colony.agents.models import RunServing
from colony.blackboard import Blackboard, BlackboardEntry
from colony.blackboard.blackboard import TAGGED_PAGE
from colony.blackboard.models import encode_value
from colony.blackboard.protocol import RequestResultProtocol, validate_segment
from colony.blackboard.query import OLDEST_SAMPLE
from colony.blackboard.script_calls import scripts_of

if TYPE_CHECKING:
    from colony.agents.base import Agent

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


def claim_value(agent: Agent) -> dict[str, str]:
    """What a claim holds: the agent and its copy (`Agent.holder`), so a retried claim never
    mistakes another copy's for its own."""
    return {"agent_id": agent.agent_id, "holder": agent.holder}


class PickedUp(NamedTuple):
    """A request `claim_oldest_pending` claimed, with what serving it reads first (read in the same
    call, just after the claim)."""

    request_id: str
    result: BlackboardEntry | None
    request: BlackboardEntry | None
    declaration: BlackboardEntry | None  # the scope's serving declaration
    events: list[str] | None  # the request's stored event keys (None: more than one page)


RECEIPT_SECONDS = 60.0  # how long a pick-up's receipt stays at most (unless the op timeout is longer)
SAMPLE_PENDING: Final = "sample"  # `claim_oldest_pending`: the index is too large to claim from in one call
_ID = "0id0"  # a request id that stands for any, to split a key built by the protocol around it


@functools.cache
def _script_arguments(
    protocol: type[RequestResultProtocol],
) -> tuple[tuple[Any, ...], tuple[Any, ...], str]:
    """CLAIM_OLDEST's arguments that depend on the protocol alone: those before the claim's value,
    those between it and the receipt's life, and the last (see scripts.CLAIM_OLDEST); built once
    per protocol, not on every pick-up."""
    reads = [protocol.result_key, protocol.request_key]
    before = (
        max(2 * PICK_UP_PAGE, OLDEST_SAMPLE),
        pending_tag(protocol),
        pending_key(protocol, _ID).removesuffix(_ID),
        *_around(protocol.request_key),
        *_around(protocol.claim_key),
        *_around(protocol.request_tag),
        *_around(protocol.event_pattern),
    )
    after = (
        protocol.open_claims_tag(),
        TAGGED_PAGE,
        len(reads),
        *(part for build in reads for part in _around(build)),
    )
    return before, after, serving_key(protocol)


def _around(build: Callable[[str], str]) -> tuple[str, str]:
    prefix, found, suffix = build(_ID).partition(_ID)
    assert found, build
    return prefix, suffix


async def claim_oldest_pending(
    board: Blackboard,
    protocol: type[RequestResultProtocol],
    claim: Any,
    writer: str,
    *,
    receipt_seconds: float = RECEIPT_SECONDS,
) -> PickedUp | Literal["sample"] | None:
    """Claim the oldest pending request whose request entry exists (`claim` its claim's value,
    `writer` the claimer) and read what serving it needs: its result, request, the scope's serving
    declaration and its stored event keys, in one script call (one round trip where the index scan,
    the candidates' read, the claim's commit and the request's read took four). The claim and the
    marker's deletion are what `AgentRunCapability._claim` commits; a marker whose request is
    claimed already is dropped on the way.

    None when nothing is claimable. `SAMPLE_PENDING` when the index holds more than
    `OLDEST_SAMPLE` markers, or a marker whose id is not plain ASCII (letters, digits, `_.-`: every
    id Colony makes), which the script does not judge: nothing is done, and the caller samples the
    index, validating every id (`pending_requests`). The call carries a receipt of its own: sent
    again by the Redis client after a lost reply, it answers the request it claimed rather than
    claiming another. The receipt lives `receipt_seconds` (a member passes its scope's retention,
    so nothing of the scope outlives that for long) up to RECEIPT_SECONDS, but never less than
    the blackboard's `op_timeout_seconds` (the longest the client may send the call again: its
    guard ends the call then). A call that raises may have claimed a request all the same: the
    caller finds it by its claim's value."""
    ks = board.keyspace
    before_claim, after_claim, declaration = _script_arguments(protocol)
    args: list[Any] = [
        ks.entry_prefix,
        ks.tag_prefix,
        board._maxlen,
        board._include_values,
        writer,
        *before_claim,
        encode_value(claim),
        *after_claim,
        int(max(min(receipt_seconds, RECEIPT_SECONDS), board.settings.op_timeout_seconds) * 1000),
        declaration,
    ]
    receipt = ks.receipt_key(uuid.uuid4().hex)  # this call's: the client may send it twice
    keys = [ks.events_key, ks.expiry_key, ks.tag_key(pending_tag(protocol)), receipt]
    async with board.guard("claim_oldest"):
        reply = await scripts_of(board.redis).claim_oldest(keys=keys, args=args)
    if int(reply[0]) == 0:
        return None
    if int(reply[0]) < 0:
        return SAMPLE_PENDING
    request_id = validate_segment(reply[1], "request_id")
    result, request, declaration = (
        BlackboardEntry.from_hash(key, dict(zip(flat[0::2], flat[1::2], strict=True))) if flat else None
        for key, flat in zip(
            (protocol.result_key(request_id), protocol.request_key(request_id), serving_key(protocol)),
            reply[2],
            strict=True,
        )
    )
    cursor, tagged = reply[3]
    return PickedUp(
        request_id, result, request, declaration, sorted(set(tagged)) if int(cursor) == 0 else None
    )


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
