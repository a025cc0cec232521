"""The undo of a failed import puts the agent id back exactly as it was (docs/transfer.md, step 4,
"All or nothing"): blocks provisioned for the id, a replaced agent's session tree, run records,
queued run requests and block history, whatever this colony's limits are now (a snapshot of the
id's Redis keys, DUMP + PTTL, restored byte for byte); an agent too large to keep is refused
before any write; a second import of an id being imported is refused (409); a successful
`replace` leaves the document's blocks and memory alone. Real redis-server."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from typing import Any

import pytest
from test_import_all_or_nothing import Target, assert_whole, document, fail_after_memory_write, target

from colony.blackboard.protocol import AgentRunProtocol, BlockProtocol, SessionProtocol
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import AgentStateConflict, BlackboardUnavailable, ImportRejected
from colony.memory.blocks import NewBlock, block_store
from colony.system import transfer

__all__ = ["target"]  # the fixture, imported from the all-or-nothing tests


async def content(redis: Any, key: str) -> Any:
    """A key's whole content by its type (a hash's field order aside)."""
    kind = await redis.type(key)
    reads = {
        "string": lambda: redis.get(key),
        "hash": lambda: redis.hgetall(key),
        "list": lambda: redis.lrange(key, 0, -1),
        "set": lambda: redis.smembers(key),
        "zset": lambda: redis.zrange(key, 0, -1, withscores=True),
        "stream": lambda: redis.xrange(key),
    }
    return kind, await reads[kind]()


async def key_dumps(target: Target, agent_id: str) -> dict[str, tuple[Any, bool]]:
    """Every Redis key naming the agent id and every key of the blocks it owns, with its whole
    content and whether it expires."""
    redis = target.board.redis
    keys = [str(k) async for k in redis.scan_iter(match=f"*{agent_id}*", count=1000)]
    for info in await block_store(redis, target.settings).list_owned(agent_id):
        keys += [BlockProtocol.key(info.block_id, part) for part in BlockProtocol.PARTS]
    found = {}
    for key in sorted(set(keys)):
        if await redis.exists(key):
            found[key] = (await content(redis, key), await redis.pttl(key) > 0)
    return found


async def test_an_import_into_a_provisioned_id_is_refused_without_replace(target: Target) -> None:
    agent_id = f"prov-{uuid.uuid4().hex[:6]}"
    store = block_store(target.board.redis, target.settings)
    await store.create(agent_id, NewBlock(label="briefing", content="operator-provisioned text"))
    before = await key_dumps(target, agent_id)
    with pytest.raises(AgentStateConflict, match=r"briefing.*replace=true"):
        await target.load(document(agent_id))  # its labels (notes, journal) do not collide
    assert await key_dumps(target, agent_id) == before


async def test_a_failed_replace_of_a_provisioned_id_gives_its_blocks_back(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id = f"prov-{uuid.uuid4().hex[:6]}"
    store = block_store(target.board.redis, target.settings)
    await store.create(agent_id, NewBlock(label="briefing", content="operator-provisioned text"))
    await store.append(agent_id, "briefing", "a second version")
    await store.create(agent_id, NewBlock(label="notes", content="provisioned notes"))  # the doc's label
    before = await key_dumps(target, agent_id)
    with monkeypatch.context() as patched:
        fail_after_memory_write(patched)
        with pytest.raises(BlackboardUnavailable):
            await target.load(document(agent_id), replace=True)
    assert await key_dumps(target, agent_id) == before  # blocks, their history, the index: as they were
    assert (await store.read(agent_id, "briefing", owner=agent_id)).content.startswith("operator")
    imported = await target.load(document(agent_id), replace=True)  # and a replace that lands
    assert imported["blocks"] == 2
    assert sorted(b.label for b in await store.list_owned(agent_id)) == ["journal", "notes"]


async def test_a_failed_replace_puts_back_what_no_export_carries(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's conversation tree, past run records, queued run requests, block history."""
    agent_id = f"rep-{uuid.uuid4().hex[:6]}"
    await target.load(document(agent_id))
    board = transfer.agent_board(target.board, agent_id, "default", target.settings.colony_id)
    await board.write(SessionProtocol.tree_key(), {"branches": {"main": ["m1"]}})
    await board.write(SessionProtocol.message_key("m1"), {"role": "user", "content": "hello"})
    old_run = {"run_id": "old-run", "status": "completed"}
    await board.write(Keys.run_key("old-run"), old_run, ttl_seconds=3600)
    runs = board.scoped(AgentRunProtocol.namespaced_scope(board.scope_id, "runs"))
    await runs.write(AgentRunProtocol.request_key("req1"), {"request_id": "req1", "input": "queued"})
    await block_store(target.board.redis, target.settings).append(agent_id, "notes", " more")
    before = await key_dumps(target, agent_id)
    with monkeypatch.context() as patched:
        fail_after_memory_write(patched)
        with pytest.raises(BlackboardUnavailable):
            await target.load(document(agent_id, note="second", blocks=3), replace=True)
    assert await key_dumps(target, agent_id) == before


