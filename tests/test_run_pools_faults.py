"""Agent pools under faults (the review of M14): a live agent missing from the member list, two
pool managers, a failed list write, a stop that did not take effect, growth on a full cluster, a
re-open cut short, a run re-served by another member (its superseded tokens), a half-failed
submit, a dropped copy's close, concurrent admissions at the bound, a submit naming a member.
Real redis-server, in-process ReplicaHosts, a real ControlPlane (tests/test_run_pools.py's Cluster)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_kit import count_calls, counter_blueprint
from test_run_pools import (
    Cluster,
    _claimed,
    claimant,
    finished,
    kept_events,
    member_busy_in_two_member_pool,
    nap_blueprint,
    pool_hosted,
    served_by,
    wait_for,
)

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ScriptedActionPolicy,
    action_executor,
    run_capability,
    run_pool,
)
from colony.agents.models import RunServing
from colony.agents.run_claims import API_WRITER, PickedUp, pending_requests, pending_write, serving_key
from colony.api.app import ApiServices, create_app
from colony.blackboard import AgentRunProtocol, Blackboard
from colony.config import ColonySettings, ServeSettings, VcmSettings, load_settings
from colony.errors import AgentNotFound, BlackboardUnavailable, InvalidArgument, RunQueueFull
from colony.system import pools
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.pools import PoolManager, PoolState, member_blueprint
from colony.system.registry import DONE_STATES

EXECUTED: Counter[Any] = Counter()  # input -> how many times an agent ran it (all hosts: one process)
TOKENS = ["The ", "answer ", "is ", "42"]


class CountedNap(AgentCapability):
    """A slow run that counts its executions. The input "held" waits for `gate` instead (a test
    holds its member busy so, until every run it needs queued is submitted)."""

    gate: asyncio.Event | None = None

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def work(self, value: Any = None, seconds: float = 1.0) -> Any:
        """Count, sleep (or wait for the gate), return the value."""
        EXECUTED[value] += 1
        if value == "held" and CountedNap.gate is not None:
            await CountedNap.gate.wait()
        else:
            await asyncio.sleep(seconds)
        return value


async def queued_behind_a_held_run(cluster: Cluster, role: str, inputs: list[str]) -> tuple[str, list[str]]:
    """Submit a run that holds the role's one member ("held"), then, once it is claimed, `inputs`
    (queued: the member is busy); then let the held run end. The held run's id and the others'."""
    CountedNap.gate = asyncio.Event()
    try:
        held = (await cluster.runs.submit(role, "held")).run_id
        await wait_for(lambda: _claimed(cluster, held), 10)
        queued = [(await cluster.runs.submit(role, value)).run_id for value in inputs]
    finally:
        CountedNap.gate.set()  # never left closed for another test (a set Event needs no loop)
    return held, queued


class Talk(AgentCapability):
    """Streams tokens, then returns their concatenation."""

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def talk(self, value: Any = None) -> Any:
        """Stream four tokens."""
        assert self.agent is not None
        for token in TOKENS:
            await self.agent.emit_run_event("token", {"text": token})
            await asyncio.sleep(0.3)
        return "".join(TOKENS)


def counted_blueprint(agent_id: str, serving: RunServing, seconds: float = 1.0) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="counted"),
        capabilities=[CountedNap.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "work", "parameters": {"value": "$input", "seconds": seconds}}]
        ),
        serving=serving,
    )


def talk_blueprint(agent_id: str, serving: RunServing) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="talk"),
        capabilities=[Talk.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "talk", "parameters": {"value": "$input"}}]
        ),
        serving=serving,
    )


def make_cluster(bb: Blackboard, redis_url: str, tmp_path: Path, **serve: Any) -> Cluster:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),
        redis_url=redis_url,
        colony_id=f"poolf{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(
            monitor_period_seconds=0.1, heartbeat_seconds=0.2, **{"max_agents_per_replica": 16, **serve}
        ),
    )
    return Cluster(bb, settings)


@pytest.fixture
async def cluster(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    made = make_cluster(bb, redis_url, tmp_path)
    await made.start()
    yield made
    await made.close()


async def live_agents(cluster: Cluster, role: str) -> list[str]:
    return [
        r.agent_id
        for r in await cluster.control.registry.list()
        if (r.agent_id == role or r.agent_id.startswith(f"{role}.")) and r.state not in DONE_STATES
    ]


async def test_a_live_agent_missing_from_the_member_list_keeps_its_claims(cluster: Cluster) -> None:
    """Finding 1: a claim is re-opened only when its claimant has ended, never because the member
    list lacks it (the old rule re-opened a live orphan's claims: an idle member ran them again)."""
    EXECUTED.clear()
    serving = RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60)
    blueprint = counted_blueprint("orph", serving, seconds=0.3)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)

    await pool_hosted(cluster, pools, "orph", 2)
    slow = counted_blueprint("orph", serving, seconds=3.0)  # live, never listed, slow: the others idle
    await cluster.control.place(member_blueprint(slow, "orph.0rphan00"))
    run_ids: list[str] = []
    for n in range(6):
        run_ids.append((await cluster.runs.submit("orph", f"o{n}")).run_id)
        await asyncio.sleep(0.1)
    views = await finished(cluster, run_ids, timeout=40)
    assert [views[r].status for r in run_ids] == ["succeeded"] * 6
    assert {f"o{n}": EXECUTED[f"o{n}"] for n in range(6)} == {f"o{n}": 1 for n in range(6)}, EXECUTED
    assert "orph.0rphan00" in {await claimant(cluster, r) for r in run_ids}  # the orphan served one


