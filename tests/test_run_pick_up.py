"""`claim_oldest_pending`: an idle pool member claims the oldest written pending request and reads
what serving it needs, in one script call (real redis-server)."""

from __future__ import annotations

from colony.agents.run_claims import (
    SAMPLE_PENDING,
    PickedUp,
    claim_oldest_pending,
    pending_key,
    pending_tag,
    pending_write,
    serving_key,
)
from colony.blackboard import AgentRunProtocol, Blackboard
from colony.blackboard.query import OLDEST_SAMPLE

P = AgentRunProtocol
CLAIM = {"agent_id": "pool.1", "holder": "copy-a"}


async def queue(bb: Blackboard, request_id: str, *, written: bool = True) -> None:
    """A pending marker, then (unless it is a reservation) its request, as the API writes them."""
    await bb.write(**pending_write(P, request_id, 60, "api"))
    if written:
        await bb.write(P.request_key(request_id), {"input": request_id}, tags={P.request_tag(request_id)})


async def test_nothing_pending_claims_nothing(bb: Blackboard) -> None:
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") is None
    await queue(bb, "reserved", written=False)  # a reservation: its request is not written yet
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") is None
    assert (await bb.read(pending_key(P, "reserved"))) is not None  # left as it was


async def test_the_oldest_written_request_is_claimed_with_what_serving_it_reads(bb: Blackboard) -> None:
    await bb.write(serving_key(P), {"mode": "pool"})
    await queue(bb, "r1-old")
    await queue(bb, "r2-reserved", written=False)
    await queue(bb, "r3-new")
    await bb.write(P.event_key("r1-old", "00001.started"), {"seq": 1}, tags={P.request_tag("r1-old")})
    events = await bb.subscribe("*").start()
    try:
        picked = await claim_oldest_pending(bb, P, CLAIM, "pool.1")
        assert isinstance(picked, PickedUp) and picked.request_id == "r1-old"
        assert picked.request is not None and picked.request.value == {"input": "r1-old"}
        assert picked.result is None
        assert picked.declaration is not None and picked.declaration.value == {"mode": "pool"}
        assert picked.events == [P.event_key("r1-old", "00001.started")]
        claim = await bb.read(P.claim_key("r1-old"))
        assert claim is not None and claim.value == CLAIM and claim.created_by == "pool.1"
        assert claim.tags == {P.request_tag("r1-old"), P.open_claims_tag()}
        assert await bb.read(pending_key(P, "r1-old")) is None
        # as a transaction's write and delete: both are events
        seen = [(e.op, e.key) for e in [await events.next(5), await events.next(5)]]
        assert seen == [("write", P.claim_key("r1-old")), ("delete", pending_key(P, "r1-old"))]
    finally:
        events.close()
    second = await claim_oldest_pending(bb, P, CLAIM, "pool.1")
    assert isinstance(second, PickedUp) and second.request_id == "r3-new" and second.events == []
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") is None  # the reservation stays
    assert await bb.read(pending_key(P, "r2-reserved")) is not None


async def test_a_marker_whose_request_is_claimed_already_is_dropped_on_the_way(bb: Blackboard) -> None:
    await queue(bb, "taken")
    await bb.write(P.claim_key("taken"), {"agent_id": "pool.2", "holder": "copy-b"})
    await queue(bb, "free")
    picked = await claim_oldest_pending(bb, P, CLAIM, "pool.1")
    assert isinstance(picked, PickedUp) and picked.request_id == "free"
    assert await bb.read(pending_key(P, "taken")) is None
    assert (await bb.read(P.claim_key("taken"))).value == {"agent_id": "pool.2", "holder": "copy-b"}


async def test_stale_members_leave_the_index(bb: Blackboard) -> None:
    """A member whose entry is gone (expired) or no longer carries the tag is pruned, not claimed."""
    await queue(bb, "gone")
    await bb.redis.delete(bb.keyspace.entry_key(pending_key(P, "gone")))  # as an expiry leaves it
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") is None
    assert await bb.redis.smembers(bb.keyspace.tag_key(pending_tag(P))) == set()


async def test_a_large_index_is_left_to_the_sampling_path(bb: Blackboard) -> None:
    await bb.write_many([pending_write(P, f"r{n}", 60, "api") for n in range(OLDEST_SAMPLE + 1)])
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") == SAMPLE_PENDING
    assert await bb.redis.scard(bb.keyspace.tag_key(pending_tag(P))) == OLDEST_SAMPLE + 1  # untouched


async def test_ties_in_creation_time_go_by_marker_key(bb: Blackboard) -> None:
    ids = ["b", "a", "c"]
    await bb.write_many([pending_write(P, i, 60, "api") for i in ids])  # one call: one server time
    await bb.write_many([{"key": P.request_key(i), "value": i, "tags": {P.request_tag(i)}} for i in ids])
    order = []
    while isinstance(picked := await claim_oldest_pending(bb, P, CLAIM, "pool.1"), PickedUp):
        order.append(picked.request_id)
    assert order == ["a", "b", "c"]
