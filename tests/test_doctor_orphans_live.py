"""`colony doctor` leaves live writes and kept memory alone (docs/operations.md, orphaned agent
keys): a session being started (keys, no lifecycle yet) is aged by its keys' idle time, so it is
not flagged inside the grace period; an ended agent's memory (its state gone with its retention)
is listed apart as retained, not as an orphan, and --prune-orphans leaves it; an import still
writing is neither reported nor pruned, and a prune skips an id written since the check.
Real redis-server."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from test_doctor_orphans import LATER, Colony, colony, planted
from test_effects_once import memory_agent
from test_import_all_or_nothing import document

from colony.agents import LocalAgentRuntime, RunStatus
from colony.blackboard import BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import RunsSettings
from colony.context.sessions import SessionStore, new_session_id, session_scope
from colony.system import transfer
from colony.system.doctor import ViolationKind, check_invariants
from colony.system.doctor_command import doctor_command, prune_orphans
from colony.system.transfer import import_agent

__all__ = ["colony"]  # the fixture, imported from the orphan tests


def flagged(report: Any) -> list[str]:
    return [v.subject for v in report.violations if v.kind is ViolationKind.ORPHANED_AGENT_KEYS]


async def test_a_session_being_started_is_judged_by_its_keys_idle_time(colony: Colony) -> None:
    session_id = new_session_id()
    where = {"tenant_id": colony.settings.tenant_id, "colony_id": colony.settings.colony_id}
    await SessionStore(colony.board.scoped(session_scope(session_id, **where))).create()
    young = await check_invariants(colony.board, colony_id=colony.settings.colony_id, grace_seconds=10.0)
    assert session_id not in flagged(young)  # written 0 s ago: a start in flight
    old = await check_invariants(
        colony.board, colony_id=colony.settings.colony_id, grace_seconds=10.0, now=time.time() + LATER
    )
    assert session_id in flagged(old)  # its agent never came: past the grace, an orphan


async def test_an_ended_agents_memory_is_retained_not_orphaned(colony: Colony) -> None:
    settings = colony.settings.model_copy(update={"runs": RunsSettings(retention_seconds=1)})
    runtime = LocalAgentRuntime(colony.board, colony_id=settings.colony_id, settings=settings)
    agent_id = f"ended-{uuid.uuid4().hex[:6]}"
    fact = [{"action": "remember", "parameters": {"fact": "The user likes tea a lot."}}]
    try:
        await runtime.spawn(memory_agent(agent_id, fact))
        run = await runtime.start_run(agent_id, None)
        done = await runtime.wait_for_run(agent_id, run.run_id, timeout=30)
        assert done.status is RunStatus.SUCCEEDED, done.error
        await runtime.stop(agent_id)
    finally:
        await runtime.shutdown()
    await asyncio.sleep(2.5)  # its retention passes: lifecycle, metadata and state expire
    before = await colony.keys_of(agent_id)
    assert before, "the ended agent kept no memory: nothing to judge"
    report = await check_invariants(
        colony.board, colony_id=settings.colony_id, grace_seconds=5.0, now=time.time() + LATER
    )
    assert agent_id not in flagged(report) and agent_id not in report.orphans
    assert report.retained.get(agent_id) == len(before)
    code = await asyncio.to_thread(
        doctor_command, colony.settings, as_json=True, grace_seconds=0, prune_orphans=True
    )
    assert code in (0, 3) and await colony.keys_of(agent_id) == before  # not a violation, never pruned


async def test_an_import_still_writing_is_not_pruned(
    colony: Colony, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_id = f"slow-{uuid.uuid4().hex[:6]}"
    real, gate, reached = transfer._import_memory, asyncio.Event(), asyncio.Event()

    async def slow(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await gate.wait()  # a large document's memory stage, past the grace period
        return await real(*args, **kwargs)

    monkeypatch.setattr(transfer, "_import_memory", slow)
    task = asyncio.create_task(
        import_agent(colony.board, document(agent_id), settings=colony.settings, registry=colony.registry)
    )
    await reached.wait()
    try:
        report = await check_invariants(
            colony.board, colony_id=colony.settings.colony_id, grace_seconds=0, now=time.time() + 5
        )
        assert agent_id not in report.orphans
        await asyncio.to_thread(
            doctor_command, colony.settings, as_json=True, grace_seconds=0, prune_orphans=True
        )
        assert agent_id not in capsys.readouterr().out
    finally:
        gate.set()
    imported = await task
    assert imported["memory_entries"] == 1 and (await colony.registry.get(agent_id)) is not None
    exported = await transfer.export_agent(colony.board, agent_id, settings=colony.settings)
    assert [e["content"] for s in exported["memory"] for e in s["entries"]] == ["swordfish"]


async def test_a_prune_skips_an_id_written_since_the_check(colony: Colony) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    await planted(colony, ghost)
    report = await check_invariants(
        colony.board, colony_id=colony.settings.colony_id, grace_seconds=5.0, now=time.time() + LATER
    )
    assert ghost in report.orphans and report.orphan_versions[ghost] > 0
    await colony.agent_board(ghost).write(Keys.key("lifecycle"), {"state": "idle", "since": 1.0})
    board = colony.board.scoped(scope_id(BlackboardScope.COLONY, colony_id=colony.settings.colony_id))
    assert await prune_orphans(board, colony.settings, report) == []
    assert len(await colony.keys_of(ghost)) > 0
