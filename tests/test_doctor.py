"""The invariant checker (`colony doctor`, issue 12 item 6): a consistent colony built by real replica
hosts, the registry and the page table is clean; each invariant broken by one minimal write through
the real APIs is reported with its kind and subject; the real healing loops (heartbeat, resource
monitor) make it clean again; listings are bounded; an unreachable Redis is exit code 2."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_kit import counter_blueprint

from colony.agents import ResumptionCondition, ResumptionKind
from colony.blackboard import Blackboard, BlackboardScope, create_redis, scope_id
from colony.blackboard.protocol import (
    AgentRegistryProtocol,
    AgentRunProtocol,
    AgentStateProtocol,
    VcmProtocol,
)
from colony.config import ColonySettings
from colony.errors import InvalidArgument
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.doctor import DoctorReport, ViolationKind, check_invariants
from colony.system.doctor_command import (
    EXIT_CLEAN,
    EXIT_INCOMPLETE,
    EXIT_UNREACHABLE,
    EXIT_UNREADABLE,
    EXIT_VIOLATIONS,
    doctor_command,
)
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService
from colony.vcm import PageSource, PageTable

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]
LATER = 1000.0  # judge ages this far in the future: every state is past the grace period
TICK = 0.01  # entries carry millisecond timestamps: a heartbeat this much later is newer


@dataclass
class Colony:
    bb: Blackboard
    settings: ColonySettings
    hosts: dict[str, ReplicaHost]
    registry: AgentRegistry
    pages: PageTable
    page_ids: list[str]

    @property
    def colony_id(self) -> str:
        return self.settings.colony_id

    @property
    def board(self) -> Blackboard:
        return self.bb.scoped(scope_id(BlackboardScope.COLONY, colony_id=self.colony_id))

    def agent_board(self, agent_id: str, namespace: str | None = None) -> Blackboard:
        return self.bb.scoped(
            scope_id(BlackboardScope.AGENT, colony_id=self.colony_id, agent_id=agent_id, namespace=namespace)
        )

    async def check(self, *, later: bool = True, **kwargs: object) -> DoctorReport:
        kwargs.setdefault("now", time.time() + LATER if later else None)
        kwargs.setdefault("grace_seconds", 5.0)
        return await check_invariants(self.bb, colony_id=self.colony_id, **kwargs)  # type: ignore[arg-type]

    async def beat(self) -> None:
        for host in self.hosts.values():
            await host._beat()

    async def kill(self, replica_id: str) -> None:
        """What a SIGKILLed replica leaves: its heartbeat stops (here: gone at once, not after its TTL)."""
        host = self.hosts.pop(replica_id)
        assert host._heartbeat is not None
        host._heartbeat.cancel()
        await self.board.delete(AgentRegistryProtocol.replica_key(replica_id))


def found(report: DoctorReport) -> set[tuple[str, str]]:
    return {(v.kind.value, v.subject) for v in report.violations}


@pytest.fixture
async def colony(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Colony]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"doc{uuid.uuid4().hex[:8]}")
    settings.serve.heartbeat_seconds = 3600.0  # the test beats by hand: no loop heals behind its back
    hosts = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("ra", "rb")}
    for host in hosts.values():
        await host.start(bb)
    for n in range(2):
        (tmp_path / f"f{n}.txt").write_text(f"file {n} " * 50)
    table = PageTable(bb, colony_id=settings.colony_id, settings=settings)
    source = await table.map_source(PageSource(tmp_path, allowed_roots=[tmp_path], page_tokens=64))
    col = Colony(bb, settings, dict(hosts), hosts["ra"].registry, table, source.page_ids)  # type: ignore[arg-type]
    yield col
    for host in hosts.values():
        await host.close()


async def populate(colony: Colony) -> None:
    """Agents a1 (ra), b1 (rb, serves runs), s1 (suspended, waits for a resume); pages resident on ra."""
    await colony.hosts["ra"].ensure_agent(counter_blueprint("a1", STEPS))
    await colony.hosts["rb"].ensure_agent(counter_blueprint("b1", STEPS, serve_namespace=RUNS_NAMESPACE))
    await colony.hosts["ra"].ensure_agent(counter_blueprint("s1", STEPS))
    custom = ResumptionCondition(kind=ResumptionKind.CUSTOM)
    await colony.hosts["ra"].runtime.suspend("s1", "request", custom)
    await colony.hosts["ra"].ensure_pages(colony.page_ids)
    await colony.beat()


async def test_consistent_colony_is_clean(colony: Colony) -> None:
    await populate(colony)
    runs = RunService(colony.bb, colony.registry, colony_id=colony.colony_id, settings=colony.settings)
    run = await runs.submit("b1", 2, timeout_s=5000)
    for _ in range(200):  # answered by b1's AgentRunCapability
        if (await runs.get(run.run_id)).status == "succeeded":
            break
        await asyncio.sleep(0.02)
    report = await colony.check(run_ids=[run.run_id])
    assert report.clean, report.violations
    assert report.checked.agents == 3 and report.checked.replicas == 2 and report.checked.suspended == 1
    assert report.checked.pages == len(colony.page_ids) > 0 and report.checked.runs == 1
    assert not report.truncated
    # checked right now (Redis' clock), too
    assert (await colony.check(later=False)).clean


async def test_agent_hosted_twice(colony: Colony) -> None:
    await populate(colony)
    await colony.hosts["rb"].ensure_agent(counter_blueprint("a1", STEPS))  # restored on rb as well
    await colony.beat()
    report = await colony.check()
    assert (ViolationKind.HOSTED_TWICE.value, "a1") in found(report)
    assert "ra" in report.violations[0].message and "rb" in report.violations[0].message


async def test_a_move_in_flight_is_not_reported(colony: Colony) -> None:
    """Suspended on ra and resumed on rb since the last heartbeats: ra's heartbeat still lists the
    agent, rb's does not yet. Heartbeats older than the registry's last write are not evidence."""
    await populate(colony)
    await colony.hosts["ra"].runtime.suspend("a1", "move", ResumptionCondition(kind=ResumptionKind.CUSTOM))
    await colony.hosts["rb"].resume_agent("a1")
    await colony.hosts["rb"].ensure_agent(counter_blueprint("n1", STEPS))  # no heartbeat lists it yet
    assert (await colony.check()).clean
    await colony.beat()
    report = await colony.check()
    assert report.clean and (await colony.registry.get("a1")).replica == "rb"


async def test_registry_places_agent_on_the_wrong_replica(colony: Colony) -> None:
    await populate(colony)
    record = await colony.registry.get("a1")
    await colony.registry.put(record.model_copy(update={"replica": "rb"}))  # ra hosts it
    await asyncio.sleep(TICK)
    for host in colony.hosts.values():  # heartbeats newer than the record (no registry healing)
        await colony.registry.beat(host.replica_id, host.info(), 60)
    assert found(await colony.check()) == {(ViolationKind.REGISTRY_MISMATCH.value, "a1")}
    await colony.beat()  # ra's heartbeat rewrites the record
    assert (await colony.check()).clean


async def test_agent_and_pages_on_a_dead_replica_until_the_monitor_recovers(colony: Colony) -> None:
    await populate(colony)
    await colony.hosts["rb"].ensure_pages(colony.page_ids[:1])
    await colony.beat()
    dead = colony.hosts["rb"]
    await colony.kill("rb")
    report = await colony.check()
    assert (ViolationKind.AGENT_ON_DEAD_REPLICA.value, "b1") in found(report)
    assert (ViolationKind.PAGE_ON_DEAD_REPLICA.value, colony.page_ids[0]) in found(report)
    assert not [v for v in report.violations if v.subject == "a1"]
    # right after the fault, within the grace period: not reported
    assert (await colony.check(later=False, grace_seconds=60)).clean
    monitor = ResumptionMonitor(
        colony.bb, colony.hosts, colony.registry, page_table=colony.pages, colony_id=colony.colony_id
    )
    assert await monitor.tick() == ["b1"]  # re-placed on ra; rb's pages dropped
    await colony.beat()
    assert (await colony.check()).clean
    await dead.close()


async def test_page_on_a_dead_replica_that_hosted_no_agent(colony: Colony) -> None:
    """A replica that hosted no agent is named only by the page table: the checker reports its
    pages, and the monitor's round finds it there and drops them."""
    await colony.hosts["rb"].ensure_pages(colony.page_ids)
    await colony.beat()
    dead = colony.hosts["rb"]
    await colony.kill("rb")
    report = await colony.check()
    assert found(report) == {(ViolationKind.PAGE_ON_DEAD_REPLICA.value, p) for p in colony.page_ids}
    monitor = ResumptionMonitor(
        colony.bb, colony.hosts, colony.registry, page_table=colony.pages, colony_id=colony.colony_id
    )
    # a page record that does not validate (written by anyone with Redis access) is skipped by
    # the monitor's sweep, not the end of its round
    await colony.pages.board.write(
        VcmProtocol.page_key("garbage"), {"resident_on": "not a list"}, tags={VcmProtocol.index_tag("page")}
    )
    assert await monitor.tick() == []  # no agent to move, but rb's pages are dropped
    assert found(await colony.check()) == {(ViolationKind.RECORD_UNREADABLE.value, "page:garbage")}
    await colony.pages.board.delete(VcmProtocol.page_key("garbage"))
    assert (await colony.check()).clean
    await dead.close()


