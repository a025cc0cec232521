"""Block creation and sharing hold their rules under concurrency and crashes, on a real
redis-server with one Redis client and BlockStore per writer (as separate replicas would have):
`max_blocks_per_owner` holds when many creates race at the cap; an agent's block and a colony
block (or a block shared with it) of one label are never both made; a create or delete that dies
between its two writes (the label in the owner's index, the block's own keys) leaves nothing a
re-create refuses, and a created block is always listed; a create script re-sent after a lost reply
reports the block it made as made."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from colony.blackboard import create_redis
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import BlockExists, InvalidArgument
from colony.memory.blocks.cache import DocumentCache
from colony.memory.blocks.document import BlockDocument, EditMeta
from colony.memory.blocks.listing import BlockListing
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.types import OPERATOR, SYSTEM, NewBlock, SharedAccess

WRITERS = 8


class Crash(Exception):
    """The process died here."""


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[Callable[[], BlockStore]]:
    """A factory of BlockStores of one fresh colony, each on its own Redis client."""
    settings = ColonySettings(redis_url=redis_url, colony_id=f"ca{uuid.uuid4().hex[:8]}")
    clients: list[Any] = []

    def make() -> BlockStore:
        clients.append(create_redis(redis_url, BlackboardSettings()))
        return BlockStore(clients[-1], settings)

    yield make
    for client in clients:
        await client.aclose()


def _agent() -> str:
    return f"agent-{uuid.uuid4().hex[:6]}"


async def test_max_blocks_per_owner_holds_under_concurrent_creates(stores: Callable[[], BlockStore]) -> None:
    writers = [stores() for _ in range(WRITERS)]
    most = writers[0].settings.max_blocks_per_owner
    agent = _agent()
    for i in range(most - 1):
        await writers[0].create(agent, NewBlock(label=f"b{i}", content="x"))

    async def one(n: int) -> str:
        try:
            await writers[n % WRITERS].create(agent, NewBlock(label=f"race{n}", content="x"))
        except InvalidArgument as exc:
            assert "max_blocks_per_owner" in str(exc)
            return "full"
        return "made"

    results = await asyncio.gather(*(one(n) for n in range(3 * WRITERS)))
    assert results.count("made") == 1, results
    assert len(await writers[0].list_owned(agent)) == most


async def test_an_agent_block_and_a_colony_block_of_one_label_are_never_both_made(
    stores: Callable[[], BlockStore],
) -> None:
    mine, colony = stores(), stores()
    agent = _agent()
    await mine.create(agent, NewBlock(label="seed", content="x"))
    for _ in range(20):
        label = f"dup_{uuid.uuid4().hex[:6]}"
        results = await asyncio.gather(
            mine.create(agent, NewBlock(label=label, content="mine")),
            colony.create_colony_block(NewBlock(label=label, content="colony"), SharedAccess.READ_WRITE),
            return_exceptions=True,
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        assert len(made) == 1 and all(isinstance(r, BlockExists) for r in results if r not in made), results


async def test_a_colony_block_checks_an_agent_that_got_its_first_block_meanwhile(
    stores: Callable[[], BlockStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owners are read, then an agent makes its first block of that label, then the colony
    block's script runs: it sees the owner it was not given and reads the owners again."""
    mine, colony = stores(), stores()
    agent = _agent()
    real = BlockListing._list_colony_label
    raced: list[bool] = []

    async def owners_read_then_agent_creates(self: BlockListing, label: str, block_id: str) -> Any:
        real_smembers = self.redis.smembers

        async def smembers(key: str) -> Any:
            owners = await real_smembers(key)
            if not raced:
                raced.append(True)
                await mine.create(agent, NewBlock(label=label, content="mine"))
            return owners

        monkeypatch.setattr(self.redis, "smembers", smembers)
        return await real(self, label, block_id)

    monkeypatch.setattr(BlockListing, "_list_colony_label", owners_read_then_agent_creates)
    with pytest.raises(BlockExists, match=agent):
        await colony.create_colony_block(NewBlock(label="late", content="c"), SharedAccess.READ_ONLY)
    assert raced and await colony.info_of(colony.block_id("_colony", "late")) is None