async def test_a_failed_list_write_while_growing_never_makes_an_unlisted_member(cluster: Cluster) -> None:
    """Finding 1: the member list is written before the member is placed, so a failed write places
    nothing; live agents of the role never exceed max_size and no input runs twice."""
    EXECUTED.clear()
    blueprint = counted_blueprint(
        "flk", RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60), 1.0
    )
    pools = cluster.use_pools(blueprint)
    real_save = pools._save
    fails = {"left": 1}

    async def flaky_save(*args: Any) -> int:
        if fails["left"]:
            fails["left"] -= 1
            raise BlackboardUnavailable("write", "redis://blip")
        return await real_save(*args)

    pools._save = flaky_save  # type: ignore[method-assign]
    await cluster.control.place(blueprint)

    await pool_hosted(cluster, pools, "flk", 2)
    assert fails["left"] == 0
    run_ids = [(await cluster.runs.submit("flk", f"f{n}")).run_id for n in range(6)]
    views = await finished(cluster, run_ids, timeout=40)
    assert {v.status for v in views.values()} == {"succeeded"}
    assert sorted(await live_agents(cluster, "flk")) == sorted(await pools.members("flk"))
    assert len(await live_agents(cluster, "flk")) == 2
    assert {f"f{n}": EXECUTED[f"f{n}"] for n in range(6)} == {f"f{n}": 1 for n in range(6)}


async def test_two_pool_managers_never_grow_a_pool_past_max_size(cluster: Cluster) -> None:
    """Finding 1: the list is changed by versioned writes only; two managers (an old and a new
    control plane) ticking at once never lose each other's members."""
    serving = RunServing(mode="pool", min_size=1, max_size=3, scale_up_queue_depth=1.0, idle_seconds=60)
    blueprint = nap_blueprint("twin", serving, seconds=2.0)
    first = cluster.use_pools(blueprint)
    second = PoolManager(cluster.control, {"twin": blueprint})
    await cluster.control.place(blueprint)
    run_ids = [(await cluster.runs.submit("twin", n)).run_id for n in range(10)]
    for _ in range(15):
        await asyncio.gather(first.tick(), second.tick())
        assert len(await live_agents(cluster, "twin")) <= 3
    assert sorted(await live_agents(cluster, "twin")) == sorted(await first.members("twin"))
    views = await finished(cluster, run_ids, timeout=60)
    assert {v.status for v in views.values()} == {"succeeded"}


