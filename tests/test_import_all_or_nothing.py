"""An agent import lands whole or leaves no key (issue 34, deliverable 4; docs/transfer.md step 4):
a failure at the block stage, at the memory stage, between stages or at registration, and a
document with more blocks than an agent may own, leave no Redis key of the agent id (a SCAN of the
real redis-server), the agent unknown (404) and a clean import of the same document then succeeds.
A failed `replace` puts back the agent it overwrote. Duplicate block labels, unknown fields and junk
state are refused before anything is written."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.blackboard import Blackboard, BlackboardScope, create_redis, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ColonySettings
from colony.errors import AgentNotFound, BlackboardUnavailable, BlockLimitExceeded, ImportRejected
from colony.memory.blocks import block_store
from colony.memory.blocks.store import BlockStore
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.system import transfer
from colony.system.registry import AgentRegistry
from colony.system.transfer import export_agent, import_agent

STEPS = [{"action": "add", "parameters": {"amount": 1}}]


@dataclass
class Target:
    settings: ColonySettings
    board: Blackboard
    registry: AgentRegistry

    async def load(self, document: dict[str, Any], **options: Any) -> dict[str, Any]:
        return await import_agent(
            self.board, document, settings=self.settings, registry=self.registry, **options
        )


@pytest.fixture
async def target(redis_url: str) -> AsyncIterator[Target]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"aon{uuid.uuid4().hex[:10]}")
    client = create_redis(redis_url, settings.blackboard)
    board = Blackboard(client, "bootstrap", settings=settings.blackboard)
    colony = board.scoped(scope_id(BlackboardScope.COLONY, colony_id=settings.colony_id))
    yield Target(settings, board, AgentRegistry(colony, settings=settings))
    await client.aclose()


def document(agent_id: str, *, blocks: int = 2, note: str = "the sky is green here") -> dict[str, Any]:
    """An export document of a counter agent with a working block, a log block with one entry,
    `blocks - 2` more working blocks, a memory entry, policy and capability state."""
    blueprint = counter_blueprint(agent_id, STEPS)
    extra = [{"label": f"b{n:03d}", "char_limit": 100, "content": f"block {n}"} for n in range(blocks - 2)]
    return {
        "format": "colony-agent-export",
        "version": 1,
        "exported_at": time.time(),
        "source": {"tenant_id": "default", "colony_id": "elsewhere"},
        "agent_id": agent_id,
        "state": "idle",
        "blueprint": {"catalog": None, "signed": blueprint.to_text()},
        "metadata": blueprint.metadata.model_dump(mode="json"),
        "policy_state": {"position": 1},
        "capabilities": {"CounterCapability": {"state": {"total": 3}}},
        "blocks": [
            {"label": "notes", "char_limit": 200, "content": note},
            {"label": "journal", "char_limit": 2000, "block_type": "log", "entries": [{"event": "begun"}]},
            *extra,
        ],
        "memory": [{"namespace": "memory-working", "entries": [{"entry_id": "m1", "content": "swordfish"}]}],
    }


async def leftovers(target: Target, agent_id: str) -> list[str]:
    """Every Redis key naming the agent id, and every block it owns (block keys are digests: found
    by their owner field), by a SCAN of the whole keyspace."""
    redis = target.board.redis
    found = [str(k) async for k in redis.scan_iter(match=f"*{agent_id}*", count=1000)]
    async for key in redis.scan_iter(match="colony:blk:*:meta", count=1000):
        if await redis.hget(key, "owner") == agent_id:
            found.append(str(key))
    return sorted(found)


async def assert_gone(target: Target, agent_id: str) -> None:
    assert await leftovers(target, agent_id) == []
    assert await target.registry.get(agent_id) is None
    with pytest.raises(AgentNotFound):  # the API's 404
        await export_agent(target.board, agent_id, settings=target.settings)


async def assert_whole(target: Target, agent_id: str, note: str = "the sky is green here") -> None:
    record = await target.registry.get(agent_id)
    assert record is not None and record.state == "suspended"
    exported = await export_agent(target.board, agent_id, settings=target.settings)
    assert exported["blueprint"]["signed"] and exported["policy_state"] == {"position": 1}
    blocks = {b["label"]: b for b in exported["blocks"]}
    assert blocks["notes"]["content"].strip() == note
    assert [e["event"] for e in blocks["journal"]["entries"]] == ["begun"]
    assert [e["content"] for s in exported["memory"] for e in s["entries"]] == ["swordfish"]


def fail_log_append(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block stage fails after a block was created: the log block refuses its entry."""

    async def refuse(self: BlockStore, *args: Any, **kwargs: Any) -> Any:
        raise BlockLimitExceeded("the log block is full (injected)")

    monkeypatch.setattr(BlockStore, "log_append", refuse)


def fail_after_memory_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory stage fails after its entries were written (Redis went away before the answer),
    once: what comes after (an undo) finds Redis back."""
    write_many, calls = MemoryStore.write_many, []

    async def written_then_lost(self: MemoryStore, *args: Any, **kwargs: Any) -> Any:
        outcomes = await write_many(self, *args, **kwargs)
        calls.append(args)
        if len(calls) == 1:
            raise BlackboardUnavailable("write_many", "redis://injected")
        return outcomes

    monkeypatch.setattr(MemoryStore, "write_many", written_then_lost)


def fail_between_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process loses Redis after the blocks were written, before the memory stage begins."""

    async def lost(*args: Any, **kwargs: Any) -> Any:
        raise BlackboardUnavailable("write", "redis://injected")

    monkeypatch.setattr(transfer, "_import_memory", lost)


