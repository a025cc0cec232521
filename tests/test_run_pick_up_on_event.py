"""A free pool member that hears of a request its submitter indexed takes it by a pick-up: the
oldest pending request is claimed and read in one script call, so one that waited goes before the
one just announced, and the next free member of the process takes the announced one. Real
redis-server, in-process ReplicaHosts, a real ControlPlane (tests/test_run_pools.py's Cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_run_pools import Cluster, _claimed, claimant, finished, pool_hosted, wait_for
from test_run_pools_faults import EXECUTED, CountedNap, counted_blueprint
from test_run_pools_faults import cluster as cluster  # the fixture: a Cluster of their settings

from colony.agents import AgentRunCapability, run_pool
from colony.agents.models import RunServing
from colony.agents.run_claims import PickedUp
from colony.blackboard import AgentRunProtocol
from colony.errors import BlackboardUnavailable
from colony.system import pools


async def claimed_at(cluster: Cluster, run_id: str) -> float:
    record = await cluster.runs.record(run_id)
    claim = await cluster.runs.run_board(record).read(AgentRunProtocol.claim_key(run_id))
    assert claim is not None
    return claim.created_at


async def old_pending_with_two_free_members(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, role: str, seconds: float
) -> tuple[str, list[bool]]:
    """A pool of two members in this process, both free, and a run ("old") pending: submitted
    while both were busy, and left by their pick-ups after their runs (held off, as a pick-up that
    raced another's would find nothing). The run's id, and the switch of those pick-ups (on
    again once the caller sets its item True)."""
    EXECUTED.clear()
    serving = RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60)
    blueprint = counted_blueprint(role, serving, seconds)
    pools_ = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools_, role, 2)
    picking = [True]
    real_pick_up = run_pool.PoolMember.pick_up

    async def after_a_run(self: Any) -> None:
        if picking[0]:
            await real_pick_up(self)

    monkeypatch.setattr(run_pool.PoolMember, "pick_up", after_a_run)
    CountedNap.gate = asyncio.Event()
    try:
        held = [(await cluster.runs.submit(role, "held")).run_id for _ in range(2)]
        for run_id in held:
            await wait_for(lambda run_id=run_id: _claimed(cluster, run_id), 10)
        assert await claimant(cluster, held[0]) != await claimant(cluster, held[1])  # both busy
        picking[0] = False
        old = (await cluster.runs.submit(role, "old")).run_id
        # both members handle the request's event while busy (they leave it pending) before their
        # runs end: on a slow box a member could hear of it only once free, and take it
        await wait_for(lambda: _both_heard(cluster, role, old), 10)
    finally:
        CountedNap.gate.set()  # never left closed for another test (a set Event needs no loop)
    await finished(cluster, held)
    assert not await _claimed(cluster, old)  # pending, with both members free
    return old, picking


async def _both_heard(cluster: Cluster, role: str, run_id: str) -> bool:
    """Whether every member of `role` has handled the event of `run_id`'s request (their feeds
    see only request events, so their positions are compared with that event's id)."""
    members = run_capabilities(cluster, role)
    board = members[0].blackboard
    wanted = AgentRunProtocol.request_key(run_id)
    newest = await board.redis.xrevrange(board.keyspace.events_key, count=200)
    ids = [entry_id for entry_id, fields in newest if fields.get("key") == wanted]
    if not ids:
        return False
    return all(
        _stream_id(m.agent.event_delivery.positions.get(m.name, "0-0")) >= _stream_id(ids[0])
        for m in members
        if m.agent is not None
    )


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def run_capabilities(cluster: Cluster, role: str) -> list[AgentRunCapability]:
    found: list[AgentRunCapability] = []
    for host in cluster.hosts.values():
        for agent_id in host.runtime.agent_ids if host.runtime else []:
            if agent_id == role or agent_id.startswith(f"{role}."):
                capabilities = host.runtime.get(agent_id).capabilities.values()
                found += [c for c in capabilities if isinstance(c, AgentRunCapability)]
    return found


async def test_a_free_member_hearing_a_request_takes_the_oldest_pending_one_first(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run left pending while both members were free ("old") is served first when the next run
    ("new") is announced, and the other free member serves the new one at once (before: the
    member that heard "new" served it, and "old" waited for that member's next pick-up)."""
    old, picking = await old_pending_with_two_free_members(cluster, monkeypatch, "oldest", 0.5)
    picking[0] = True
    new = (await cluster.runs.submit("oldest", "new")).run_id
    views = await finished(cluster, [old, new])
    assert {v.status for v in views.values()} == {"succeeded"}
    assert await claimed_at(cluster, old) <= await claimed_at(cluster, new)
    assert await claimant(cluster, old) != await claimant(cluster, new)  # side by side
    assert dict(EXECUTED) == {"held": 2, "old": 1, "new": 1}


async def test_a_lost_pick_up_that_took_an_older_request_leaves_the_announced_one_to_another_member(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a pick-up on "new"'s event claimed "old" but its answer was lost; the
    member also claimed "new" directly, and held both while the other member stayed free. Now it
    looks up the claims it holds first (it finds "old", and serves it) and lets the next member
    take "new"."""
    old, picking = await old_pending_with_two_free_members(cluster, monkeypatch, "lostold", 0.5)
    real = run_pool.claim_oldest_pending
    lost: list[str] = []

    async def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        picked = await real(*args, **kwargs)
        if isinstance(picked, PickedUp) and not lost:
            lost.append(picked.request_id)
            raise BlackboardUnavailable("claim_oldest", "redis://blip", TimeoutError("answer lost"))
        return picked

    monkeypatch.setattr(run_pool, "claim_oldest_pending", applied_then_lost)
    picking[0] = True
    new = (await cluster.runs.submit("lostold", "new")).run_id
    views = await finished(cluster, [old, new])
    assert {v.status for v in views.values()} == {"succeeded"} and lost == [old]
    assert await claimant(cluster, old) != await claimant(cluster, new)  # side by side
    assert dict(EXECUTED) == {"held": 2, "old": 1, "new": 1}


async def test_a_member_that_became_busy_while_it_waited_leaves_the_request_to_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a member that waited on another's attempt took the request on once that
    attempt let it go (it took an older request), even if it had become busy meanwhile (say a
    look-up of its held claims queued one). Now it lets it go in turn: the request stays pending
    for a free member's pick-up (here the first member's, once its run ends)."""
    old, picking = await old_pending_with_two_free_members(cluster, monkeypatch, "waiter", 0.5)
    members = run_capabilities(cluster, "waiter")
    assert len(members) == 2
    real = run_pool.claim_oldest_pending
    real_take = run_pool.CLAIMS_HERE.take
    made_busy: list[AgentRunCapability] = []
    waiting: list[asyncio.Future[bool]] = []

    def take(event: str) -> asyncio.Future[bool] | None:
        attempt = real_take(event)
        if attempt is not None:
            waiting.append(attempt)
        return attempt

    async def slow(*args: Any, **kwargs: Any) -> Any:
        if not made_busy:  # the first attempt: the other member waits on it meanwhile
            (other,) = [m for m in members if not m._claiming]
            made_busy.append(other)
            async with asyncio.timeout(5):
                while not waiting:  # noqa: ASYNC110 - until the other member waits on this attempt
                    await asyncio.sleep(0.01)
            other._claiming = True  # busy now, as far as the waiting member can tell
        return await real(*args, **kwargs)

    monkeypatch.setattr(run_pool.CLAIMS_HERE, "take", take)
    monkeypatch.setattr(run_pool, "claim_oldest_pending", slow)
    picking[0] = True
    try:
        new = (await cluster.runs.submit("waiter", "new")).run_id
        await wait_for(lambda: _claimed(cluster, old), 10)
        await asyncio.sleep(0.2)  # the waiting member has had its turn
        # not taken by the member that became busy: unclaimed still, or (a slow box: the first
        # member's run already ended) picked up by the first member after its run
        if await _claimed(cluster, new):
            assert await claimant(cluster, new) == await claimant(cluster, old)
    finally:
        for member in made_busy:
            member._claiming = False
    views = await finished(cluster, [old, new])
    assert {v.status for v in views.values()} == {"succeeded"}
    assert await claimant(cluster, old) == await claimant(cluster, new)  # after "old", by its member
    assert dict(EXECUTED) == {"held": 2, "old": 1, "new": 1}


@pytest.mark.parametrize("applied", [False, True])
async def test_a_pick_up_on_a_request_event_cut_off_by_an_outage_claims_the_request_alone(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Redis away during the pick-up a request's event started (its claim applied or not, the
    answer lost): the member claims the announced request alone, waiting the outage out, as a
    request no submitter indexed is claimed; a pick-up is not sent again (a second one could claim
    a second request). Each run is served once, with the pool's nudges off (nothing else would
    serve a request left pending while its member is free)."""
    EXECUTED.clear()
    monkeypatch.setattr(pools, "NUDGE_SECONDS", 3600.0)
    serving = RunServing(mode="pool", min_size=1, max_size=1, idle_seconds=60)
    blueprint = counted_blueprint("blip", serving, 0.1)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    real = run_pool.claim_oldest_pending
    cut: list[bool] = []

    async def cut_off(*args: Any, **kwargs: Any) -> Any:
        if not cut:
            cut.append(True)
            if applied:
                await real(*args, **kwargs)
            raise BlackboardUnavailable("claim_oldest", "redis://blip", TimeoutError("answer lost"))
        return await real(*args, **kwargs)

    monkeypatch.setattr(run_pool, "claim_oldest_pending", cut_off)
    runs = [(await cluster.runs.submit("blip", "a")).run_id]  # the only one: nothing picks it up later
    views = await finished(cluster, runs, timeout=15)
    assert cut and {v.status for v in views.values()} == {"succeeded"}
    runs.append((await cluster.runs.submit("blip", "b")).run_id)  # and the member serves on
    views = await finished(cluster, runs, timeout=15)
    assert {v.status for v in views.values()} == {"succeeded"}
    assert dict(EXECUTED) == {"a": 1, "b": 1}


async def test_a_lost_pick_up_whose_claims_cannot_be_looked_up_leaves_the_request_to_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Second review: when the look-up of the claims a member holds fails after its pick-up was
    cut off, it does not know what it holds: it claims nothing more (a direct claim could make it
    hold two runs) and the next free member takes the request."""
    EXECUTED.clear()
    serving = RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60)
    blueprint = counted_blueprint("unknown", serving, 0.1)
    pools_ = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools_, "unknown", 2)
    real = run_pool.claim_oldest_pending
    real_look_up = run_pool.PoolMember.serve_held_claims
    cut: list[str] = []

    async def cut_off(*args: Any, **kwargs: Any) -> Any:
        if not cut:
            cut.append(args[3])  # the member (its agent id)
            raise BlackboardUnavailable("claim_oldest", "redis://blip", TimeoutError("answer lost"))
        return await real(*args, **kwargs)

    async def look_up_fails(self: run_pool.PoolMember) -> list[str] | None:
        if cut and self.cap._agent().agent_id == cut[0]:
            return None
        return await real_look_up(self)

    monkeypatch.setattr(run_pool, "claim_oldest_pending", cut_off)
    monkeypatch.setattr(run_pool.PoolMember, "serve_held_claims", look_up_fails)
    run_id = (await cluster.runs.submit("unknown", "x")).run_id
    views = await finished(cluster, [run_id])
    assert views[run_id].status == "succeeded" and cut
    assert await claimant(cluster, run_id) != cut[0]
    assert dict(EXECUTED) == {"x": 1}
