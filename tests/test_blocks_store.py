"""The block store on a real redis-server: versions, rollback, undo, access levels, concurrency,
compaction with shallow snapshots, and refusals that change nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from colony.blackboard import create_redis
from colony.blackboard.protocol import BlockProtocol
from colony.config import ColonySettings
from colony.errors import (
    BlockAccessDenied,
    BlockEditRejected,
    BlockExists,
    BlockNotFound,
    BlockVersionConflict,
    InvalidArgument,
)
from colony.memory.blocks.document import as_lines
from colony.memory.blocks.store import COLONY, BlockStore
from colony.memory.blocks.types import OPERATOR, BlockType, NewBlock, SharedAccess


def _settings(**blocks: object) -> ColonySettings:
    return ColonySettings(colony_id=f"c{uuid.uuid4().hex[:10]}", blocks=blocks)  # type: ignore[arg-type]


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[BlockStore]:
    settings = _settings()
    client = create_redis(redis_url, settings.blackboard)
    yield BlockStore(client, settings)
    await client.aclose()


async def test_three_edits_give_four_versions_view_and_rollback(store: BlockStore) -> None:
    await store.create("alice", NewBlock(label="notes", content="v1 text", block_type=BlockType.CORE))
    await store.append("alice", "notes", "second", via="tool")
    await store.replace("bob-not-owner" if False else "alice", "notes", "v1", "V1")
    await store.set_content("alice", "notes", "rewritten", via="http")
    history = await store.history("alice", "notes")
    assert [v.version for v in history.versions] == [1, 2, 3, 4]
    assert [v.op for v in history.versions] == ["create", "append", "replace", "rethink"]
    assert all(v.author for v in history.versions)
    old = await store.read("alice", "notes", version=1)
    assert old.content == "v1 text\n" and not old.head  # content is lines: a final break
    head = await store.read("alice", "notes")
    assert head.content == "rewritten\n" and head.version == 4
    await store.rollback("alice", "notes", 1)
    assert (await store.read("alice", "notes")).content == "v1 text\n"
    history = await store.history("alice", "notes")
    assert len(history.versions) == 5 and history.versions[-1].op == "rollback"


async def test_refused_edits_change_nothing(store: BlockStore) -> None:
    await store.create("alice", NewBlock(label="human", content="abc", char_limit=10))
    before = await store.history("alice", "human")
    with pytest.raises(BlockEditRejected, match=r"would have .*/10"):
        await store.append("alice", "human", "0123456789")
    with pytest.raises(BlockEditRejected, match="does not occur"):
        await store.replace("alice", "human", "zzz", "y")
    await store.append("alice", "human", "ab")
    with pytest.raises(BlockEditRejected, match="occurs 2 times"):
        await store.replace("alice", "human", "ab", "y")
    with pytest.raises(BlockVersionConflict):
        await store.append("alice", "human", "x", base_version=1)
    after = await store.history("alice", "human")
    assert len(after.versions) == len(before.versions) + 1
    assert (await store.read("alice", "human")).content == "abc\nab\n"


async def test_access_levels_are_enforced(store: BlockStore) -> None:
    await store.create("owner", NewBlock(label="board", content="task 1"))
    await store.share(OPERATOR, "owner", "board", "reader", SharedAccess.READ_ONLY)
    await store.share("owner", "owner", "board", "adder", SharedAccess.APPEND_ONLY)
    await store.share(OPERATOR, "owner", "board", "writer", SharedAccess.READ_WRITE)
    head = (await store.history("owner", "board")).head
    with pytest.raises(BlockAccessDenied, match="read-only"):
        await store.append("reader", "board", "x")
    with pytest.raises(BlockAccessDenied):
        await store.set_content("adder", "board", "task")
    with pytest.raises(BlockAccessDenied):
        await store.replace("adder", "board", "task 1", "task one")
    await store.append("adder", "board", "task 2")
    await store.set_content("adder", "board", "task 1\ntask 2\ntask 3\n")  # only adds: allowed
    await store.set_content("writer", "board", "all done")
    assert (await store.read("reader", "board")).content == "all done\n"
    assert (await store.history("owner", "board")).head == head + 3
    with pytest.raises(BlockNotFound):
        await store.read("stranger", "board")
    with pytest.raises(BlockAccessDenied, match="no access"):
        await store.read("stranger", "board", owner="owner")
    with pytest.raises(BlockAccessDenied):
        await store.share("stranger", "owner", "board", "stranger", SharedAccess.READ_WRITE)
    await store.unshare(OPERATOR, "owner", "board", "writer")
    with pytest.raises(BlockNotFound):
        await store.read("writer", "board")


async def test_colony_blocks_reach_every_agent(store: BlockStore) -> None:
    await store.create_colony_block(
        NewBlock(label="organization", content="Be honest.", block_type=BlockType.CORE),
        SharedAccess.READ_ONLY,
    )
    view = await store.read("spawned-later", "organization")
    assert view.content == "Be honest.\n" and view.access is SharedAccess.READ_ONLY
    with pytest.raises(BlockAccessDenied):
        await store.append("spawned-later", "organization", "x")
    await store.append(OPERATOR, "organization", "Be kind.", owner=COLONY)
    assert [i.label for i, _ in await store.list_for("anyone")] == ["organization"]


async def test_labels_are_unique_per_owner_and_view(store: BlockStore) -> None:
    await store.create("a", NewBlock(label="human"))
    with pytest.raises(BlockExists):
        await store.create("a", NewBlock(label="human"))
    await store.create("b", NewBlock(label="human"))
    await store.create("c", NewBlock(label="board"))
    with pytest.raises(BlockExists):
        await store.share(OPERATOR, "a", "human", "b", SharedAccess.READ_ONLY)
    await store.share(OPERATOR, "c", "board", "a", SharedAccess.READ_ONLY)
    with pytest.raises(BlockExists):
        await store.create("a", NewBlock(label="board"))
    with pytest.raises(InvalidArgument):
        await store.create("a", NewBlock.model_construct(label="../etc", content=""))
    with pytest.raises(InvalidArgument):
        await store.create("_colony", NewBlock(label="x"))


async def test_concurrent_appends_from_separate_processes_all_survive(redis_url: str) -> None:
    settings = _settings(compact_after_updates=16)
    clients = [create_redis(redis_url, settings.blackboard) for _ in range(2)]
    stores = [BlockStore(c, settings) for c in clients]  # two caches: as two replicas
    await stores[0].create("owner", NewBlock(label="board", char_limit=50_000))
    for store in stores:
        await store.read("owner", "board")  # both caches hold the empty block
    await stores[0].share(OPERATOR, "owner", "board", "other", SharedAccess.APPEND_ONLY)

    async def writer(store: BlockStore, agent: str) -> None:
        for i in range(50):
            await store.append(agent, "board", f"{agent} line {i}")

    # both start from the empty block: the first appends are concurrent too
    await asyncio.gather(writer(stores[0], "owner"), writer(stores[1], "other"))
    content = (await stores[0].read("owner", "board")).content
    assert content.count("\n") == 100
    lines = set(content.split("\n"))
    assert {f"owner line {i}" for i in range(50)} <= lines
    assert {f"other line {i}" for i in range(50)} <= lines
    for c in clients:
        await c.aclose()


async def test_selective_undo_keeps_the_other_agents_edit(redis_url: str) -> None:
    settings = _settings()
    clients = [create_redis(redis_url, settings.blackboard) for _ in range(2)]
    a, b = (BlockStore(c, settings) for c in clients)
    await a.create("a", NewBlock(label="plan", content="start"))
    await a.share(OPERATOR, "a", "plan", "b", SharedAccess.READ_WRITE)
    await a.read("a", "plan")
    await b.read("b", "plan")
    await asyncio.gather(a.append("a", "plan", "A's step"), b.append("b", "plan", "B's step"))
    await b.append("b", "plan", "B's second step")
    await a.undo("a", "plan")
    content = (await b.read("b", "plan")).content
    assert "A's step" not in content
    assert "B's step" in content and "B's second step" in content and "start" in content
    history = await a.history("a", "plan")
    assert history.versions[-1].op == "undo" and history.versions[-1].author == "a"
    with pytest.raises(BlockEditRejected, match="no edit"):
        await a.undo("a", "plan")
    for c in clients:
        await c.aclose()


async def test_compaction_and_shallow_history_keep_content_and_numbering(redis_url: str) -> None:
    settings = _settings(compact_after_updates=8, history_versions=20)
    client = create_redis(redis_url, settings.blackboard)
    store = BlockStore(client, settings)
    await store.create("a", NewBlock(label="log2", char_limit=100_000))
    for i in range(60):
        await store.append("a", "log2", f"line {i}")
    history = await store.history("a", "log2")
    assert history.head == 61
    assert history.oldest_viewable > 1 and len(history.versions) <= 20 + 8 + 1
    assert history.versions[-1].version == 61
    view = await store.read("a", "log2", version=history.oldest_viewable + 1)
    assert view.content.endswith(f"line {history.oldest_viewable - 1}\n")
    fresh = BlockStore(client, settings)
    assert (await fresh.read("a", "log2")).content.split("\n")[-2] == "line 59"
    assert (await fresh.history("a", "log2")).head == 61
    with pytest.raises(BlockNotFound):
        await store.read("a", "log2", version=1)
    await client.aclose()


async def test_log_blocks_are_capped_and_read_only_to_agents(store: BlockStore) -> None:
    await store.create(
        "a", NewBlock(label="tool_log", block_type=BlockType.LOG, log_max_entries=3, log_shown_entries=2)
    )
    for i in range(5):
        await store.log_append("a", "tool_log", {"kind": "tool", "text": f"call {i}"})
    view = await store.read("a", "tool_log")
    assert [e["text"] for e in view.entries or []] == ["call 2", "call 3", "call 4"]
    assert view.content == "- [tool] call 3\n- [tool] call 4"
    with pytest.raises(BlockAccessDenied, match="log"):
        await store.append("a", "tool_log", "x")


async def test_undo_never_joins_the_lines_around_the_undone_edit(store: BlockStore) -> None:
    """Content is lines (a non-empty block ends with a break), so undoing A's line between the
    creation and B's later line leaves both intact, not 'step onepeer line'."""
    await store.create("a", NewBlock(label="plan", content="step one"))  # no final break given
    await store.share(OPERATOR, "a", "plan", "b", SharedAccess.READ_WRITE)
    await store.append("a", "plan", "owner line")
    await store.append("b", "plan", "peer line")
    await store.undo("a", "plan")
    assert (await store.read("a", "plan")).content == "step one\npeer line\n"
    await store.set_content("b", "plan", "rewritten")
    await store.replace("b", "plan", "rewritten\n", "")
    assert (await store.read("a", "plan")).content == ""
    await store.set_content("b", "plan", "x\ny")
    await store.replace("b", "plan", "\ny", "")
    assert (await store.read("a", "plan")).content == "x\n"