async def test_a_member_whose_stop_did_not_take_effect_stays_listed(cluster: Cluster) -> None:
    """Finding 1: a shrink unlists a member only once `ControlPlane.stop` says it stopped."""
    serving = RunServing(mode="pool", min_size=1, max_size=2, scale_up_queue_depth=1.0, idle_seconds=2.0)
    blueprint = nap_blueprint("stub", serving, seconds=0.3)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    run_ids = [(await cluster.runs.submit("stub", n)).run_id for n in range(6)]

    async def grown() -> bool:
        return len(await pools.members("stub")) == 2

    await wait_for(grown, 10)
    await finished(cluster, run_ids)
    calls: list[str] = []

    async def refused_stop(agent_id: str) -> bool:
        calls.append(agent_id)
        return False  # not on its replica any more (moving): not stopped

    cluster.control.stop = refused_stop  # type: ignore[method-assign]

    async def tried() -> bool:
        return len(calls) >= 2

    await wait_for(tried, 10)
    members = await pools.members("stub")
    assert len(members) == 2 and calls[0] in members
    assert cluster.hosting(calls[0])  # and it is still live, still listed


async def test_pool_growth_on_a_full_cluster_never_waits_for_room(
    bb: Blackboard, redis_url: str, tmp_path: Path
) -> None:
    """Finding 2: growing places with `wait=False`: on a full cluster a round neither waits
    `placement_retry_seconds` under the placement lock nor suspends another agent, and an explicit
    resume issued meanwhile is not held up behind it."""
    retry = 4.0
    made = make_cluster(bb, redis_url, tmp_path, max_agents_per_replica=2, placement_retry_seconds=retry)
    await made.start()
    try:
        blueprint = nap_blueprint("full", RunServing(mode="pool", min_size=1, max_size=4), seconds=3.0)
        pools = PoolManager(made.control, {"full": blueprint})  # ticked by hand below
        await made.control.place(blueprint)
        steps = [{"action": "add", "parameters": {"amount": "$input"}}]
        for name in ("u1", "u2", "x"):
            await made.control.place(counter_blueprint(name, steps))
        await made.control.suspend("x")
        await made.control.place(counter_blueprint("u3", steps))  # full: 4 agents on 2 x 2
        for n in range(6):
            await made.runs.submit("full", n)
        started = time.monotonic()
        tick = asyncio.create_task(pools.tick())
        await asyncio.sleep(0.05)
        resume_started = time.monotonic()
        await made.control.resume("x")
        resumed_in = time.monotonic() - resume_started
        await tick
        ticked_in = time.monotonic() - started
        assert ticked_in < retry / 2, ticked_in  # no wait for room (the old code waited `retry`)
        assert resumed_in < retry / 2, resumed_in
        assert await pools.members("full") == ["full"]  # no room: not grown (the next round tries)
        for name in ("u1", "u2", "u3"):
            record = await made.control.registry.get(name)
            assert record is not None and record.state != "suspended", (name, record)
    finally:
        await made.close()


async def test_a_reopen_cut_short_never_strands_the_request(cluster: Cluster) -> None:
    """Finding 3: the pending marker is written before the gone member's claim is deleted; a
    failure of the request's rewrite after that leaves it pending (picked up, or nudged), not lost."""
    pools, member, run_ids = await member_busy_in_two_member_pool(cluster, "cut", 2)
    real_requeue = pools._requeue
    failed: list[str] = []

    async def failing_requeue(board: Blackboard, request_id: str) -> None:
        if not failed:
            failed.append(request_id)
            raise BlackboardUnavailable("write", "redis://blip")
        await real_requeue(board, request_id)

    pools._requeue = failing_requeue  # type: ignore[method-assign]
    await cluster.control.stop(member)
    views = await finished(cluster, run_ids, timeout=30)
    assert failed, "the re-open was not cut short"
    assert [views[r].status for r in run_ids] == ["succeeded"] * 2
    assert [views[r].output for r in run_ids] == [0, 1]


async def test_a_run_reserved_by_another_member_supersedes_its_streamed_tokens(cluster: Cluster) -> None:
    """Finding 4: a run re-opened after its member stopped mid-run is run again from its start by
    another member, which announces it with one `restarted` event: the tokens a client keeps
    concatenate to the output, and one step and one terminal event are kept."""
    blueprint = talk_blueprint("talker", RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60))
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)

    await pool_hosted(cluster, pools, "talker", 2)
    (member,) = [m for m in await pools.members("talker") if m != "talker"]
    run_ids = [(await cluster.runs.submit("talker", n)).run_id for n in range(2)]

    async def member_busy() -> bool:
        return member in [await claimant(cluster, r) for r in run_ids if await _claimed(cluster, r)]

    await wait_for(member_busy, 10)
    await asyncio.sleep(0.7)  # two or three tokens out
    await cluster.control.stop(member)
    views = await finished(cluster, run_ids, timeout=40)
    restarted = 0
    for run_id in run_ids:
        assert views[run_id].status == "succeeded" and views[run_id].output == "".join(TOKENS)
        events = await served_by(cluster, "talker", run_id)
        restarted += sum(e["event_type"] == "restarted" for e in events)
        kept = kept_events(events)
        text = "".join(e["data"]["text"] for e in kept if e["event_type"] == "token")
        assert text == views[run_id].output, [(e["seq"], e["event_type"], e.get("data")) for e in events]
        kinds = [e["event_type"] for e in kept]
        assert kinds.count("started") == 1 and kinds.count("step") == 1 and kinds.count("completed") == 1
    assert restarted == 1  # the stopped member's run, only


