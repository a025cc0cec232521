"""A block edit is stored once even when Redis's reply to its append is lost: the client re-sends
a script whose reply timed out (the pipelined lane and redis-py's `Retry` both do), and the first
send had already run. Real redis-server; the stall is a real busy script, the lost replies are the
same script sent again. Also: an edit keeps one id over its tries, so a try stored although its
answer said "redo" is found, not made again, and BlockContended is raised only when the edit was
not stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from colony.blackboard import create_redis
from colony.config import BlackboardSettings, ColonySettings
from colony.errors import BlockContended
from colony.memory.blocks import cache as cache_module
from colony.memory.blocks.cache import DocumentCache
from colony.memory.blocks.directory import b64
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.types import OPERATOR, NewBlock, SharedAccess

COLONY = "_colony"


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[BlockStore]:
    redis = create_redis(redis_url, BlackboardSettings())
    yield BlockStore(redis, ColonySettings(redis_url=redis_url, colony_id=f"rs{uuid.uuid4().hex[:8]}"))
    await redis.aclose()


async def _colony_block(store: BlockStore, content: str = "start") -> str:
    label = f"b{uuid.uuid4().hex[:8]}"
    await store.create_colony_block(NewBlock(label=label, content=content), SharedAccess.READ_WRITE)
    return label


async def _versions(store: BlockStore, label: str) -> list[str]:
    history = await store.history(OPERATOR, label, owner=COLONY)
    return [v.edit_id for v in history.versions]


async def test_a_stalled_redis_stores_one_append_once(redis_url: str, tmp_path: Path) -> None:
    """Redis is busy past op_timeout while the append's reply is awaited: the client times out and
    sends the script again, which Redis had run; the block holds the line once, the call succeeds."""
    settings = ColonySettings(
        redis_url=redis_url,
        data_dir=tmp_path,
        colony_id=f"slow{uuid.uuid4().hex[:6]}",
        blackboard=BlackboardSettings(op_timeout_seconds=0.3),
    )
    client = create_redis(redis_url, settings.blackboard)
    raw = aioredis.Redis.from_url(redis_url)
    store = BlockStore(client, settings)
    label = await _colony_block(store)
    await store.append(OPERATOR, label, "warm", owner=COLONY)  # the scripts are loaded
    stall_script = (
        "local t = redis.call('TIME') local s = t[1]*1e6+t[2] while true do local n = redis.call('TIME') "
        "if n[1]*1e6+n[2]-s > 800000 then break end end return 1"
    )
    stalls: list[asyncio.Task[Any]] = []
    real = DocumentCache._append_update

    async def stalled(self: DocumentCache, *args: Any, **kwargs: Any) -> Any:
        if not stalls:  # Redis turns busy (~0.8 s) just as the append goes out, once
            stalls.append(asyncio.create_task(raw.eval(stall_script, 0)))
            await asyncio.sleep(0.05)
        return await real(self, *args, **kwargs)

    DocumentCache._append_update = stalled  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        outcome = await store.append(OPERATOR, label, "exactly once", owner=COLONY)
        took = time.monotonic() - started
    finally:
        DocumentCache._append_update = real  # type: ignore[method-assign]
        await asyncio.gather(*stalls, return_exceptions=True)
    view = await store.read(OPERATOR, label, owner=COLONY)
    versions = await _versions(store, label)
    await raw.aclose()
    await client.aclose()
    assert took > 0.3, "Redis did not stall past op_timeout: the test did not test the re-send"
    assert view.content.count("exactly once") == 1, view.content
    assert len(versions) == 3 and outcome.version == 3, (versions, outcome)


async def test_a_resent_append_script_appends_nothing(store: BlockStore) -> None:
    """The append script sent twice with the same arguments (the second send as a client's retry
    after a lost reply): one update, one version, the same answer both times."""
    label = await _colony_block(store)
    real = DocumentCache._append_update
    sent: list[Any] = []

    async def resent(
        self: DocumentCache, entry: Any, info: Any, document: Any, update: bytes, *rest: Any
    ) -> Any:
        after, before = rest
        args = [
            b64(update),
            repr(time.time()),
            document.last_edit_id,
            entry.gen,
            str(entry.applied),
            after,
            before,
        ]
        keys = cache_module._keys(info.block_id, "meta", "log", "ver")
        sent.append(await self._append(keys=keys, args=args))  # the first send: it ran, its reply lost
        return await real(self, entry, info, document, update, *rest)

    DocumentCache._append_update = resent  # type: ignore[method-assign]
    try:
        outcome = await store.append(OPERATOR, label, "once only", owner=COLONY)
    finally:
        DocumentCache._append_update = real  # type: ignore[method-assign]
    view = await store.read(OPERATOR, label, owner=COLONY)
    assert view.content.count("once only") == 1, view.content
    assert len(await _versions(store, label)) == 2
    assert int(sent[0][1]) == outcome.version == 2


async def test_a_try_stored_despite_its_answer_is_found_not_redone(store: BlockStore) -> None:
    """A try's append is stored but answers "redo" (as a re-sent script overtaken by others did):
    the next try looks its edit id up, finds it and returns it; the line is stored once."""
    label = await _colony_block(store)
    real = DocumentCache._append_update
    tries: list[int] = []

    async def stored_but_redo(self: DocumentCache, *args: Any, **kwargs: Any) -> Any:
        version = await real(self, *args, **kwargs)
        tries.append(version)
        return "concurrent" if len(tries) == 1 else version

    DocumentCache._append_update = stored_but_redo  # type: ignore[method-assign]
    try:
        outcome = await store.append(OPERATOR, label, "once only", owner=COLONY)
    finally:
        DocumentCache._append_update = real  # type: ignore[method-assign]
    view = await store.read(OPERATOR, label, owner=COLONY)
    assert view.content.count("once only") == 1, view.content
    assert tries == [2] and outcome.version == 2, (tries, outcome)
    assert not outcome._repeated  # this call made it: counted applied, not repeated


async def test_the_last_try_stored_despite_its_answer_is_no_contention(
    store: BlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even the last allowed try: stored although it answered "redo", the edit's outcome is returned,
    not BlockContended ("the edit was not stored" would be false)."""
    label = await _colony_block(store)
    real = DocumentCache._append_update
    monkeypatch.setattr(cache_module, "EDIT_ATTEMPTS", 1)

    async def stored_but_redo(self: DocumentCache, *args: Any, **kwargs: Any) -> Any:
        await real(self, *args, **kwargs)
        return "concurrent"

    monkeypatch.setattr(DocumentCache, "_append_update", stored_but_redo)
    outcome = await store.append(OPERATOR, label, "stored", owner=COLONY)
    monkeypatch.undo()
    view = await store.read(OPERATOR, label, owner=COLONY)
    assert view.content.count("stored") == 1 and outcome.version == 2


async def test_contention_is_raised_only_when_nothing_was_stored(
    store: BlockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every try overtaken (nothing stored): BlockContended, saying the edit was not stored, and
    the block is unchanged."""
    label = await _colony_block(store)
    monkeypatch.setattr(cache_module, "EDIT_ATTEMPTS", 3)
    monkeypatch.setattr(cache_module, "MAX_PAUSE_SECONDS", 0.0)

    async def overtaken(self: DocumentCache, entry: Any, info: Any, *args: Any) -> Any:
        self.drop(info.block_id)  # as the real one does: the local edit was not stored
        return "concurrent"

    monkeypatch.setattr(DocumentCache, "_append_update", overtaken)
    with pytest.raises(BlockContended, match="not stored"):
        await store.append(OPERATOR, label, "never", owner=COLONY)
    monkeypatch.undo()
    view = await store.read(OPERATOR, label, owner=COLONY)
    assert "never" not in view.content and len(await _versions(store, label)) == 1