async def test_a_block_deleted_and_made_again_is_not_mistaken_for_the_cached_one(redis_url: str) -> None:
    settings = _settings()
    clients = [create_redis(redis_url, settings.blackboard) for _ in range(2)]
    a, b = (BlockStore(c, settings) for c in clients)
    await a.create("x", NewBlock(label="notes", content="old one"))
    await a.append("x", "notes", "old two")
    assert "old two" in (await b.read("x", "notes")).content  # b caches the old block
    await a.delete("x", "x", "notes")
    await a.create("x", NewBlock(label="notes", content="new one"))
    assert (await b.read("x", "notes")).content == "new one\n"
    await b.append("x", "notes", "new two")
    assert (await a.read("x", "notes")).content == "new one\nnew two\n"
    assert (await a.history("x", "notes")).head == 2
    for c in clients:
        await c.aclose()


async def test_edits_and_refusals_are_counted(store: BlockStore) -> None:
    from prometheus_client import REGISTRY

    def count(op: str, outcome: str) -> float:
        return REGISTRY.get_sample_value("colony_block_edits_total", {"op": op, "outcome": outcome}) or 0.0

    before = {k: count(*k) for k in (("append", "applied"), ("append", "limit"), ("put", "access"))}
    await store.create("m", NewBlock(label="tiny", content="abc", char_limit=8))
    await store.create("m", NewBlock(label="fixed", content="abc", read_only=True))
    await store.append("m", "tiny", "de")
    with pytest.raises(BlockEditRejected):
        await store.append("m", "tiny", "far too long")
    with pytest.raises(BlockAccessDenied):
        await store.set_content("m", "fixed", "x", op="put")
    assert count("append", "applied") == before[("append", "applied")] + 1
    assert count("append", "limit") == before[("append", "limit")] + 1
    assert count("put", "access") == before[("put", "access")] + 1