async def test_a_share_and_an_own_block_of_one_label_are_never_both_made(
    stores: Callable[[], BlockStore],
) -> None:
    owner_store, agent_store = stores(), stores()
    owner, agent = _agent(), _agent()
    await agent_store.create(agent, NewBlock(label="seed", content="x"))
    for _ in range(20):
        label = f"sh_{uuid.uuid4().hex[:6]}"
        await owner_store.create(owner, NewBlock(label=label, content="theirs"))
        results = await asyncio.gather(
            owner_store.share(SYSTEM, owner, label, agent, SharedAccess.READ_ONLY),
            agent_store.create(agent, NewBlock(label=label, content="mine")),
            return_exceptions=True,
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        assert len(made) == 1 and all(isinstance(r, BlockExists) for r in results if r not in made), results


@pytest.mark.parametrize("where", ["before the block's keys", "after the block's keys"])
async def test_a_create_that_dies_midway_is_listed_or_free(
    stores: Callable[[], BlockStore], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Dead before its keys: a re-create makes it. Dead after them: it exists and is listed (a
    re-create answers BlockExists about a block the owner can see)."""
    store = stores()
    agent = _agent()
    await store.create(agent, NewBlock(label="seed", content="x"))
    real = DocumentCache.write_new

    async def dies(self: DocumentCache, *args: Any) -> bool:
        if where == "after the block's keys":
            await real(self, *args)
        raise Crash()

    monkeypatch.setattr(DocumentCache, "write_new", dies)
    with pytest.raises(Crash):
        await store.create(agent, NewBlock(label="notes", content="first try"))
    monkeypatch.undo()
    if where == "before the block's keys":
        await store.create(agent, NewBlock(label="notes", content="second try"))
        expected = "second try"
    else:
        with pytest.raises(BlockExists):
            await store.create(agent, NewBlock(label="notes", content="second try"))
        expected = "first try"
    listed = {b.label for b in await store.list_owned(agent)}
    assert listed == {"seed", "notes"}, listed
    view = await store.read(agent, "notes")
    assert view.content == f"{expected}\n"


async def test_a_delete_that_dies_midway_leaves_the_label_free(
    stores: Callable[[], BlockStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores()
    agent = _agent()
    await store.create(agent, NewBlock(label="seed", content="x"))
    await store.create(agent, NewBlock(label="notes", content="old"))

    async def dies(*args: Any) -> bool:
        raise Crash()

    monkeypatch.setattr(store.listing, "unlist", dies)
    with pytest.raises(Crash):
        await store.delete(OPERATOR, agent, "notes")
    monkeypatch.undo()
    assert {b.label for b in await store.list_owned(agent)} == {"seed"}  # listed, but not there
    await store.create(agent, NewBlock(label="notes", content="new"))
    assert (await store.read(agent, "notes")).content == "new\n"
    assert {b.label for b in await store.list_owned(agent)} == {"seed", "notes"}


async def test_a_resent_create_script_reports_its_own_block_as_made(stores: Callable[[], BlockStore]) -> None:
    store = stores()
    block_id = store.block_id(_agent(), "notes")
    document = BlockDocument()
    document.create("text", EditMeta(SYSTEM, "system", "create"))
    fields = {"owner": "x", "label": "notes", "gen": uuid.uuid4().hex[:16], "vbase": "0"}
    assert await store.documents.write_new(block_id, document, fields)
    assert await store.documents.write_new(block_id, document, fields)  # the same call, re-sent
    other = BlockDocument()
    other.create("other", EditMeta(SYSTEM, "system", "create"))
    assert not await store.documents.write_new(block_id, other, fields)  # another creator's
