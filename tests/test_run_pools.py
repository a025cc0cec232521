"""Runs scale out (M14): agent pools sized by the control plane's PoolManager and the
`max_concurrent_runs` admission bound, on a real redis-server with in-process ReplicaHosts and a
real ControlPlane (placement, stop, the monitor loop calling `pools.tick()`)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
    run_pool,
)
from colony.agents.models import RunServing
from colony.agents.run_claims import (
    API_INDEXED_WRITER,
    API_WRITER,
    PickedUp,
    pending_requests,
    pending_tag,
    pending_write,
)
from colony.agents.run_pool import ClaimsInProcess, PoolMember
from colony.api.app import ApiServices, create_app
from colony.blackboard import AgentRunProtocol, Blackboard
from colony.config import ColonySettings, ServeSettings, VcmSettings
from colony.errors import RunQueueFull
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.pools import PoolManager, member_blueprint
from colony.system.runs import RunService

TERMINAL = ("succeeded", "failed", "cancelled")
TERMINAL_EVENTS = ("completed", "failed", "cancelled")


class NapCapability(AgentCapability):
    """A run that takes a while: what makes one agent's loop the bottleneck."""

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def nap(self, value: Any = None, seconds: float = 0.3) -> Any:
        """Sleep, then return the value."""
        await asyncio.sleep(seconds)
        return value


def nap_blueprint(agent_id: str, serving: RunServing, seconds: float = 0.3) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="nap"),
        capabilities=[NapCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "nap", "parameters": {"value": "$input", "seconds": seconds}}]
        ),
        serving=serving,
    )


class Cluster:
    def __init__(self, bb: Blackboard, settings: ColonySettings) -> None:
        self.bb = bb
        self.settings = settings
        self.hosts = {
            n: ReplicaHost(settings, n, engine=ScriptedEngine(lambda r: "ok")) for n in ("ra", "rb")
        }
        self.control = ControlPlane(bb, self.hosts, settings)
        for host in self.hosts.values():
            host.spawner = self.control.place
        self.runs = RunService(bb, self.control.registry, colony_id=settings.colony_id, settings=settings)

    async def start(self) -> None:
        for host in self.hosts.values():
            await host.start(self.bb)
        self.control.start()

    def use_pools(self, *blueprints: AgentBlueprint) -> PoolManager:
        self.control.pools = PoolManager(self.control, {bp.metadata.agent_id: bp for bp in blueprints})
        return self.control.pools

    async def close(self) -> None:
        await self.control.close()
        for host in self.hosts.values():
            await host.close()

    def hosting(self, agent_id: str) -> list[str]:
        return [n for n, h in self.hosts.items() if h.runtime and agent_id in h.runtime.agent_ids]


@pytest.fixture
async def cluster(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),
        redis_url=redis_url,
        colony_id=f"pool{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=16),
    )
    made = Cluster(bb, settings)
    await made.start()
    yield made
    await made.close()


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():  # noqa: ASYNC110 - polling Redis state
            await asyncio.sleep(0.05)


async def finished(cluster: Cluster, run_ids: list[str], timeout: float = 30.0) -> dict[str, Any]:
    views: dict[str, Any] = {}

    async def all_done() -> bool:
        for run_id in run_ids:
            if run_id not in views:
                view = await cluster.runs.get(run_id)
                if view.status in TERMINAL:
                    views[run_id] = view
        return len(views) == len(run_ids)

    await wait_for(all_done, timeout)
    return views


async def served_by(cluster: Cluster, role: str, run_id: str) -> list[dict[str, Any]]:
    """The run's stored events, in order (to count `started` and terminal events)."""
    record = await cluster.runs.record(run_id)
    board = cluster.runs.run_board(record)
    entries = [e async for e in board.iter_query(AgentRunProtocol.event_pattern(run_id))]
    return [e.value for e in sorted(entries, key=lambda e: e.key)]