async def test_an_edit_delayed_past_a_shallow_compaction_is_redone_not_lost(redis_url: str) -> None:
    """A slow replica's update reaches Redis after another replica folded history into a shallow
    snapshot newer than the update's base: the append is refused and the edit redone on the new
    snapshot, so the block stays loadable everywhere and the line is there."""
    settings = _settings(history_versions=10, compact_after_updates=2)
    clients = [create_redis(redis_url, settings.blackboard) for _ in range(3)]
    a, b, c = (BlockStore(cl, settings) for cl in clients)
    await a.create("alice", NewBlock(label="board", content="start", char_limit=100_000))
    await a.share("alice", "alice", "board", "bob", SharedAccess.READ_WRITE)
    gate = asyncio.Event()
    real = b.documents._append

    async def slow_append(**kwargs: object) -> object:
        await gate.wait()
        return await real(**kwargs)

    b.documents._append = slow_append  # type: ignore[method-assign]
    slow = asyncio.create_task(b.append("bob", "board", "bob's slow line", owner="alice"))
    await asyncio.sleep(0.2)  # bob has read the block and committed locally; his append waits
    for i in range(14):
        await a.append("alice", "board", f"alice {i}")
    b.documents._append = real  # type: ignore[method-assign]
    gate.set()
    done = await slow
    await a.append("alice", "board", "alice after")
    content = (await c.read("alice", "board")).content
    assert "bob's slow line\n" in content and "alice after\n" in content
    history = await c.history("alice", "board")
    assert history.head == 17 and done.version in {v.version for v in history.versions}
    for cl in clients:
        await cl.aclose()