async def test_suspended_agent_missing_from_the_monitors_index(colony: Colony) -> None:
    await populate(colony)
    entry = await colony.board.read(AgentRegistryProtocol.agent_key("s1"))
    await colony.board.write(entry.key, entry.value, tags={AgentRegistryProtocol.index_tag("agent")})
    monitor = ResumptionMonitor(colony.bb, colony.hosts, colony.registry, colony_id=colony.colony_id)
    assert "s1" not in [q.agent_id for q in await monitor._pending()]  # the monitor indeed misses it
    assert found(await colony.check()) == {(ViolationKind.SUSPENDED_NOT_INDEXED.value, "s1")}


async def test_suspended_agent_the_registry_still_places_on_a_replica(colony: Colony) -> None:
    """A registry write that lost a race with the suspension: the record says idle on ra, ra does
    not host it, its lifecycle says suspended. ra's next heartbeat heals it."""
    await populate(colony)
    await colony.registry.put(AgentRecord(agent_id="s1", role="counter", state="idle", replica="ra"))
    await asyncio.sleep(TICK)
    await colony.registry.beat("ra", colony.hosts["ra"].info(), 60)
    assert found(await colony.check()) == {(ViolationKind.SUSPENDED_NOT_INDEXED.value, "s1")}
    await colony.beat()
    assert (await colony.check()).clean


