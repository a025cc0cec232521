"""No keyspace scans on hot paths: runs, the registry, replica heartbeats, process publications and
the page table are read through index sets. Checked with the server's own command counters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentRegistryProtocol, VcmProtocol
from colony.config import ColonySettings, VcmSettings, load_settings
from colony.errors import PageNotResident
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.runs import RunService
from colony.vcm import PageTable
from colony.vcm.pages import PageSource


@pytest.fixture
async def colony(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[ReplicaHost, RunService, PageTable]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"idx{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-i", engine=ScriptedEngine(["ok"]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    assert host.registry is not None
    runs = RunService(bb, host.registry, settings=settings)
    pages = PageTable(bb, settings=settings)
    yield host, runs, pages
    await host.close()


async def scans(bb: Blackboard) -> int:
    stats = await bb.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("scan", "keys"))


async def test_hot_paths_issue_no_scan(colony, bb: Blackboard) -> None:
    host, runs, pages = colony
    for i in range(200):  # unrelated keys in the same Redis
        await bb.redis.set(f"unrelated:{uuid.uuid4().hex}:{i}", "x")
    await bb.redis.config_resetstat()
    assert await scans(bb) == 0
    await host.ensure_agent(echo_blueprint("second"))  # a fresh agent's run server starts
    record = await runs.submit("echo", {"hello": 1})
    async with asyncio.timeout(10):
        events = [e async for _, e in runs.events(record.run_id)]
    assert events[-1]["event_type"] == "completed"
    assert (await runs.get(record.run_id)).status == "succeeded"
    agents = await host.registry.list()
    assert {"echo", "second"} <= {a.agent_id for a in agents}
    assert {a.agent_id for a in await host.registry.list(replica="replica-i")} >= {"echo", "second"}
    assert await host.registry.list(state="suspended") == []
    assert [r["replica_id"] for r in await host.registry.replicas()] == ["replica-i"]
    assert any(p.get("process") for p in await host.registry.publications())
    await pages.reconcile("replica-i", [], [])
    assert await pages.pages() == [] and await pages.sources() == []
    await host.stop_agent("second")
    assert await scans(bb) == 0
    # the admin/debug query without a tag still scans (and is the only thing that does)
    await bb.query("*")
    assert await scans(bb) > 0


async def test_registry_lists_through_indexes_and_forgets_removed(colony) -> None:
    host, _, _ = colony
    registry = host.registry
    await registry.put(AgentRecord(agent_id="idle-one", state="idle", replica="replica-x"))
    await registry.put(AgentRecord(agent_id="sus-one", state="suspended"))
    assert [r.agent_id for r in await registry.list(replica="replica-x")] == ["idle-one"]
    assert [r.agent_id for r in await registry.list(state="suspended")] == ["sus-one"]
    await registry.put(AgentRecord(agent_id="sus-one", state="idle", replica="replica-x"))
    assert await registry.list(state="suspended") == []
    assert [r.agent_id for r in await registry.list(replica="replica-x")] == ["idle-one", "sus-one"]
    assert await registry.remove("idle-one")
    assert "idle-one" not in {r.agent_id for r in await registry.list()}


async def test_expired_heartbeats_leave_the_replica_index(colony, bb: Blackboard) -> None:
    host, _, _ = colony
    registry = host.registry
    for i in range(12):  # (one write sweeps up to 16 due members)
        await registry.beat(f"gone-{i}", {"replica_id": f"gone-{i}"}, ttl_seconds=0.2)
    await asyncio.sleep(0.4)
    await registry.beat("live", {"replica_id": "live"}, ttl_seconds=30)  # its write sweeps the others
    index = registry.board.keyspace.tag_key(AgentRegistryProtocol.index_tag("replica"))
    members = await bb.redis.smembers(index)
    assert not [m for m in members if "gone-" in m]
    assert "live" in {r["replica_id"] for r in await registry.replicas()}


async def test_records_written_before_the_index_tag_are_listed(colony) -> None:
    host, _, _ = colony
    board = host.registry.board
    old = AgentRecord(agent_id="older", state="suspended")
    await board.write(AgentRegistryProtocol.agent_key("older"), old, tags={"state:suspended"})
    fresh = type(host.registry)(board, settings=load_settings())  # a new process's registry
    assert "older" in {r.agent_id for r in await fresh.list()}
    assert "index:agent" in (await board.read(AgentRegistryProtocol.agent_key("older"))).tags


async def test_page_table_lists_through_its_index(colony, bb: Blackboard, tmp_path) -> None:
    _, _, table = colony
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(3):
        (folder / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    source = await table.map_source(PageSource(folder, allowed_roots=[tmp_path], page_tokens=64))
    assert len(source.page_ids) >= 3
    # a page record from before the index tag: mapping the source again tags it
    first = VcmProtocol.page_key(source.page_ids[0])
    entry = await table.board.read(first)
    await table.board.write(first, entry.value, tags=set())
    assert source.page_ids[0] not in {p.page_id for p in await table.pages()}
    await bb.redis.config_resetstat()
    await table.map_source(PageSource(folder, allowed_roots=[tmp_path], page_tokens=64))
    assert sorted(p.page_id for p in await table.pages()) == sorted(source.page_ids)
    assert [s.source_id for s in await table.sources()] == [source.source_id]
    await table.reconcile("replica-i", source.page_ids[:2])
    assert [p.page_id for p in await table.pages(replica="replica-i")] == sorted(source.page_ids[:2])
    assert sorted(p.page_id for p in await table.pages()) == sorted(source.page_ids)
    assert await scans(bb) == 0


async def test_page_table_entries_expire_unless_mapped_held_or_used(
    bb: Blackboard, redis_url, tmp_path
) -> None:
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"pgr{uuid.uuid4().hex[:8]}",
        vcm=VcmSettings(page_retention_seconds=2.0),
    )
    table = PageTable(bb, colony_id=settings.colony_id, settings=settings)
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(3):
        (folder / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    source = await table.map_source(PageSource(folder, allowed_roots=[tmp_path], page_tokens=64))
    used, *idle = source.page_ids
    keys = [VcmProtocol.source_key(source.source_id)]
    keys += [VcmProtocol.page_key(p) for p in source.page_ids] + [
        VcmProtocol.content_key(p) for p in source.page_ids
    ]
    ttls = [await bb.redis.pttl(table.board.keyspace.entry_key(k)) for k in keys]
    assert all(0 < t <= 2_000 for t in ttls), ttls  # nothing of a mapped tree is permanent
    await table.reconcile("replica-p", [used, idle[0]])  # held by a replica: refreshed, not persisted
    assert 0 < await bb.redis.pttl(table.board.keyspace.entry_key(VcmProtocol.page_key(idle[0]))) <= 2_000
    await asyncio.sleep(1.2)
    await table.touch([used])  # used: the page and its text start their retention again
    await asyncio.sleep(1.2)
    assert [p.page_id for p in await table.pages()] == [used]
    assert (await table.content(used)).text
    assert await table.sources() == []
    with pytest.raises(PageNotResident):
        await table.content(idle[-1])
    # mapping the tree again brings it all back, each entry with its retention
    again = await table.map_source(PageSource(folder, allowed_roots=[tmp_path], page_tokens=64))
    assert sorted(p.page_id for p in await table.pages()) == sorted(again.page_ids)
    assert 1_000 < await bb.redis.pttl(table.board.keyspace.entry_key(VcmProtocol.page_key(used))) <= 2_000