async def test_a_submit_that_fails_half_way_is_never_served(cluster: Cluster) -> None:
    """Finding 8: the run's record goes before its request (in the same round trip, the request
    last), so a submit whose round trip fails leaves nothing an idle member could serve."""
    EXECUTED.clear()
    blueprint = counted_blueprint("ph", RunServing(mode="pool", min_size=1, max_size=1), 0.2)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    board_type = type(cluster.runs.api_board)
    real_write_group = board_type.write_group

    async def failing_write_group(*args: Any, **kwargs: Any) -> Any:
        raise BlackboardUnavailable("write_group", "redis://blip")

    board_type.write_group = failing_write_group  # type: ignore[method-assign]
    try:
        with pytest.raises(BlackboardUnavailable):
            await cluster.runs.submit("ph", "phantom")
    finally:
        board_type.write_group = real_write_group  # type: ignore[method-assign]
    after = (await cluster.runs.submit("ph", "real")).run_id
    assert (await finished(cluster, [after]))[after].output == "real"
    await asyncio.sleep(1.0)
    assert dict(EXECUTED) == {"real": 1}
    board = cluster.runs.run_board(await cluster.runs.record(after))
    claims = [e.key async for e in board.iter_query(AgentRunProtocol.pattern("claim"))]
    assert claims == [AgentRunProtocol.claim_key(after)]


async def test_a_submit_whose_answer_was_lost_leaves_nothing_to_serve(cluster: Cluster) -> None:
    """Redis applied the submit's request and marker but the answer was lost (a timeout): the
    submit fails, and takes the request back with its marker and record, so no busy member's
    pick-up serves a run its client was told failed."""
    EXECUTED.clear()
    blueprint = counted_blueprint("lost", RunServing(mode="pool", min_size=1, max_size=1), 0.5)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    first = (await cluster.runs.submit("lost", "first")).run_id  # the member is busy with it
    board = cluster.runs.run_board(await cluster.runs.record(first))
    real_write_group = type(board).write_group

    async def applied_then_lost(self: Blackboard, writes: Any, **kwargs: Any) -> Any:
        await real_write_group(self, writes, **kwargs)
        raise BlackboardUnavailable("write_group", "redis://blip", TimeoutError("answer lost"))

    type(board).write_group = applied_then_lost  # type: ignore[method-assign]
    try:
        with pytest.raises(BlackboardUnavailable):
            await cluster.runs.submit("lost", "phantom")
    finally:
        type(board).write_group = real_write_group  # type: ignore[method-assign]
    assert (await finished(cluster, [first]))[first].output == "first"
    await asyncio.sleep(1.5)  # the member is free again and has picked up what was pending
    assert dict(EXECUTED) == {"first": 1}
    requests = [e.key async for e in board.iter_query(AgentRunProtocol.pattern("request"))]
    assert requests == [AgentRunProtocol.request_key(first)]
    assert await pending_requests(board, AgentRunProtocol) == []