def fail_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything is written but the registry record is not."""

    async def lost(self: AgentRegistry, *args: Any, **kwargs: Any) -> Any:
        raise BlackboardUnavailable("put", "redis://injected")

    monkeypatch.setattr(AgentRegistry, "put", lost)


FAILURES = {
    "block_stage": (fail_log_append, ImportRejected),
    "memory_stage": (fail_after_memory_write, BlackboardUnavailable),
    "between_stages": (fail_between_stages, BlackboardUnavailable),
    "registration": (fail_registration, BlackboardUnavailable),
}


@pytest.mark.parametrize("stage", sorted(FAILURES))
async def test_a_failed_import_leaves_no_key_and_a_clean_import_then_succeeds(
    target: Target, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    agent_id = f"aon-{stage.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    inject, error = FAILURES[stage]
    with monkeypatch.context() as patched:
        inject(patched)
        with pytest.raises(error):
            await target.load(document(agent_id))
    await assert_gone(target, agent_id)
    imported = await target.load(document(agent_id))  # not 409 "already exists"
    assert imported["replaced"] is False and imported["memory_entries"] == 1
    await assert_whole(target, agent_id)


async def test_more_blocks_than_an_agent_may_own_is_refused_before_any_write(target: Target) -> None:
    agent_id = f"aon-many-{uuid.uuid4().hex[:8]}"
    cap = target.settings.blocks.max_blocks_per_owner
    with pytest.raises(ImportRejected, match=r"blocks.*max_blocks_per_owner"):
        await target.load(document(agent_id, blocks=cap + 1))
    await assert_gone(target, agent_id)
    imported = await target.load(document(agent_id, blocks=cap))
    assert imported["blocks"] == cap
    assert len(await block_store(target.board.redis, target.settings).list_owned(agent_id)) == cap


async def test_a_failed_replace_puts_back_the_agent_it_overwrote(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id = f"aon-replace-{uuid.uuid4().hex[:8]}"
    await target.load(document(agent_id, note="the first copy"))
    board = transfer.agent_board(target.board, agent_id, "default", target.settings.colony_id)
    lifecycle = await board.read(Keys.key("lifecycle"))
    record = await target.registry.get(agent_id)
    with monkeypatch.context() as patched:
        fail_after_memory_write(patched)
        with pytest.raises(BlackboardUnavailable):
            await target.load(document(agent_id, note="the second copy"), replace=True)
    await assert_whole(target, agent_id, note="the first copy")
    assert (await board.read(Keys.key("lifecycle"))).value == lifecycle.value
    assert await target.registry.get(agent_id) == record
    scope = MemoryScope.agent_working(agent_id, colony_id=target.settings.colony_id)
    assert [e.entry_id for e in await MemoryStore(target.board, target.settings).entries(scope)] == ["m1"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"blocks": [{"label": "notes", "char_limit": 10}, {"label": "notes", "char_limit": 20}]}, "blocks"),
        ({"memory": [{"namespace": "memory-working"}, {"namespace": "memory-working"}]}, "memory"),
        ({"policy_state": {"junk": "x" * (9 * 1024 * 1024)}}, "policy_state"),
        ({"context": {"head": {"context_total": 0, "junk": 1}}}, "context.head.junk"),
    ],
)
async def test_junk_is_refused_before_any_write(target: Target, change: dict[str, Any], field: str) -> None:
    agent_id = f"aon-junk-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ImportRejected, match=field):
        await target.load({**document(agent_id), **change})
    await assert_gone(target, agent_id)


async def test_unknown_metadata_fields_are_refused(target: Target) -> None:
    agent_id = f"aon-meta-{uuid.uuid4().hex[:8]}"
    doc = document(agent_id)
    doc["metadata"] = {**doc["metadata"], "smuggled": "x" * 1000}
    with pytest.raises(ImportRejected, match=r"metadata\.smuggled"):
        await target.load(doc)
    await assert_gone(target, agent_id)


async def test_the_import_route_refuses_duplicate_labels_and_junk_with_422_naming_the_field() -> None:
    """Over HTTP, with and without `?catalog=`: the body is validated before any route code runs."""
    import httpx

    from colony.api.app import create_app

    async def no_services() -> object:
        raise BlackboardUnavailable("services", "redis://none")  # never reached: 422 comes first

    app = create_app(no_services, token="t")
    headers = {"authorization": "Bearer t"}
    doc = document("dup")
    cases = {
        "blocks": {**doc, "blocks": [doc["blocks"][0], doc["blocks"][0]]},
        "policy_state": {**doc, "policy_state": {"junk": "x" * (9 * 1024 * 1024)}},
        "smuggled": {**doc, "metadata": {**doc["metadata"], "smuggled": 1}},
    }
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://colony") as client:
        for field, body in cases.items():
            for query in ("", "?catalog=stepper"):
                answer = await client.post(f"/v1/agents/dup/import{query}", json=body, headers=headers)
                assert answer.status_code == 422, (field, query, answer.text[:300])
                assert field in answer.json()["error"]["message"], answer.text[:300]
        too_big = {**doc, "policy_state": {"junk": "x" * (17 * 1024 * 1024)}}
        answer = await client.post("/v1/agents/dup/import", json=too_big, headers=headers)
        assert answer.status_code == 413 and "16777216" in answer.text