async def test_the_undo_does_not_depend_on_todays_limits(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old agent no longer fits this colony's block limits: it is still put back."""
    agent_id = f"fit-{uuid.uuid4().hex[:6]}"
    await target.load(document(agent_id))  # its journal block has char_limit 2000
    before = await key_dumps(target, agent_id)
    stricter = target.settings.model_copy(
        update={"blocks": target.settings.blocks.model_copy(update={"max_char_limit": 1000})}
    )
    doc = document(agent_id, note="second")
    doc["blocks"][1]["char_limit"] = 500
    with monkeypatch.context() as patched:
        fail_after_memory_write(patched)
        with pytest.raises(BlackboardUnavailable):
            await transfer.import_agent(
                target.board, doc, settings=stricter, registry=target.registry, replace=True
            )
    assert await key_dumps(target, agent_id) == before
    await assert_whole(target, agent_id)


async def test_an_agent_too_large_to_keep_is_refused_before_any_write(target: Target) -> None:
    agent_id = f"big-{uuid.uuid4().hex[:6]}"
    old = document(agent_id)
    entries = [{"entry_id": f"m{n}", "content": secrets.token_hex(750)} for n in range(20)]  # no LZF gain
    old["memory"] = [{"namespace": "memory-working", "entries": entries}]
    await target.load(old)
    before = await key_dumps(target, agent_id)
    doc = document(agent_id, note="second")
    small = target.settings.model_copy(
        update={"context": target.settings.context.model_copy(update={"max_export_bytes": 20_000})}
    )
    with pytest.raises(ImportRejected, match="max_export_bytes"):
        await transfer.import_agent(
            target.board, doc, settings=small, registry=target.registry, replace=True
        )
    assert await key_dumps(target, agent_id) == before


async def test_a_second_import_of_an_id_being_imported_is_refused(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_id = f"race-{uuid.uuid4().hex[:6]}"
    doc_a = document(agent_id, blocks=3, note="from A")
    doc_a["memory"] = [
        {"namespace": "memory-working", "entries": [{"entry_id": "mA", "content": "A's secret"}]}
    ]
    real, gate, reached = transfer._import_memory, asyncio.Event(), asyncio.Event()

    async def paused(*args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():  # A's memory stage waits; another import's would not
            reached.set()
            await gate.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(transfer, "_import_memory", paused)
    task_a = asyncio.create_task(target.load(doc_a))
    await reached.wait()
    try:
        with pytest.raises(AgentStateConflict, match="being imported"):
            await target.load(document(agent_id, note="from B"), replace=True)
    finally:
        gate.set()
    await task_a
    exported = await transfer.export_agent(target.board, agent_id, settings=target.settings)
    assert sorted(b["label"] for b in exported["blocks"]) == ["b000", "journal", "notes"]
    assert [e["content"] for s in exported["memory"] for e in s["entries"]] == ["A's secret"]


async def test_a_replace_leaves_the_documents_blocks_and_memory_alone(target: Target) -> None:
    agent_id = f"keep-{uuid.uuid4().hex[:6]}"
    old = document(agent_id, blocks=3)  # notes, journal, b000
    old["memory"] = [
        {"namespace": "memory-working", "entries": [{"entry_id": "old1", "content": "old secret"}]},
        {"namespace": "memory-ltm-semantic", "entries": [{"entry_id": "old2", "content": "x"}]},
    ]
    await target.load(old)
    await target.load(document(agent_id, note="new"), replace=True)  # notes, journal; m1 only
    exported = await transfer.export_agent(target.board, agent_id, settings=target.settings)
    assert sorted(b["label"] for b in exported["blocks"]) == ["journal", "notes"]
    assert [e["content"] for s in exported["memory"] for e in s["entries"]] == ["swordfish"]
    await assert_whole(target, agent_id, note="new")