async def test_agent_lost_on_a_live_replica(colony: Colony) -> None:
    await populate(colony)
    await colony.registry.put(AgentRecord(agent_id="ghost", state="idle", replica="ra"))
    await asyncio.sleep(TICK)
    await colony.registry.beat("ra", colony.hosts["ra"].info(), 60)
    assert (ViolationKind.AGENT_LOST.value, "ghost") in found(await colony.check())


async def test_suspended_agent_the_monitor_cannot_read(colony: Colony) -> None:
    await populate(colony)
    board = colony.agent_board("s1")
    await board.write(AgentStateProtocol.key("suspension"), {"agent_id": "s1", "condition": "soon"})
    monitor = ResumptionMonitor(colony.bb, colony.hosts, colony.registry, colony_id=colony.colony_id)
    # the monitor's round goes on (one unreadable agent does not stop it) and takes it for an agent
    # waiting for an explicit resume, which the doctor reports
    [queued] = [q for q in await monitor._pending() if q.agent_id == "s1"]
    assert queued.condition.kind is ResumptionKind.CUSTOM
    report = await colony.check()
    assert found(report) == {(ViolationKind.SUSPENDED_UNRESUMABLE.value, "s1")}
    assert "suspension" in report.violations[0].message


async def test_run_claimed_by_a_stopped_agent_is_stuck(colony: Colony) -> None:
    await populate(colony)
    board = colony.agent_board("b1", RUNS_NAMESPACE)
    run_id = "run-claimedthenstopped"
    await board.write(
        AgentRunProtocol.claim_key(run_id),
        "b1",
        tags={AgentRunProtocol.request_tag(run_id), AgentRunProtocol.open_claims_tag()},
        expected_version=0,
    )
    assert (await colony.check()).clean  # claimed by a live agent: running
    await colony.hosts["rb"].stop_agent("b1")
    report = await colony.check()
    assert found(report) == {(ViolationKind.RUN_STUCK.value, run_id)}
    assert "b1 is stopped" in report.violations[0].message
    assert (await colony.check(later=False, grace_seconds=60)).clean  # within the grace period