async def test_version_numbers_never_change_across_shallow_compactions(redis_url: str) -> None:
    """Two replicas taking turns, history well past `history_versions`: every edit keeps the
    number its EditOutcome gave it, and viewing that number shows that edit's line last."""
    settings = _settings(history_versions=20, compact_after_updates=4)
    clients = [create_redis(redis_url, settings.blackboard) for _ in range(2)]
    stores = [BlockStore(cl, settings) for cl in clients]
    await stores[0].create("alice", NewBlock(label="notes", char_limit=100_000))
    given = {}
    for i in range(90):
        outcome = await stores[i % 2].append("alice", "notes", f"line {i}", message=f"m{i}")
        given[f"m{i}"] = outcome.version
    assert list(given.values()) == list(range(2, 92))
    history = await stores[0].history("alice", "notes", limit=1000)
    assert history.head == 91 and 60 < history.oldest_viewable <= 91 - 20 + 1
    assert all(given[v.message] == v.version for v in history.versions if v.message in given)
    assert [v.version for v in history.versions] == list(range(history.oldest_viewable, 92))
    for i in (75, 80, 89):
        view = await stores[1].read("alice", "notes", version=given[f"m{i}"])
        assert view.content.splitlines()[-1] == f"line {i}"
    await stores[1].rollback("alice", "notes", given["m75"])
    assert (await stores[0].read("alice", "notes")).content.splitlines()[-1] == "line 75"
    for cl in clients:
        await cl.aclose()


