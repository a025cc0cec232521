"""A block's character limit holds under concurrent writers: six OS processes, each with its own
Redis client and document cache, append at once to blocks with a small limit over a real
redis-server. Every block ends within its limit, every refused append got the limit's error,
every append reported applied is in the block exactly once. Also: the append script itself refuses
an update past the limit stored in the block's metadata (whatever the writer computed), and an edit
overtaken by another writer is redone, counted, and given up after a bounded number of tries."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from colony import metrics
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.protocol import BlockProtocol
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import BlockContended, BlockLimitExceeded
from colony.memory.blocks import cache as cache_module
from colony.memory.blocks.directory import b64
from colony.memory.blocks.document import EditMeta
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.types import SYSTEM, NewBlock

WRITERS = 6
BLOCKS = 6
APPENDS = 8  # per writer and block: 48 offered to each block, about 9 fit
LIMIT = 200
OWNER = "crowd"


def line(writer: int, label: str, n: int) -> str:
    return f"w{writer}-{label}-{n}".ljust(20, ".")  # 20 characters, 21 with its line break


async def _write(redis_url: str, colony_id: str, writer: int, start: Any) -> list[tuple[str, ...]]:
    redis = create_redis(redis_url, BlackboardSettings())
    store = BlockStore(redis, ColonySettings(colony_id=colony_id))
    results: list[tuple[str, ...]] = []
    start.wait()  # every writer begins together

    async def one(label: str, n: int) -> None:
        text = line(writer, label, n)
        try:
            outcome = await store.append(OWNER, label, text)
            results.append(("applied", label, text, str(outcome.version)))
        except BlockLimitExceeded:
            results.append(("limit", label, text))
        except Exception as exc:  # reported, and the test fails on it
            results.append(("error", label, text, repr(exc)))

    try:
        # each writer's appends to a block run concurrently too (one process's cache serialises them)
        await asyncio.gather(*(one(f"b{b}", n) for n in range(APPENDS) for b in range(BLOCKS)))
    finally:
        await redis.aclose()
    return results


def writer_process(redis_url: str, colony_id: str, writer: int, start: Any, out: Any) -> None:
    out.put((writer, asyncio.run(_write(redis_url, colony_id, writer, start))))


@pytest.fixture
def colony_id() -> str:
    return f"lim{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def store(bb: Blackboard, colony_id: str) -> AsyncIterator[BlockStore]:
    yield BlockStore(bb.redis, ColonySettings(colony_id=colony_id))


async def test_concurrent_processes_never_carry_a_block_past_its_limit(
    store: BlockStore, colony_id: str, redis_url: str
) -> None:
    for b in range(BLOCKS):
        await store.create(OWNER, NewBlock(label=f"b{b}", char_limit=LIMIT))
    context = multiprocessing.get_context("spawn")
    start, out = context.Barrier(WRITERS), context.Queue()
    processes = [
        context.Process(target=writer_process, args=(redis_url, colony_id, w, start, out))
        for w in range(WRITERS)
    ]
    for process in processes:
        process.start()
    try:
        results = [await asyncio.to_thread(out.get, True, 240) for _ in processes]
    finally:
        for process in processes:
            process.join(30)
    rows = [row for _writer, found in results for row in found]
    assert len(rows) == WRITERS * BLOCKS * APPENDS
    assert not [r for r in rows if r[0] == "error"], [r for r in rows if r[0] == "error"][:5]
    for b in range(BLOCKS):
        label = f"b{b}"
        view = await store.read(SYSTEM, label, owner=OWNER)
        assert view.chars <= LIMIT, f"{label}: {view.chars}/{LIMIT}"
        kept = view.content.splitlines()
        applied = [r for r in rows if r[1] == label and r[0] == "applied"]
        refused = [r for r in rows if r[1] == label and r[0] == "limit"]
        assert sorted(kept) == sorted(r[2] for r in applied)  # nothing lost, nothing twice
        assert len({r[3] for r in applied}) == len(applied)  # one version each
        assert refused and len(applied) + len(refused) == WRITERS * APPENDS
        assert view.chars + 21 > LIMIT  # filled: one more line would not fit


async def test_the_append_script_checks_the_limit_in_the_blocks_metadata(store: BlockStore) -> None:
    """A writer whose own check let an over-limit edit through (here: it claims a size within the
    limit it read, but the limit was lowered in Redis) is refused by the script; nothing stored."""
    info = await store.create(OWNER, NewBlock(label="notes", content="x" * 50, char_limit=100))
    cache = store.documents
    entry = cache.entry(info.block_id)
    document = await cache.refresh(info.block_id, entry)
    update = document.append("y" * 60, EditMeta(SYSTEM, "library", "append"))
    await store.update_info(SYSTEM, "notes", owner=OWNER, char_limit=80)  # meanwhile, elsewhere
    keys = [BlockProtocol.key(info.block_id, part) for part in ("meta", "log", "ver")]
    args = [b64(update), "0", document.last_edit_id, entry.gen, entry.applied, 111, 50]
    reply = await cache._append(keys=keys, args=args)
    assert [int(x) for x in reply] == [-4, 80, 50]
    cache.drop(info.block_id)
    view = await store.read(SYSTEM, "notes", owner=OWNER)
    assert view.content == "x" * 50 + "\n" and view.version == 1
    with pytest.raises(BlockLimitExceeded, match="111/80"):
        await store.append(SYSTEM, "notes", "y" * 60, owner=OWNER)


async def test_an_edit_overtaken_by_another_writer_is_redone_and_counted(
    store: BlockStore, bb: Blackboard, colony_id: str
) -> None:
    """Two processes' caches (two clients): edits interleave, each overtaken one is redone on the
    fresh content; all land."""
    other = BlockStore(bb.redis, ColonySettings(colony_id=colony_id))  # its own cache
    await store.create(OWNER, NewBlock(label="board", char_limit=5000))
    before = metrics.BLOCK_EDIT_RETRIES.labels("concurrent")._value.get()
    texts = [f"line {n}" for n in range(30)]
    await asyncio.gather(
        *(
            (store if n % 2 else other).append(SYSTEM, "board", text, owner=OWNER)
            for n, text in enumerate(texts)
        )
    )
    content = (await store.read(SYSTEM, "board", owner=OWNER)).content
    assert sorted(content.splitlines()) == sorted(texts)
    assert metrics.BLOCK_EDIT_RETRIES.labels("concurrent")._value.get() > before


async def test_an_edit_always_overtaken_gives_up_after_bounded_tries(
    store: BlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create(OWNER, NewBlock(label="busy", content="start"))
    calls = 0
    real = store.documents._append

    async def overtaken(*args: Any, **kwargs: Any) -> list[int]:
        nonlocal calls
        calls += 1
        return [-3]  # another writer appended first, every time

    monkeypatch.setattr(store.documents, "_append", overtaken)
    monkeypatch.setattr(cache_module, "MAX_PAUSE_SECONDS", 0.001)
    before = metrics.BLOCK_EDIT_RETRIES.labels("concurrent")._value.get()
    with pytest.raises(BlockContended, match="kept changing") as refused:
        await store.append(SYSTEM, "busy", "more", owner=OWNER)
    assert calls == cache_module.EDIT_ATTEMPTS
    assert metrics.BLOCK_EDIT_RETRIES.labels("concurrent")._value.get() == before + cache_module.EDIT_ATTEMPTS
    assert refused.value.current_version == 1
    monkeypatch.setattr(store.documents, "_append", real)
    assert (await store.read(SYSTEM, "busy", owner=OWNER)).content == "start\n"  # nothing changed