async def test_a_dropped_copys_expiry_on_the_declaration_is_taken_off_by_the_live_copy(
    cluster: Cluster,
) -> None:
    """Finding 10: a copy dropped after its replacement started leaves the role's serving
    declaration alone (only a stop retires it: `Agent.stopping`); an expiry that lands on it anyway
    is taken off by the live copy with the next run it serves, so the declaration does not vanish."""
    blueprint = nap_blueprint("decl", RunServing(mode="pool", min_size=1, max_size=2), seconds=0.1)
    await cluster.control.place(blueprint)
    (where,) = cluster.hosting("decl")
    other = "rb" if where == "ra" else "ra"
    run_id = (await cluster.runs.submit("decl", 1)).run_id
    await finished(cluster, [run_id])
    board = cluster.runs.run_board(await cluster.runs.record(run_id))
    entry = await board.read(serving_key(AgentRunProtocol))
    assert entry is not None and entry.expires_at is None
    runtime_other, runtime_where = cluster.hosts[other].runtime, cluster.hosts[where].runtime
    assert runtime_other is not None and runtime_where is not None
    await runtime_other.resume("decl")  # the copy that goes on
    await runtime_where.drop("decl")  # the old copy, dropped afterwards
    entry = await board.read(serving_key(AgentRunProtocol))
    assert entry is not None and entry.expires_at is None  # the dropped copy left it alone
    await board.expire([serving_key(AgentRunProtocol)], 3600)  # as a copy from before the fix did
    again = (await cluster.runs.submit("decl", 2)).run_id
    assert (await finished(cluster, [again]))[again].output == 2
    entry = await board.read(serving_key(AgentRunProtocol))
    assert entry is not None and entry.expires_at is None, entry.expires_at
    # and a real stop still retires it (on the runtime hosting the live copy: the registry may
    # still name the old replica)
    await runtime_other.stop("decl")
    entry = await board.read(serving_key(AgentRunProtocol))
    assert entry is not None and entry.expires_at is not None


async def test_a_busy_member_indexes_a_request_the_api_did_not_mark(cluster: Cluster) -> None:
    """Finding 10: while the API has no declaration cached as a pool's (it wrote no pending marker),
    a busy member marks the request, and the next idle member picks it up."""
    blueprint = nap_blueprint("unm", RunServing(mode="pool", min_size=1, max_size=1), seconds=1.0)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    first = (await cluster.runs.submit("unm", 1)).run_id

    async def claimed() -> bool:
        return await _claimed(cluster, first)

    await wait_for(claimed, 10)
    cluster.runs._serving[("unm", RUNS_NAMESPACE)] = (time.monotonic() + 60, RunServing())  # stale
    second = (await cluster.runs.submit("unm", 2)).run_id
    views = await finished(cluster, [first, second], timeout=8)
    assert [views[first].output, views[second].output] == [1, 2]


