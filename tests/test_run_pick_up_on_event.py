"""A free pool member that hears of a request its submitter indexed takes it by a pick-up: the
oldest pending request is claimed and read in one script call, so one that waited goes before the
one just announced, and the next free member of the process takes the announced one. Real
redis-server, in-process ReplicaHosts, a real ControlPlane (tests/test_run_pools.py's Cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_run_pools import Cluster, _claimed, claimant, finished, pool_hosted, wait_for
from test_run_pools_faults import EXECUTED, CountedNap, counted_blueprint, make_cluster

from colony.agents import run_pool
from colony.agents.models import RunServing
from colony.blackboard import AgentRunProtocol, Blackboard
from colony.errors import BlackboardUnavailable
from colony.system import pools


@pytest.fixture
async def cluster(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    made = make_cluster(bb, redis_url, tmp_path)
    await made.start()
    yield made
    await made.close()


async def claimed_at(cluster: Cluster, run_id: str) -> float:
    record = await cluster.runs.record(run_id)
    claim = await cluster.runs.run_board(record).read(AgentRunProtocol.claim_key(run_id))
    assert claim is not None
    return claim.created_at


async def test_a_free_member_hearing_a_request_takes_the_oldest_pending_one_first(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run left pending while both members were free ("old": their pick-ups after a run are
    held off here, as a pick-up that raced another's would find nothing) is served first when the
    next run ("new") is announced, and the other free member serves the new one at once (before:
    the member that heard "new" served it, and "old" waited for that member's next pick-up)."""
    EXECUTED.clear()
    serving = RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60)
    blueprint = counted_blueprint("oldest", serving, 0.5)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools, "oldest", 2)
    picking = True
    real_pick_up = run_pool.PoolMember._pick_up

    async def after_a_run(self: Any) -> None:
        if picking:
            await real_pick_up(self)

    monkeypatch.setattr(run_pool.PoolMember, "_pick_up", after_a_run)
    CountedNap.gate = asyncio.Event()
    try:
        held = [(await cluster.runs.submit("oldest", "held")).run_id for _ in range(2)]
        for run_id in held:
            await wait_for(lambda run_id=run_id: _claimed(cluster, run_id), 10)
        assert await claimant(cluster, held[0]) != await claimant(cluster, held[1])  # both busy
        picking = False
        old = (await cluster.runs.submit("oldest", "old")).run_id
    finally:
        CountedNap.gate.set()  # never left closed for another test (a set Event needs no loop)
    await finished(cluster, held)
    assert not await _claimed(cluster, old)  # pending, with both members free
    picking = True
    new = (await cluster.runs.submit("oldest", "new")).run_id
    views = await finished(cluster, [old, new])
    assert {v.status for v in views.values()} == {"succeeded"}
    assert await claimed_at(cluster, old) <= await claimed_at(cluster, new)
    assert await claimant(cluster, old) != await claimant(cluster, new)  # side by side
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
