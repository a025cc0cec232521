"""`colony doctor` reports orphaned agent keys (issue 34, deliverable 4): keys of an agent id that no
registry record names, left by a write cut off half way (here: an import whose process died before
its undo ran, and keys planted through the real stores), with their count and the ids, and says how
to remove them; `colony doctor --prune-orphans` removes exactly those and leaves registered agents,
young writes (within the grace period) and expiring state alone. Real redis-server."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from test_import_all_or_nothing import document, fail_after_memory_write

from colony.blackboard import Blackboard, BlackboardScope, create_redis, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ColonySettings
from colony.errors import AgentStateConflict, BlackboardUnavailable
from colony.memory.blocks import NewBlock, block_store
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import NewMemory
from colony.system import import_write, transfer
from colony.system.doctor import ViolationKind, check_invariants
from colony.system.doctor_command import EXIT_CLEAN, EXIT_VIOLATIONS, doctor_command
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.transfer import import_agent

LATER = 1000.0  # judge ages this far in the future: every write is past the grace period


@dataclass
class Colony:
    settings: ColonySettings
    board: Blackboard
    registry: AgentRegistry

    def agent_board(self, agent_id: str) -> Blackboard:
        return self.board.scoped(
            scope_id(BlackboardScope.AGENT, colony_id=self.settings.colony_id, agent_id=agent_id)
        )

    async def keys_of(self, agent_id: str) -> list[str]:
        """The agent id's blackboard keys and the blocks it owns (what the doctor counts)."""
        redis = self.board.redis
        found = [str(k) async for k in redis.scan_iter(match=f"colony:bb:*{agent_id}*", count=1000)]
        owned = await block_store(redis, self.settings).list_owned(agent_id)
        return sorted(found) + [b.block_id for b in owned]

    async def gone(self, agent_id: str) -> bool:
        """No Redis key names the agent id (a SCAN for its name) and it owns no block."""
        redis = self.board.redis
        named = [str(k) async for k in redis.scan_iter(match=f"*{agent_id}*", count=1000)]
        return not named and not await block_store(redis, self.settings).list_owned(agent_id)


@pytest.fixture
async def colony(redis_url: str) -> AsyncIterator[Colony]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"orph{uuid.uuid4().hex[:8]}")
    client = create_redis(redis_url, settings.blackboard)
    board = Blackboard(client, "bootstrap", settings=settings.blackboard)
    colony_board = board.scoped(scope_id(BlackboardScope.COLONY, colony_id=settings.colony_id))
    yield Colony(settings, board, AgentRegistry(colony_board, settings=settings))
    await client.aclose()


async def crashed_import(colony: Colony, agent_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import whose process died at its memory stage, its lease since passed: its undo never
    ran (the lease is 0 here: its mark on the lifecycle says it was over at once)."""

    async def died(*args: Any, **kwargs: Any) -> None:
        return None

    with monkeypatch.context() as patched:
        fail_after_memory_write(patched)
        patched.setattr(transfer, "_undo", died)
        patched.setattr(import_write, "IMPORT_LEASE_SECONDS", 0.0)
        with pytest.raises(BlackboardUnavailable):
            await import_agent(
                colony.board, document(agent_id), settings=colony.settings, registry=colony.registry
            )


async def planted(colony: Colony, agent_id: str) -> None:
    """State, memory and a block of an agent id nobody registered (a spawn cut off before its
    registration), written through the real stores."""
    await colony.agent_board(agent_id).write(Keys.key("lifecycle"), {"state": "idle", "since": 0.0})
    scope = MemoryScope.agent_working(agent_id, colony_id=colony.settings.colony_id)
    await MemoryStore(colony.board, colony.settings).write(scope, NewMemory(content="planted memory"))
    await block_store(colony.board.redis, colony.settings).create(
        agent_id, NewBlock(label="notes", content="planted text")
    )


async def test_doctor_reports_and_prunes_orphaned_agent_keys(
    colony: Colony, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed, ghost, kept = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("crashed", "ghost", "kept"))
    await crashed_import(colony, crashed, monkeypatch)
    with pytest.raises(AgentStateConflict, match="already exists"):  # what the orphan keys cause
        await import_agent(
            colony.board, document(crashed), settings=colony.settings, registry=colony.registry
        )
    await planted(colony, ghost)
    await planted(colony, kept)
    await colony.registry.put(AgentRecord(agent_id=kept, state="suspended"))  # a registered agent
    expected = {crashed: len(await colony.keys_of(crashed)), ghost: len(await colony.keys_of(ghost))}
    kept_keys = await colony.keys_of(kept)
    assert expected[crashed] > 10 and expected[ghost] > 3

    report = await check_invariants(
        colony.board, colony_id=colony.settings.colony_id, grace_seconds=5.0, now=time.time() + LATER
    )
    orphaned = {
        v.subject: v.message for v in report.violations if v.kind is ViolationKind.ORPHANED_AGENT_KEYS
    }
    assert sorted(orphaned) == sorted(expected)
    assert report.orphans == expected  # keys and blocks, by id
    assert "1 block(s)" in orphaned[ghost] and "--prune-orphans" in orphaned[ghost]
    # right now, they are younger than the grace period: a write in flight, not reported yet
    young = await check_invariants(colony.board, colony_id=colony.settings.colony_id, grace_seconds=3600)
    assert young.orphans == {}

    code = await asyncio.to_thread(doctor_command, colony.settings, as_json=False, grace_seconds=0)
    assert code == EXIT_VIOLATIONS
    out = capsys.readouterr().out
    assert "orphaned_agent_keys 2" in out and crashed in out and ghost in out and "--prune-orphans" in out

    code = await asyncio.to_thread(
        doctor_command, colony.settings, as_json=True, grace_seconds=0, prune_orphans=True
    )
    shown = json.loads(capsys.readouterr().out)
    assert code == EXIT_CLEAN and shown["clean"] and shown["orphans"] == {}
    assert sorted(p.split(":")[0] for p in shown["pruned"]) == sorted(expected)
    assert await colony.gone(crashed) and await colony.gone(ghost)
    assert await colony.keys_of(kept) == kept_keys  # the registered agent keeps its keys
    # and the id the crash held can be imported again
    imported = await import_agent(
        colony.board, document(crashed), settings=colony.settings, registry=colony.registry
    )
    assert imported["replaced"] is False


async def test_expiring_state_of_an_ended_agent_is_no_orphan(colony: Colony) -> None:
    ended = f"ended-{uuid.uuid4().hex[:6]}"
    await planted(colony, ended)
    await colony.agent_board(ended).expire([Keys.key("lifecycle")], 3600)  # its retention runs
    report = await check_invariants(
        colony.board, colony_id=colony.settings.colony_id, grace_seconds=5.0, now=time.time() + LATER
    )
    assert report.orphans == {} and report.clean