async def test_named_runs_unclaimed_lost_or_waiting(colony: Colony) -> None:
    await populate(colony)
    runs = RunService(colony.bb, colony.registry, colony_id=colony.colony_id, settings=colony.settings)
    unserved = await runs.submit("a1", 1, timeout_s=5000)  # a1 has no run capability: never claimed
    waiting = await runs.submit("s1", 1, timeout_s=5000)  # s1 is suspended: waits, legitimately
    await asyncio.sleep(TICK)
    await colony.beat()  # a1's replica reports after the submit
    report = await colony.check(run_ids=[unserved.run_id, waiting.run_id, "run-neveraccepted"])
    assert found(report) == {
        (ViolationKind.RUN_STUCK.value, unserved.run_id),
        (ViolationKind.RUN_LOST.value, "run-neveraccepted"),
    }
    assert report.checked.runs == 3
    # past its deadline a run is failed on read, not stuck
    assert not (await colony.check(run_ids=[unserved.run_id], now=time.time() + 6000)).violations


async def test_unreadable_registry_record(colony: Colony) -> None:
    await colony.board.write(
        AgentRegistryProtocol.agent_key("junk"),
        {"agent_id": 7},
        tags={AgentRegistryProtocol.index_tag("agent")},
    )
    report = await colony.check()
    assert [v.kind for v in report.violations] == [ViolationKind.RECORD_UNREADABLE]
    assert report.violations[0].subject == AgentRegistryProtocol.agent_key("junk")


async def test_listings_are_capped_and_say_so(colony: Colony) -> None:
    await populate(colony)
    report = await colony.check(max_entries=1)
    assert report.truncated and "agents" in report.truncated_listings
    assert report.checked.agents == 1
    assert "replicas" in report.truncated_listings and report.skipped  # liveness unknown: not guessed
    full = await colony.check()
    assert not full.truncated and full.checked.agents == 3


def test_doctor_command_exit_codes(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"doc{uuid.uuid4().hex[:8]}")
    assert doctor_command(settings, as_json=False) == EXIT_CLEAN
    assert "clean" in capsys.readouterr().out

    async def break_it(agent_id: str = "orphan") -> None:
        client = create_redis(redis_url, settings.blackboard)
        registry = AgentRegistry(
            Blackboard(client, scope_id(BlackboardScope.COLONY, colony_id=settings.colony_id)),
            settings=settings,
        )
        await registry.put(AgentRecord(agent_id=agent_id, state="idle", replica="gone"))
        await client.aclose()

    asyncio.run(break_it())
    assert doctor_command(settings, as_json=True, grace_seconds=0) == EXIT_VIOLATIONS
    out = json.loads(capsys.readouterr().out)
    assert out["clean"] is False
    assert [(v["kind"], v["subject"]) for v in out["violations"]] == [("agent_on_dead_replica", "orphan")]
    assert doctor_command(settings, as_json=False, grace_seconds=3600) == EXIT_CLEAN  # just written
    # nothing found in what was read, but a listing was cut short: not "clean"
    asyncio.run(break_it("orphan-2"))
    assert doctor_command(settings, as_json=False, grace_seconds=3600, max_entries=1) == EXIT_INCOMPLETE


def test_doctor_command_on_keys_it_cannot_read_and_a_grace_that_is_no_number(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: a key of the wrong type was a traceback and exit 1 (`violations`), and
    `--grace nan` reported violations as clean."""
    settings = ColonySettings(redis_url=redis_url, colony_id=f"doc{uuid.uuid4().hex[:8]}")
    with pytest.raises(InvalidArgument, match="grace_seconds"):
        doctor_command(settings, as_json=False, grace_seconds=float("nan"))

    async def spoil() -> None:
        client = create_redis(redis_url, settings.blackboard)
        board = Blackboard(client, scope_id(BlackboardScope.COLONY, colony_id=settings.colony_id))
        record = AgentRecord(agent_id="a", state="idle", replica="r")
        await AgentRegistry(board, settings=settings).put(record)
        keys = [k if isinstance(k, str) else k.decode() for k in await client.keys(f"*{settings.colony_id}*")]
        key = next(k for k in keys if k.endswith("agent:a"))
        await client.delete(key)
        await client.set(key, "a string where a hash was")
        await client.aclose()

    asyncio.run(spoil())
    assert doctor_command(settings, as_json=False) == EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert "is not as Colony writes it" in err and "Traceback" not in err


def test_doctor_command_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    settings = ColonySettings(redis_url="redis://127.0.0.1:1/0")
    settings.blackboard.connect_timeout_seconds = 0.5
    settings.blackboard.op_timeout_seconds = 1.0
    assert doctor_command(settings, as_json=False) == EXIT_UNREACHABLE
    assert "cannot reach Redis" in capsys.readouterr().err
