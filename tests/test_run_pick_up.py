"""`claim_oldest_pending`: an idle pool member claims the oldest written pending request and reads
what serving it needs, in one script call (real redis-server)."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit

import pytest

from colony.agents.run_claims import (
    SAMPLE_PENDING,
    PickedUp,
    claim_oldest_pending,
    pending_key,
    pending_requests,
    pending_tag,
    pending_write,
    serving_key,
)
from colony.blackboard import AgentRunProtocol, Blackboard, create_redis
from colony.blackboard.query import OLDEST_SAMPLE
from colony.blackboard.script_calls import scripts_of

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
    # creation times are in milliseconds and ties go by key: the names keep "a-taken" first even
    # when both markers are written within one millisecond
    await queue(bb, "a-taken")
    await bb.write(P.claim_key("a-taken"), {"agent_id": "pool.2", "holder": "copy-b"})
    await queue(bb, "b-free")
    picked = await claim_oldest_pending(bb, P, CLAIM, "pool.1")
    assert isinstance(picked, PickedUp) and picked.request_id == "b-free"
    assert await bb.read(pending_key(P, "a-taken")) is None
    assert (await bb.read(P.claim_key("a-taken"))).value == {"agent_id": "pool.2", "holder": "copy-b"}


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


class ReplyCutter:
    """A TCP proxy to Redis that, when armed, resets the client's connection in place of passing on
    the reply to the first command that carries `marker`: Redis applied it, the reply is lost."""

    def __init__(self, host: str, port: int, marker: bytes) -> None:
        self.host, self.port, self.marker = host, port, marker
        self.armed, self.cuts = False, 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        redis_in, redis_out = await asyncio.open_connection(self.host, self.port)
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_in.read(65536):
                if self.armed and self.marker in data:
                    self.armed = False
                    cut.set()
                redis_out.write(data)
                await redis_out.drain()

        async def downstream() -> None:
            while data := await redis_in.read(65536):
                if cut.is_set():
                    self.cuts += 1
                    client_out.transport.abort()
                    redis_out.close()
                    return
                client_out.write(data)
                await client_out.drain()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


@pytest.mark.parametrize("queued", [["only"], ["r1", "r2"]])
async def test_a_pick_up_sent_again_after_a_lost_reply_claims_nothing_more(
    redis_url: str, queued: list[str]
) -> None:
    """The Redis client sends a call again when its connection drops before the reply: a pick-up
    Redis applied answers, the second time, the request it claimed (its receipt), rather than
    claiming the next one (or nothing) and leaving the first claimed by a member that never
    learns of it."""
    url = urlsplit(redis_url)
    setup = create_redis(redis_url)
    script = scripts_of(setup).claim_oldest
    await setup.script_load(script.script)  # loaded: the cut command is the call itself
    cutter = ReplyCutter(url.hostname or "127.0.0.1", url.port or 6379, script.sha.encode())
    port = await cutter.start()
    auth = f":{url.password}@" if url.password else ""
    client = create_redis(f"redis://{auth}127.0.0.1:{port}/0")
    bb = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}")
    try:
        for request_id in queued:
            await queue(bb, request_id)
            await asyncio.sleep(0.005)
        cutter.armed = True
        picked = await claim_oldest_pending(bb, P, CLAIM, "pool.1")
        assert cutter.cuts == 1
        assert isinstance(picked, PickedUp) and picked.request_id == queued[0]
        assert picked.request is not None and picked.request.value == {"input": queued[0]}
        held = {m for m in await bb.redis.smembers(bb.keyspace.tag_key(P.open_claims_tag()))}
        assert held == {P.claim_key(queued[0])}
    finally:
        await client.aclose()
        await setup.aclose()
        cutter.server.close()


@pytest.mark.parametrize("odd", ["a:b", "a\u00a0b", "a\\b", "caf\u00e9"])
async def test_a_marker_whose_id_is_not_plain_ascii_is_left_to_the_validating_path(
    bb: Blackboard, odd: str
) -> None:
    """Ids come from Redis (a writer could have put anything there). The script claims only ids of
    ASCII letters, digits and `_.-` (every id Colony makes); with any other it does nothing and
    the member samples the index in Python, which validates each id (`pending_requests`): one
    that could not name a request is never claimed, a valid one still is."""
    await bb.redis.hset(
        bb.keyspace.entry_key(f"pending:run:{odd}"),
        mapping={"v": "{}", "ver": 1, "ca": 1, "tags": pending_tag(P)},
    )
    await bb.redis.sadd(bb.keyspace.tag_key(pending_tag(P)), f"pending:run:{odd}")
    await bb.redis.hset(bb.keyspace.entry_key(f"request:run:{odd}"), mapping={"v": "{}", "ver": 1, "ca": 1})
    await queue(bb, "fine")
    assert await claim_oldest_pending(bb, P, CLAIM, "pool.1") == SAMPLE_PENDING
    assert await bb.redis.exists(bb.keyspace.entry_key(f"claim:run:{odd}")) == 0
    assert await bb.redis.exists(bb.keyspace.entry_key(P.claim_key("fine"))) == 0  # nothing done
    expected = ["fine", odd] if odd == "caf\u00e9" else ["fine"]  # a valid segment, only not ASCII
    assert sorted(await pending_requests(bb, P, written_only=True)) == sorted(expected)


@pytest.mark.parametrize(("asked", "most_ms"), [(None, 60_000), (7.0, 7_000), (0.2, 5_000), (600.0, 60_000)])
async def test_a_pick_ups_receipt_lives_as_asked_within_the_resend_window_and_a_minute(
    bb: Blackboard, asked: float | None, most_ms: int
) -> None:
    """The receipt outlives any resend of its call (the client's, within one call: at most the
    blackboard's op timeout, 5 s here) and not much else: a member passes its scope's retention,
    so a stopped agent's scope keeps nothing long past it (tests/test_retention.py)."""
    assert bb.settings.op_timeout_seconds == 5.0
    await queue(bb, "r1")
    kwargs = {} if asked is None else {"receipt_seconds": asked}
    assert isinstance(await claim_oldest_pending(bb, P, CLAIM, "pool.1", **kwargs), PickedUp)
    receipts = [key async for key in bb.redis.scan_iter(match=bb.keyspace.receipt_prefix + "*")]
    assert len(receipts) == 1
    assert most_ms - 1_000 < await bb.redis.pttl(receipts[0]) <= most_ms