async def test_concurrent_submits_never_exceed_the_bound(cluster: Cluster) -> None:
    """Finding 12: the bound is a reservation (marker written, then counted): ten concurrent
    submits to an agent admitting one run admit at most one."""
    await cluster.control.place(nap_blueprint("one", RunServing(max_concurrent_runs=1), seconds=1.0))
    await cluster.runs.serving("one")
    results = await asyncio.gather(
        *(cluster.runs.submit("one", n) for n in range(10)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    assert all(isinstance(r, RunQueueFull) for r in results if isinstance(r, BaseException)), results
    assert len(admitted) <= 1, len(admitted)
    if admitted:
        await finished(cluster, [admitted[0].run_id])
    else:
        await asyncio.sleep(0.2)
    # refused submits leave nothing counted: a submit now is admitted
    later = (await cluster.runs.submit("one", "later")).run_id
    assert (await finished(cluster, [later]))[later].output == "later"


async def test_a_run_submitted_to_a_pool_member_is_refused(cluster: Cluster) -> None:
    """Finding 13: a member serves its role's runs; a submit naming it is refused, naming the role."""
    blueprint = nap_blueprint("pm", RunServing(mode="pool", min_size=2, max_size=2), seconds=0.1)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)

    async def two() -> bool:
        return len(await pools.members("pm")) == 2

    await wait_for(two, 10)
    (member,) = [m for m in await pools.members("pm") if m != "pm"]

    async def registered() -> bool:
        return await cluster.control.registry.get(member) is not None

    await wait_for(registered, 10)
    with pytest.raises(InvalidArgument, match="submit the run to 'pm'"):
        await cluster.runs.submit(member, "x")
    app = create_app(
        ApiServices(runs=cluster.runs, registry=cluster.control.registry, token="t", control=cluster.control)
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://c", headers={"Authorization": "Bearer t"}
    ) as client:
        refused = await client.post("/v1/runs", json={"agent": member, "input": 1})
        assert refused.status_code == 422, refused.text
        assert "'pm'" in refused.json()["error"]["message"]
        accepted = await client.post("/v1/runs", json={"agent": "pm", "input": 1})
        assert accepted.status_code == 202, accepted.text


async def test_a_marker_back_after_its_claim_does_not_hold_a_place_for_good(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 12 (its reservation): the agent's claim drops a run's pending marker in its commit;
    a marker written again after that (a busy member's late index, a re-open) is dropped when
    the run is served, so it does not count against max_concurrent_runs until the request's
    keys expire."""
    from colony.agents.run_capability import AgentRunCapability

    real_create = AgentRunCapability._create_once
    back: list[str] = []

    async def marker_comes_back(self: Any, key: str, value: Any, **kwargs: Any) -> bool:
        created = await real_create(self, key, value, **kwargs)
        drop = kwargs.get("drop")
        if created and drop and not back:
            run_id = drop.rsplit(":", 1)[-1]
            back.append(run_id)
            await self.blackboard.write(**pending_write(AgentRunProtocol, run_id, 60, API_WRITER))
        return created

    monkeypatch.setattr(AgentRunCapability, "_create_once", marker_comes_back)
    await cluster.control.place(nap_blueprint("res", RunServing(max_concurrent_runs=1), seconds=0.1))
    first = (await cluster.runs.submit("res", 1)).run_id
    await finished(cluster, [first])
    assert back == [first]
    second = (await cluster.runs.submit("res", 2)).run_id  # refused while the first's marker stayed
    assert (await finished(cluster, [second]))[second].output == 2


async def test_a_dead_reservation_does_not_hold_back_the_nudge_of_the_requests_behind_it(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oldest pending marker is an admission reservation whose request was never written (a
    submit that died; it lives RESERVE_SECONDS): the nudge passes over it to the real request."""
    monkeypatch.setattr(pools, "NUDGE_SECONDS", 0.05)
    await bb.write(**pending_write(AgentRunProtocol, "reserved-dead", 30, API_WRITER))
    await asyncio.sleep(0.01)
    request = AgentRunProtocol.request_key("real")
    await bb.write(request, {"input": 1}, tags={AgentRunProtocol.request_tag("real")})
    await bb.write(**pending_write(AgentRunProtocol, "real", 60, API_WRITER))
    await asyncio.sleep(0.1)  # both older than NUDGE_SECONDS

    class Requeues:
        def __init__(self) -> None:
            self.requeued: list[str] = []

        async def _requeue(self, board: Blackboard, request_id: str) -> None:
            self.requeued.append(request_id)

    spy = Requeues()
    await PoolManager._nudge(spy, bb, ["role"], set(), PoolState())  # type: ignore[arg-type]
    assert spy.requeued == ["real"]


async def test_a_member_still_being_placed_keeps_its_claims_until_it_counts_as_gone(cluster: Cluster) -> None:
    """A grown member starts (and may claim a request) before its registry record is written; while
    it is listed without a record for less than PLACING_SECONDS its claims are not re-opened (an
    idle member would run them a second time). Once it counts as gone, they are."""
    EXECUTED.clear()
    blueprint = counted_blueprint("plc", RunServing(mode="pool", min_size=1, max_size=2), 0.1)
    manager = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, manager, "plc", 1)
    board = manager.run_board("plc")
    listed, version = await manager._listed("plc")
    newcomer = "plc.placing00"
    await manager._save("plc", {**listed, newcomer: time.time()}, version)
    request_id = "run-0123456789abcdef"
    tag = AgentRunProtocol.request_tag(request_id)
    await board.write(  # claimed by the member being placed, before any other member hears of it
        AgentRunProtocol.claim_key(request_id),
        {"agent_id": newcomer, "holder": "h"},
        tags={tag, AgentRunProtocol.open_claims_tag()},
    )
    request = {"input": "held", "requester": "t"}
    await board.write(AgentRunProtocol.request_key(request_id), request, tags={tag})
    for _ in range(3):  # a few sizing rounds (the loop runs them too)
        await manager.size("plc", blueprint)
    await asyncio.sleep(0.5)
    claim = await board.read(AgentRunProtocol.claim_key(request_id))
    assert claim is not None and claim.value == {"agent_id": newcomer, "holder": "h"}
    assert EXECUTED["held"] == 0
    listed, version = await manager._listed("plc")
    await manager._save("plc", {**listed, newcomer: time.time() - pools.PLACING_SECONDS - 1}, version)
    await wait_for(lambda: board.read(AgentRunProtocol.result_key(request_id)), timeout=20)
    assert EXECUTED["held"] == 1


async def test_a_known_agent_is_read_once_a_window_an_unknown_one_every_time(bb: Blackboard) -> None:
    """A submit checks the registry for the agent (404 when it has no record); a record found is
    trusted for SERVING_CACHE_SECONDS (one read per window, not one per submit), a missing one is
    never remembered: a submit right after the agent is registered is accepted."""
    from colony.system.registry import AgentRecord, AgentRegistry
    from colony.system.runs import RunService

    colony = f"known{uuid.uuid4().hex[:8]}"
    registry = AgentRegistry(bb.scoped(f"tenant:default:colony:{colony}"), settings=load_settings())
    runs = RunService(bb, registry, colony_id=colony, retention_seconds=60, settings=load_settings())
    reads = count_calls(registry, "get")
    for _ in range(2):
        with pytest.raises(AgentNotFound):
            await runs.submit("later", "x")
    assert reads["count"] == 2
    await registry.put(AgentRecord(agent_id="later", agent_type="service"))
    for n in range(3):
        await runs.submit("later", n)
    assert reads["count"] == 3


async def test_a_pick_up_whose_answer_was_lost_still_serves_what_it_claimed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis applied a free member's pick-up (its claim of the oldest pending run) but the answer
    was lost: the member finds the claim it holds by its value and serves the run, once; nothing
    is left claimed by a live member that does not know it."""
    EXECUTED.clear()
    blueprint = counted_blueprint("lostpick", RunServing(mode="pool", min_size=1, max_size=1), 0.3)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    real = run_pool.claim_oldest_pending
    lost: list[str] = []

    async def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        picked = await real(*args, **kwargs)
        waited = isinstance(picked, PickedUp) and picked.request and picked.request.value["input"] != "held"
        if waited and not lost:  # (the held run is picked up on its event: not the one lost)
            lost.append(picked.request_id)
            raise BlackboardUnavailable("claim_oldest", "redis://blip", TimeoutError("answer lost"))
        return picked

    monkeypatch.setattr(run_pool, "claim_oldest_pending", applied_then_lost)
    first, waiting = await queued_behind_a_held_run(cluster, "lostpick", ["w0", "w1"])
    views = await finished(cluster, [first, *waiting])
    assert {v.status for v in views.values()} == {"succeeded"}
    assert lost and lost[0] in waiting  # a pick-up's answer was lost, and its run was served
    assert dict(EXECUTED) == {"held": 1, "w0": 1, "w1": 1}


@pytest.mark.parametrize("fresh_for", [0.5, 0.0])
async def test_a_picked_up_run_is_served_from_its_pick_ups_read_while_that_is_fresh(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, fresh_for: float
) -> None:
    """A free member's pick-up reads what serving the run needs with its claim: the run is served
    from that read, with no read of its own, unless the read got older than
    PICKED_UP_FRESH_SECONDS meanwhile (then it is read again)."""
    EXECUTED.clear()
    monkeypatch.setattr(run_capability, "PICKED_UP_FRESH_SECONDS", fresh_for)
    reads: list[str] = []
    real_read = Blackboard.read_many_and_tagged

    async def counting(self: Blackboard, keys: Any, *args: Any, **kwargs: Any) -> Any:
        reads.extend(k for k in keys if k.startswith("request:"))
        return await real_read(self, keys, *args, **kwargs)

    monkeypatch.setattr(Blackboard, "read_many_and_tagged", counting)
    blueprint = counted_blueprint("fresh", RunServing(mode="pool", min_size=1, max_size=1), 0.3)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    first, waiting = await queued_behind_a_held_run(cluster, "fresh", ["w0", "w1"])
    views = await finished(cluster, [first, *waiting])
    assert {v.status for v in views.values()} == {"succeeded"}
    assert dict(EXECUTED) == {"held": 1, "w0": 1, "w1": 1}
    read_again = {AgentRunProtocol.request_key(r) for r in waiting} & set(reads)
    assert read_again == (set() if fresh_for else {AgentRunProtocol.request_key(r) for r in waiting})