def kept_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events a client keeps: each `restarted` event drops the earlier events numbered after
    its `supersedes_after` (docs/api.md, Run events), and goes itself."""
    kept: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["event_type"] == "restarted":
            kept = [e for e in kept if e["seq"] <= event["data"]["supersedes_after"]]
            continue
        kept.append(event)
    return kept


async def claimant(cluster: Cluster, run_id: str) -> str:
    record = await cluster.runs.record(run_id)
    claim = await cluster.runs.run_board(record).read(AgentRunProtocol.claim_key(run_id))
    assert claim is not None
    value = claim.value
    return value["agent_id"] if isinstance(value, dict) else value


async def pool_hosted(cluster: Cluster, pools: PoolManager, role: str, size: int) -> None:
    """Wait until the pool of `role` lists `size` agents (its own included), each hosted."""

    async def hosted() -> bool:
        members = await pools.members(role)
        return len(members) == size and all(cluster.hosting(m) for m in members)

    await wait_for(hosted, 10)


async def member_busy_in_two_member_pool(
    cluster: Cluster, role: str, runs: int, seconds: float = 1.0
) -> tuple[PoolManager, str, list[str]]:
    """A pool of two (the role's agent and one member) running slow naps: `runs` submitted, back
    once the member holds one of them. The pool manager, the member and the run ids."""
    blueprint = nap_blueprint(role, RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60), seconds)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)

    await pool_hosted(cluster, pools, role, 2)
    (member,) = [m for m in await pools.members(role) if m != role]
    run_ids = [(await cluster.runs.submit(role, n)).run_id for n in range(runs)]

    async def member_busy() -> bool:
        return member in [await claimant(cluster, r) for r in run_ids if await _claimed(cluster, r)]

    await wait_for(member_busy, 10)
    return pools, member, run_ids


async def test_pool_grows_under_queue_depth_and_shrinks_when_idle(cluster: Cluster) -> None:
    serving = RunServing(mode="pool", min_size=1, max_size=3, scale_up_queue_depth=1.0, idle_seconds=1.0)
    blueprint = nap_blueprint("napper", serving, seconds=0.4)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    assert await pools.members("napper") == ["napper"]
    run_ids = [(await cluster.runs.submit("napper", n)).run_id for n in range(9)]

    async def grown() -> bool:
        return len(await pools.members("napper")) == 3

    await wait_for(grown, 10)
    members = await pools.members("napper")
    assert all(m == "napper" or m.startswith("napper.") for m in members)
    # spread over the replicas by the placement (two replicas, three members)
    assert {r for m in members for r in cluster.hosting(m)} == {"ra", "rb"}
    views = await finished(cluster, run_ids)
    assert [views[r].output for r in run_ids] == list(range(9))
    assert {v.status for v in views.values()} == {"succeeded"}
    servers = Counter([await claimant(cluster, r) for r in run_ids])
    assert len(servers) >= 2, servers  # the runs did not all go through one agent's loop
    assert ("napper", RUNS_NAMESPACE) in cluster.runs._serving  # the API read the pool's declaration
    assert (await cluster.runs.serving("napper")).is_pool

    async def shrunk() -> bool:
        return await pools.members("napper") == ["napper"]

    await wait_for(shrunk, 15)
    for member in members:
        if member != "napper":
            record = await cluster.control.registry.get(member)
            assert record is not None and record.state == "stopped"
            assert cluster.hosting(member) == []
    # a pool shrunk to its role's agent still serves
    again = (await cluster.runs.submit("napper", "after")).run_id
    assert (await finished(cluster, [again]))[again].output == "after"


async def test_a_request_is_claimed_by_exactly_one_member(cluster: Cluster) -> None:
    serving = RunServing(mode="pool", min_size=3, max_size=3, idle_seconds=60)
    blueprint = nap_blueprint("claimer", serving, seconds=0.05)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)

    await pool_hosted(cluster, pools, "claimer", 3)
    run_ids = [
        r.run_id for r in await asyncio.gather(*(cluster.runs.submit("claimer", n) for n in range(30)))
    ]
    views = await finished(cluster, run_ids)
    assert {v.status for v in views.values()} == {"succeeded"}
    for run_id in run_ids:
        events = [e["event_type"] for e in await served_by(cluster, "claimer", run_id)]
        assert events.count("started") == 1, events
        assert [e for e in events if e in TERMINAL_EVENTS] == ["completed"], events
    servers = Counter([await claimant(cluster, r) for r in run_ids])
    assert set(servers) <= set(await pools.members("claimer"))
    assert len(servers) == 3, servers  # every member served some: busy members left work to idle ones
    # nothing is left in the pending index once every run is claimed
    record = await cluster.runs.record(run_ids[0])
    board = cluster.runs.run_board(record)
    assert (
        await board.query("pending:run:*", tags={"all_of": [pending_tag(AgentRunProtocol)]})
    ).entries == []


async def test_a_pool_member_stopped_mid_run_loses_no_run(cluster: Cluster) -> None:
    _pools, member, run_ids = await member_busy_in_two_member_pool(cluster, "sturdy", 4)
    await cluster.control.stop(member)  # gone for good mid-run (as a shrink racing a claim would)
    views = await finished(cluster, run_ids, timeout=40)
    assert [views[r].status for r in run_ids] == ["succeeded"] * 4
    assert [views[r].output for r in run_ids] == [0, 1, 2, 3]
    for run_id in run_ids:
        stored = await served_by(cluster, "sturdy", run_id)
        events = [e["event_type"] for e in stored]
        assert [e for e in events if e in TERMINAL_EVENTS] == ["completed"], events  # exactly once
        assert events.count("started") == 1, events
        # what a client keeps (a `restarted` event supersedes the stopped member's events after
        # `started`): one start, one step, one end, in that order, numbered without gaps
        kept = kept_events(stored)
        assert [e["event_type"] for e in kept] == ["started", "step", "completed"], events
        assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))


async def test_a_pool_member_whose_replica_dies_serves_its_runs_from_its_restored_copy(
    cluster: Cluster,
) -> None:
    pools, member, run_ids = await member_busy_in_two_member_pool(cluster, "hardy", 4)
    await asyncio.sleep(0.3)  # in its slow step
    (where,) = cluster.hosting(member)
    doomed = cluster.hosts.pop(where)
    for agent_id in doomed.runtime.agent_ids:  # the replica dies: no goodbye, state stays in Redis
        await doomed.runtime.drop(agent_id)
    await doomed.close()
    views = await finished(cluster, run_ids, timeout=40)
    assert [views[r].output for r in run_ids] == [0, 1, 2, 3]
    assert {views[r].status for r in run_ids} == {"succeeded"}
    for run_id in run_ids:
        events = [e["event_type"] for e in await served_by(cluster, "hardy", run_id)]
        assert [e for e in events if e in TERMINAL_EVENTS] == ["completed"], events
    (survivor,) = cluster.hosts
    assert cluster.hosting(member) == [survivor]  # the same member, re-placed by the monitor
    assert member in await pools.members("hardy")


async def handle_request_answered(board: Blackboard, request_id: str, value: Any, timeout: float) -> Any:
    """Write a request as another agent's AgentHandle does (no pending marker), and wait for its
    result's value."""
    await board.write(
        AgentRunProtocol.request_key(request_id),
        {"input": value, "requester": "some-agent"},
        tags={AgentRunProtocol.request_tag(request_id)},
        created_by="some-agent",
    )

    async def answered() -> bool:
        return await board.read(AgentRunProtocol.result_key(request_id)) is not None

    await wait_for(answered, timeout)
    result = await board.read(AgentRunProtocol.result_key(request_id))
    assert result is not None
    return result.value


async def test_a_request_no_submitter_indexed_waits_for_a_free_member(cluster: Cluster) -> None:
    """A request written by another agent (an AgentHandle's: no pending marker) while every
    member is busy is indexed by a busy member and picked up when one is free."""
    blueprint = nap_blueprint("lonely", RunServing(mode="pool", min_size=1, max_size=1), seconds=0.5)
    cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    first = (await cluster.runs.submit("lonely", "first")).run_id

    async def busy() -> bool:
        return await _claimed(cluster, first)

    await wait_for(busy, 10)
    board = cluster.runs.run_board(await cluster.runs.record(first))
    result = await handle_request_answered(board, "handle-req-1", "second", 10)
    assert result["status"] == "succeeded" and result["output"] == "second"


def request_ids_passed_to(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The request ids every pool member passes to its `method` (`mark_pending`, `drop`)
    from now on, the method still doing its work."""
    from colony.agents.run_pool import PoolMember

    seen: list[str] = []
    original = getattr(PoolMember, method)

    async def recording(self: Any, request_id: str) -> None:
        seen.append(request_id)
        await original(self, request_id)

    monkeypatch.setattr(PoolMember, method, recording)
    return seen


async def test_busy_members_index_only_what_the_api_did_not(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API indexes its pool runs itself (marker first, the request by API_INDEXED_WRITER):
    busy members write no marker of their own for them (one wasted create per busy member per
    run, before); another writer's request they still index, and every run is served."""
    marked = request_ids_passed_to(monkeypatch, "mark_pending")
    _pools, _member, run_ids = await member_busy_in_two_member_pool(cluster, "indexed", 2, seconds=1.0)
    more = [(await cluster.runs.submit("indexed", n)).run_id for n in range(3)]
    board = cluster.runs.run_board(await cluster.runs.record(more[0]))
    request = await board.read(AgentRunProtocol.request_key(more[0]))
    assert request is not None and request.created_by == API_INDEXED_WRITER
    await board.write(
        AgentRunProtocol.request_key("handle-req-2"),
        {"input": "other", "requester": "some-agent"},
        tags={AgentRunProtocol.request_tag("handle-req-2")},
        created_by="some-agent",
    )
    views = await finished(cluster, [*run_ids, *more])
    assert {v.status for v in views.values()} == {"succeeded"}

    async def answered() -> bool:
        return await board.read(AgentRunProtocol.result_key("handle-req-2")) is not None

    await wait_for(answered, 15)
    assert not set(marked) & {*run_ids, *more}, marked
    assert "handle-req-2" in marked


async def test_a_claim_takes_its_request_out_of_the_pending_index_in_its_commit(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's pending marker leaves with the claim, in one commit: no separate drop per run,
    and nothing is left in the index."""
    drops = request_ids_passed_to(monkeypatch, "drop")
    blueprint = nap_blueprint("dropper", RunServing(mode="pool", min_size=1, max_size=1), seconds=0.01)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools, "dropper", 1)
    run_ids = []
    for n in range(4):  # one at a time: each finds the member idle and is claimed from its event
        run_ids.append((await cluster.runs.submit("dropper", n)).run_id)
        await finished(cluster, run_ids[-1:])
    board = cluster.runs.run_board(await cluster.runs.record(run_ids[0]))
    assert await pending_requests(board, AgentRunProtocol) == []
    assert drops == [], drops


async def _claimed(cluster: Cluster, run_id: str) -> bool:
    record = await cluster.runs.record(run_id)
    return await cluster.runs.run_board(record).read(AgentRunProtocol.claim_key(run_id)) is not None


async def test_max_concurrent_runs_refuses_beyond_the_bound_with_429(cluster: Cluster) -> None:
    blueprint = nap_blueprint("bounded", RunServing(max_concurrent_runs=2), seconds=1.0)
    await cluster.control.place(blueprint)
    app = create_app(
        ApiServices(runs=cluster.runs, registry=cluster.control.registry, token="t", control=cluster.control)
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://c", headers={"Authorization": "Bearer t"}
    ) as client:
        first = await client.post("/v1/runs", json={"agent": "bounded", "input": 1})
        second = await client.post("/v1/runs", json={"agent": "bounded", "input": 2})
        assert first.status_code == 202 and second.status_code == 202, (first.text, second.text)
        third = await client.post("/v1/runs", json={"agent": "bounded", "input": 3})
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "too_many_runs"
        assert "max_concurrent_runs" in third.json()["error"]["message"]
        assert float(third.headers["Retry-After"]) > 0
        views = await finished(cluster, [first.json()["run_id"], second.json()["run_id"]])
        assert {v.status for v in views.values()} == {"succeeded"}
        # room again once they ended
        fourth = await client.post("/v1/runs", json={"agent": "bounded", "input": 4})
        assert fourth.status_code == 202, fourth.text


async def test_an_agent_without_a_bound_admits_any_number(cluster: Cluster) -> None:
    await cluster.control.place(nap_blueprint("open", RunServing(), seconds=0.01))
    run_ids = [(await cluster.runs.submit("open", n)).run_id for n in range(12)]
    views = await finished(cluster, run_ids)
    assert [views[r].output for r in run_ids] == list(range(12))  # single: in submit order too


def test_member_blueprint_serves_the_role_scope() -> None:
    blueprint = nap_blueprint("role", RunServing(mode="pool", max_size=2))
    member = member_blueprint(blueprint, "role.abc")
    assert member.metadata.agent_id == "role.abc" and member.metadata.parent_id == "role"
    (runs,) = [c for c in member.capabilities if getattr(c, "cls", None) is AgentRunCapability]
    assert runs.kwargs["scope_id"] == "role"
    assert blueprint.capabilities[1].kwargs.get("scope_id") is None  # the role's own is unchanged
    assert member.serving == blueprint.serving


def test_serving_declaration_is_validated() -> None:
    with pytest.raises(ValueError, match="min_size"):
        RunServing(mode="pool", min_size=3, max_size=2)
    with pytest.raises(ValueError, match="pool"):
        RunServing(mode="single", max_size=4)
    assert RunServing(mode="pool", max_size=3, max_concurrent_runs=2).admitted_at_once() == 6
    assert RunServing().admitted_at_once() is None


def test_run_queue_full_is_a_typed_error() -> None:
    assert RunQueueFull("x", 2.0).retry_after_seconds == 2.0


def test_builtin_pools_are_sized_by_the_settings() -> None:
    from colony.system.catalog import colony_blueprints

    settings = ColonySettings(
        runs={"echo_pool": {"max_size": 7, "idle_seconds": 5}, "ask_pool": {"min_size": 2}}
    )
    blueprints = colony_blueprints(settings)
    echo, ask = blueprints["echo"].serving, blueprints["ask"].serving
    assert (echo.mode, echo.min_size, echo.max_size, echo.idle_seconds) == ("pool", 1, 7, 5)
    assert (ask.mode, ask.min_size, ask.max_size) == ("pool", 2, 2)
    assert blueprints["session"].serving == RunServing()  # stateful agents stay single
    with pytest.raises(Exception, match="min_size"):
        colony_blueprints(ColonySettings(runs={"echo_pool": {"min_size": 5, "max_size": 2}}))


def test_engine_replicas_autoscale_only_when_enabled() -> None:
    from colony.serve.app import build_app_with_settings, engine_scaling

    fixed = ColonySettings()
    assert engine_scaling(fixed, 3) == {"num_replicas": 3}
    scaled = ColonySettings(
        serve={
            "autoscaling": {
                "enabled": True,
                "min_replicas": 2,
                "max_replicas": 5,
                "target_ongoing_requests": 4,
            }
        }
    )
    config = engine_scaling(scaled, 3)["autoscaling_config"]
    assert (config["min_replicas"], config["max_replicas"], config["target_ongoing_requests"]) == (2, 5, 4)
    # what Serve is handed: the EngineReplica deployment of the built application
    deployed = engine_deployment(build_app_with_settings({"replicas": 3}, settings=scaled))._deployment_config
    assert deployed.autoscaling_config.max_replicas == 5
    fixed_engine = engine_deployment(build_app_with_settings({"replicas": 3}, settings=fixed))
    assert fixed_engine.num_replicas == 3 and fixed_engine._deployment_config.autoscaling_config is None


def engine_deployment(app: Any) -> Any:
    """The EngineReplica deployment of the built app: ColonyAPI(data, AgentSystem(data, EngineReplica))."""
    system = app._bound_deployment.init_args[1]
    engine = system._bound_deployment.init_args[1]._bound_deployment
    assert engine.name == "EngineReplica"
    return engine


class GateCapability(AgentCapability):
    """The first run (input 0) holds its member until the test opens the gate; the others nap."""

    gate: asyncio.Event | None = None

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def gated_nap(self, value: Any = None, seconds: float = 0.15) -> Any:
        """Wait for the gate (input 0), else sleep; then return the value."""
        if value == 0 and GateCapability.gate is not None:
            await GateCapability.gate.wait()
        else:
            await asyncio.sleep(seconds)
        return value


async def test_a_free_member_takes_the_oldest_waiting_run_first(cluster: Cluster) -> None:
    """One member, runs queued behind a busy one: each time it is free it picks the oldest run
    still waiting (by when it was submitted, not by id), passing over reservations whose request
    is not written (more of them than it reads in one round trip). The first run holds the member
    until every run is submitted: a run submitted just as the member comes free may be claimed
    from its event before an older one waiting (docs/scaling.md: roughly in submit order), which
    a loaded box made this test hit."""
    GateCapability.gate = asyncio.Event()
    blueprint = AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id="fifo", agent_type=AgentType.SERVICE, role="fifo"),
        capabilities=[GateCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "gated_nap", "parameters": {"value": "$input"}}]
        ),
        serving=RunServing(mode="pool", min_size=1, max_size=1),
    )
    cluster.use_pools(blueprint)
    try:
        await cluster.control.place(blueprint)
        first = (await cluster.runs.submit("fifo", 0)).run_id
        board = cluster.runs.run_board(await cluster.runs.record(first))
        await wait_for(lambda: _claimed(cluster, first), 10)
        for n in range(6):  # older than every queued run: reservations, no request behind them
            await board.write(**pending_write(AgentRunProtocol, f"reserved-{n}", 60, API_WRITER))
        queued = [(await cluster.runs.submit("fifo", n)).run_id for n in range(1, 9)]
        assert (await cluster.runs.get(first)).status not in TERMINAL  # still held: all eight wait
    finally:
        GateCapability.gate.set()  # never left closed for another test (a set Event needs no loop)
    views = await finished(cluster, [first, *queued])
    assert {v.status for v in views.values()} == {"succeeded"}
    results = await board.read_many([AgentRunProtocol.result_key(r) for r in queued])
    requests = await board.read_many([AgentRunProtocol.request_key(r) for r in queued])
    served = sorted(queued, key=lambda r: results[queued.index(r)].created_at)
    # in submission order: the oldest waiting first, every time, by Redis's clock (milliseconds:
    # runs submitted within the same one are taken in either order among themselves)
    submitted = {r: requests[queued.index(r)].created_at for r in queued}
    assert [submitted[r] for r in served] == sorted(submitted[r] for r in queued)
    assert len(set(submitted.values())) > 1
    assert await pending_requests(board, AgentRunProtocol) == [f"reserved-{n}" for n in range(6)]


async def test_idle_members_of_one_process_try_each_request_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every idle member sees each request's event; in one process only the first to take it on
    tries to claim it (the others' attempts were a failed commit and a read each), by a pick-up
    (one script call that claims and reads it) since its submitter indexed it."""
    blueprint = nap_blueprint("solo", RunServing(mode="pool", min_size=3, max_size=3, idle_seconds=60), 0.01)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools, "solo", 3)
    lost: list[str] = []
    picked: list[str] = []
    nothing: list[str] = []  # pick-ups that claimed nothing
    claim = AgentRunCapability._claim
    pick_up = run_pool.claim_oldest_pending

    async def counted(self: AgentRunCapability, agent: Agent, request_id: str) -> bool:
        won = await claim(self, agent, request_id)
        if not won:
            lost.append(request_id)
        return won

    async def counted_pick_up(*args: Any, **kwargs: Any) -> Any:
        taken = await pick_up(*args, **kwargs)
        (picked if isinstance(taken, PickedUp) else nothing).append(str(taken))
        return taken

    monkeypatch.setattr(AgentRunCapability, "_claim", counted)
    monkeypatch.setattr(run_pool, "claim_oldest_pending", counted_pick_up)
    for n in range(6):  # one at a time: all three members idle when each arrives
        run_id = (await cluster.runs.submit("solo", n)).run_id
        assert (await finished(cluster, [run_id]))[run_id].output == n
    assert len(picked) == 6, picked  # each claimed and read by one script call
    assert len(lost) <= 1, lost  # before: the two other idle members lost each one (12)
    # the serving member's look after its run finds nothing, once a run; the others did not try
    assert len(nothing) <= 6 + 1, nothing


async def test_a_claim_attempt_that_fails_leaves_the_request_to_another_member(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member that took a request on and whose claim raised lets it go: the request is
    (still) in the pending index, and a free member serves it, though the other members let its
    event pass."""
    blueprint = nap_blueprint("flaky", RunServing(mode="pool", min_size=2, max_size=2, idle_seconds=60), 0.01)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools, "flaky", 2)
    claim = AgentRunCapability._claim
    failed: list[str] = []

    async def fails_once(self: AgentRunCapability, agent: Agent, request_id: str) -> bool:
        if not failed:
            failed.append(request_id)
            raise RuntimeError("claim cut off")
        return await claim(self, agent, request_id)

    monkeypatch.setattr(AgentRunCapability, "_claim", fails_once)
    board = cluster.runs.run_board(await cluster.runs.record((await cluster.runs.submit("flaky", 0)).run_id))
    # a request no submitter indexed (an AgentHandle's): the failed member marks it pending itself
    result = await handle_request_answered(board, "handle-req-2", "second", 15)
    assert len(failed) == 1 and result["output"] == "second"


async def test_claims_in_process_are_tried_once_taken_over_on_failure_and_bounded() -> None:
    claims = ClaimsInProcess(size=3)
    assert claims.take("a") is None  # the first member tries
    waiting = claims.take("a")
    assert waiting is not None and not waiting.done()  # the next one waits for its outcome
    claims.settle("a", decided=False)  # the attempt raised: the waiter tries in its place
    assert waiting.result() is False and claims.take("a") is None
    again = claims.take("a")
    assert again is not None
    claims.settle("a", decided=True)
    assert again.result() is True
    decided = claims.take("a")
    assert decided is not None and decided.result() is True  # decided before: nobody tries
    for key in ("b", "c", "d"):
        assert claims.take(key) is None
        claims.settle(key, decided=True)
    assert claims.take("a") is None  # the oldest decided one was forgotten: the bound holds
    for key in ("e", "f", "g"):  # "a" in flight is kept, however old
        assert claims.take(key) is None
        claims.settle(key, decided=True)
    assert claims.take("a") is not None


async def test_a_member_waiting_on_a_failed_claim_attempt_claims_in_its_place(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: the members that let the first one try did not see the event again, and a
    request no submitter indexed was stranded when that attempt failed and Redis refused its
    pending marker too. Now they wait for its outcome and the next one tries."""
    blueprint = nap_blueprint("relay", RunServing(mode="pool", min_size=3, max_size=3, idle_seconds=60), 0.01)
    pools = cluster.use_pools(blueprint)
    await cluster.control.place(blueprint)
    await pool_hosted(cluster, pools, "relay", 3)
    board = cluster.runs.run_board(await cluster.runs.record((await cluster.runs.submit("relay", 0)).run_id))
    claim = AgentRunCapability._claim
    failed: list[str] = []

    async def fails_once(self: AgentRunCapability, agent: Agent, request_id: str) -> bool:
        if request_id == "handle-req-3" and not failed:
            failed.append(self._agent().agent_id)
            await asyncio.sleep(0.2)  # the others are waiting on it meanwhile
            raise RuntimeError("claim cut off")
        return await claim(self, agent, request_id)

    async def refused(self: PoolMember, request_id: str) -> None:
        return None  # the fallback marker is lost too

    monkeypatch.setattr(AgentRunCapability, "_claim", fails_once)
    monkeypatch.setattr(PoolMember, "mark_pending", refused)
    result = await handle_request_answered(board, "handle-req-3", "third", 10)
    assert result["output"] == "third" and len(failed) == 1
    held = await board.read(AgentRunProtocol.claim_key("handle-req-3"))  # retired: its holder's id
    assert held is not None and held.value != failed[0]