async def test_review_hardening(store: BlockStore, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a hostile review found, each pinned: the operator edits read-only blocks; the block's
    own access list decides a by-label read; colony labels never collide with an agent's own; log
    blocks start empty and bound their entries; lone surrogates are refused; a block of exactly its
    limit fits; a slow character diff falls back to lines."""
    await store.create_colony_block(
        NewBlock(label="policy", content="v1", read_only=True), SharedAccess.READ_WRITE
    )
    await store.set_content(OPERATOR, "policy", "v2", owner=COLONY)
    assert (await store.read("anyone", "policy")).content == "v2\n"
    with pytest.raises(BlockAccessDenied):
        await store.append("anyone", "policy", "x")

    await store.create("owner", NewBlock(label="board", content="t"))
    await store.share(OPERATOR, "owner", "board", "guest", SharedAccess.READ_WRITE)
    await store.redis.hdel(BlockProtocol.key(store.block_id("owner", "board"), "acl"), "guest")
    with pytest.raises(BlockNotFound):  # the agent's index still names it; the block says no
        await store.read("guest", "board")
    assert "board" not in [i.label for i, _ in await store.list_for("guest")]

    with pytest.raises(BlockExists):
        await store.create("owner", NewBlock(label="policy"))
    with pytest.raises(BlockExists):
        await store.create_colony_block(NewBlock(label="board"), SharedAccess.READ_ONLY)

    with pytest.raises(InvalidArgument, match="starts empty"):
        await store.create("owner", NewBlock(label="events", block_type=BlockType.LOG, content="x"))
    await store.create("owner", NewBlock(label="events", block_type=BlockType.LOG, log_max_entries=2))
    await store.log_append("owner", "events", {"kind": "big\nkind", "text": "y" * 1_000_000})
    entry = (await store.read("owner", "events")).entries[-1]  # type: ignore[index]
    assert len(entry["text"]) == 1000 and entry["kind"] == "big\nkind"
    assert "- [big kind] " in (await store.read("owner", "events")).content

    with pytest.raises(BlockEditRejected, match="surrogate"):
        await store.append("owner", "board", "bad \ud800")
    await store.append("owner", "board", "ok", message="note \ud800")  # a note is kept, repaired

    await store.create("owner", NewBlock(label="exact", content="x" * 10, char_limit=10))
    await store.set_content("owner", "exact", "y" * 10)
    view = await store.read("owner", "exact")
    assert view.content == "y" * 10 + "\n" and view.chars == 10

    await store.create("solo", NewBlock(label="only"))
    await store.delete("solo", "solo", "only")
    assert "solo" not in await store.redis.smembers(BlockProtocol.owners_key(store.namespace))

    import random

    rng = random.Random(7)
    first = "".join(rng.choice("abcdefgh \n") for _ in range(15_000))
    second = "".join(rng.choice("abcdefgh \n") for _ in range(15_000))
    await store.create("owner", NewBlock(label="big", content=first, char_limit=50_000))
    monkeypatch.setattr("colony.memory.blocks.document.REWRITE_DIFF_MS", 1)  # the diff runs out of time
    await store.set_content("owner", "big", second)
    assert (await store.read("owner", "big")).content == as_lines(second)


def test_the_process_store_is_per_colony_whatever_the_settings_objects(redis_url: str) -> None:
    from colony.memory.blocks.stores import block_store

    client = create_redis(redis_url)
    stores = [block_store(client, ColonySettings(colony_id=f"colony{n % 3}")) for n in range(60)]
    assert {s.namespace for s in stores} == {
        BlockProtocol.namespace("default", f"colony{n}") for n in range(3)
    }
    for n, s in enumerate(stores):
        assert s.namespace == BlockProtocol.namespace("default", f"colony{n % 3}")
