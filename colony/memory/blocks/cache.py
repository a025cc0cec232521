"""A process's copies of block documents, kept in step with Redis, and the commits of edits to them:
the snapshot and update log of each block, read by a Lua script that returns only the updates the
copy has not imported, and each edit's update appended (the log folded into the snapshot when it
grows past `compact_after_updates`). BlockStore holds one (`store.documents`).

An edit's append is a compare-and-set on the log it was made on: when another writer (another
process) appended meanwhile, the edit is redone on the fresh document and its character limit
checked again, so edits merged by Loro can never carry a block past its limit; the script checks the
limit stored in the block's metadata too. An edit whose id is already in the block's version list (a
redone action: its id derives from the action's idempotency key) is not applied again. An edit
keeps one id over all its tries, so a try whose append was stored although its reply was lost (the
Redis client re-sends a script after a timeout: the re-sent one finds the id and appends nothing,
and a redo finds it in the version list) is never appended twice."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis

from colony import metrics
from colony.blackboard.protocol import BlockProtocol
from colony.config import BlockSettings
from colony.errors import (
    BlockContended,
    BlockError,
    BlockLimitExceeded,
    BlockNotFound,
    BlockVersionConflict,
)
from colony.memory.blocks import scripts
from colony.memory.blocks.directory import b64, unb64
from colony.memory.blocks.document import BlockDocument, EditMeta, raised_by_loro
from colony.memory.blocks.types import BlockInfo, BlockType, EditOutcome, History, SharedAccess

log = logging.getLogger(__name__)

Apply = Callable[[BlockDocument, EditMeta, SharedAccess, History], bytes]
# An edit is redone when the block was compacted or appended to by another writer between its read
# and its append; after this many tries it gives up (BlockContended). Each redo is counted
# (colony_block_edit_retries_total) and waits a short random pause, longer with each try.
EDIT_ATTEMPTS = 48
MAX_PAUSE_SECONDS = 0.05


@dataclass
class CachedBlock:
    """A process's copy of one block's document and how much of the Redis log it has imported."""

    gen: str = ""
    applied: int = 0
    document: BlockDocument | None = None
    fields: dict[str, str] = field(default_factory=dict)
    vbase: int = 0  # versions folded away before the first of `order`
    vcount: int = 0  # versions listed in Redis (head = vbase + vcount)
    order: list[str] | None = None  # edit ids in log order, when the last refresh asked for them
    found: int = -1  # the position in `ver` of the edit id the last refresh looked for (-1: absent)

    @property
    def head(self) -> int:
        return self.vbase + self.vcount

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _keys(block_id: str, *parts: str) -> list[str]:
    return [BlockProtocol.key(block_id, p) for p in parts]


class DocumentCache:
    """The documents of one colony's blocks on one Redis client, at most `cached_documents` kept."""

    def __init__(self, redis: aioredis.Redis, settings: BlockSettings) -> None:
        self.settings = settings
        self._create = redis.register_script(scripts.CREATE)
        self._read = redis.register_script(scripts.READ)
        self._append = redis.register_script(scripts.APPEND)
        self._compact = redis.register_script(scripts.COMPACT)
        self._cache: OrderedDict[str, CachedBlock] = OrderedDict()

    def entry(self, block_id: str) -> CachedBlock:
        """The block's cache entry (made, and the least recently used unlocked one evicted, if new)."""
        entry = self._cache.get(block_id)
        if entry is None:
            entry = self._cache[block_id] = CachedBlock()
            while len(self._cache) > self.settings.cached_documents:
                oldest, victim = next(iter(self._cache.items()))
                if victim.lock.locked():
                    break
                self._cache.pop(oldest)
        else:
            self._cache.move_to_end(block_id)
        return entry

    def drop(self, block_id: str) -> None:
        """Forget the cached document (the next refresh loads it from Redis), keeping the entry."""
        entry = self._cache.get(block_id)
        if entry is not None:
            entry.document, entry.gen, entry.applied = None, "", 0

    def forget(self, block_id: str) -> None:
        """Drop the block's entry (the block was deleted)."""
        self._cache.pop(block_id, None)

    async def write_new(self, block_id: str, document: BlockDocument, fields: dict[str, Any]) -> bool:
        """Store a new block's first snapshot and metadata `fields`; False when the block exists."""
        args: list[Any] = [b64(document.snapshot()), document.last_edit_id]
        for name, value in fields.items():
            args += [name, str(value)]
        return bool(await self._create(keys=_keys(block_id, "meta", "snap", "log", "ver"), args=args))

    async def refresh(
        self, block_id: str, entry: CachedBlock, *, versions: bool = False, find: str = ""
    ) -> BlockDocument:
        """Bring the cached document up to Redis (the caller holds `entry.lock`); with `versions`,
        also the block's edit ids in log order (`entry.order`); with `find`, where that edit id is
        in the version list (`entry.found`), read in the same script."""
        reply = await self._read(
            keys=_keys(block_id, "meta", "snap", "log", "ver"),
            args=[
                entry.gen if entry.document is not None else "-",
                entry.applied,
                "1" if versions else "0",
                find,
            ],
        )
        if reply is None:
            self.drop(block_id)
            raise BlockNotFound(f"block {block_id} does not exist (it was deleted)")
        gen, vbase, vcount, found = reply[0], int(reply[1]), int(reply[2]), int(reply[3])
        nmeta = int(reply[4])
        flat = reply[5 : 5 + nmeta]
        at = 5 + nmeta
        snapshot, nids = reply[at], int(reply[at + 1])
        ids, updates = reply[at + 2 : at + 2 + nids], reply[at + 2 + nids :]
        try:
            if entry.document is None or gen != entry.gen:
                entry.document = BlockDocument.load(unb64(snapshot) if snapshot else None, [])
                entry.applied = 0
            entry.document.import_updates([unb64(u) for u in updates])
        except BaseException as exc:  # Loro raises BaseException itself
            self.drop(block_id)
            if not raised_by_loro(exc):
                raise
            raise BlockError(
                f"block {block_id}'s stored history could not be loaded ({exc}); it needs an operator "
                "(docs/blocks.md, Storage)"
            ) from exc
        entry.gen = gen
        entry.applied += len(updates)
        entry.fields = dict(zip(flat[0::2], flat[1::2], strict=False))
        entry.vbase, entry.vcount, entry.found = vbase, vcount, found
        entry.order = list(ids) if versions else None
        return entry.document

    # -- committing an edit ---------------------------------------------------------------------

    async def commit(
        self,
        info: BlockInfo,
        access: SharedAccess,
        meta: EditMeta,
        apply: Apply,
        *,
        op: str,
        base_version: int | None,
    ) -> EditOutcome:
        """Apply `apply(document, meta, access, history)` -> update, check the character limit,
        append the update to the log (folding the log when it is long). An edit whose block was
        compacted, or appended to by another writer, between its read and its append is redone on
        the new content (bounded: EDIT_ATTEMPTS, then BlockContended). An edit with an id
        (`meta.edit_id`) already in the block's history is not applied again: its outcome is."""
        entry = self.entry(info.block_id)
        # one edit id for every try: a try whose append was stored although its reply said
        # otherwise (a script re-sent after a timeout) is found by the next try, not made again
        meta = replace(meta, edit_id=meta.edit_id or uuid.uuid4().hex[:16])
        for attempt in range(EDIT_ATTEMPTS):
            if attempt:  # the last try met another writer: let its burst pass
                await asyncio.sleep(random.uniform(0, min(MAX_PAUSE_SECONDS, 0.002 * attempt)))
            async with entry.lock:
                outcome = await self._try_commit(entry, info, access, meta, apply, op, base_version)
            if isinstance(outcome, EditOutcome):
                if attempt and outcome._repeated:  # this call's own earlier try was stored
                    outcome._repeated = False
                return outcome
            metrics.BLOCK_EDIT_RETRIES.labels(outcome).inc()
        async with entry.lock:  # the last try's append may have been stored all the same
            await self.refresh(info.block_id, entry, find=meta.edit_id)
            if entry.found >= 0:
                return self._made(entry, info, meta.edit_id, op)
        raise BlockContended(
            f"block {info.label!r} kept changing while this edit was made ({EDIT_ATTEMPTS} tries, each "
            "overtaken by another writer's edit or a compaction); the edit was not stored, try again",
            current_version=entry.head,
        )

    async def _try_commit(
        self,
        entry: CachedBlock,
        info: BlockInfo,
        access: SharedAccess,
        meta: EditMeta,
        apply: Apply,
        op: str,
        base_version: int | None,
    ) -> EditOutcome | str:
        """One try of `commit` (the caller holds `entry.lock`); why it must be redone
        ("compacted", "concurrent") when the block changed meanwhile."""
        label = info.label
        versions = op in ("rollback", "undo")
        document = await self.refresh(info.block_id, entry, versions=versions, find=meta.edit_id)
        limit = int(entry.fields.get("char_limit", info.char_limit))
        if meta.edit_id and entry.found >= 0:  # made before (a redone action): its outcome, once
            outcome = self._made(entry, info, meta.edit_id, op)
            outcome._repeated = True
            return outcome
        if base_version is not None and entry.head != base_version:
            raise BlockVersionConflict(
                f"block {label!r} is at version {entry.head}, not {base_version}; read it again "
                "and redo the edit on the current content (or leave base_version out to merge)",
                current_version=entry.head,
            )
        before = document.size()
        update = self._applied(entry, info, document, apply, meta, access)
        after = document.size()
        if info.block_type is not BlockType.LOG and after > limit and after > before:
            self.drop(info.block_id)
            raise _over_limit(label, after, limit, before)
        version = await self._append_update(entry, info, document, update, after, before)
        if isinstance(version, str):
            return version
        return self._outcome(info, version, after, limit, op)

    def _made(self, entry: CachedBlock, info: BlockInfo, edit_id: str, op: str) -> EditOutcome:
        """The outcome of edit `edit_id`, found stored (`entry.found`, by the last refresh)."""
        document = entry.document
        chars = document.chars_after(edit_id) if document is not None else None
        if chars is None:  # recorded before edits kept their length: the current one
            chars = document.size() if document is not None else 0
        limit = int(entry.fields.get("char_limit", info.char_limit))
        return self._outcome(info, entry.vbase + entry.found + 1, chars, limit, op)

    @staticmethod
    def _outcome(info: BlockInfo, version: int, chars: int, limit: int, op: str) -> EditOutcome:
        return EditOutcome(
            block_id=info.block_id,
            label=info.label,
            owner=info.owner,
            version=version,
            chars=chars,
            char_limit=limit,
            op=op,
        )

    def _applied(
        self,
        entry: CachedBlock,
        info: BlockInfo,
        document: BlockDocument,
        apply: Apply,
        meta: EditMeta,
        access: SharedAccess,
    ) -> bytes:
        """The update of `apply` on the cached document; Loro's failure as a BlockError."""
        try:
            return apply(document, meta, access, History(entry.order or [], entry.vbase))
        except BaseException as exc:
            self.drop(info.block_id)  # the cached document may hold a partial local change
            if not raised_by_loro(exc):
                raise
            raise BlockError(f"the edit of block {info.label!r} failed in Loro: {exc}") from exc

    async def _append_update(
        self,
        entry: CachedBlock,
        info: BlockInfo,
        document: BlockDocument,
        update: bytes,
        after: int,
        before: int,
    ) -> int | str:
        """Append `update` to the block's log if nothing was appended since the cached document was
        read (a LOG block's entries merge: appended regardless): the new version, or why the edit
        must be redone ("compacted", "concurrent"). Folds the log when it grew past
        `compact_after_updates`."""
        expected = "" if info.block_type is BlockType.LOG else str(entry.applied)
        args = [b64(update), repr(time.time()), document.last_edit_id, entry.gen, expected, after, before]
        try:
            reply = await self._append(keys=_keys(info.block_id, "meta", "log", "ver"), args=args)
        except Exception:
            self.drop(info.block_id)
            raise
        code = int(reply[0])
        if code < 0:  # the cached document holds an edit that was not stored
            self.drop(info.block_id)
        if code == -1:
            raise BlockNotFound(f"block {info.label!r} was deleted while being edited")
        if code == -4:  # the limit was lowered meanwhile (update_info): the script's is the one
            raise _over_limit(info.label, after, int(reply[1]), int(reply[2]))
        if code < 0:  # -2 compacted, -3 another writer appended: reload and redo
            return "compacted" if code == -2 else "concurrent"
        length, version = code, int(reply[1])
        if length > self.settings.compact_after_updates:
            try:  # the edit is stored: folding is housekeeping, retried by the next edit
                await self._fold(info.block_id, entry, info)
            except Exception as exc:
                self.drop(info.block_id)
                log.warning("block %s: folding the update log failed (%r); will retry", info.label, exc)
        return version

    async def _fold(self, block_id: str, entry: CachedBlock, info: BlockInfo) -> None:
        """Fold the update log into the snapshot (the caller holds the lock): a full snapshot, or a
        shallow one when more than `history_versions` versions are listed (a LOG block keeps as many
        versions as entries: older ones say nothing its cap kept)."""
        document = await self.refresh(block_id, entry, versions=True)
        keep = self.settings.history_versions
        if info.block_type is BlockType.LOG:
            keep = max(10, min(keep, info.log_max_entries or self.settings.log_max_entries))
        snapshot, dropped = document.compacted(entry.order or [], keep)
        done = await self._compact(
            keys=_keys(block_id, "meta", "snap", "log", "ver"),
            args=[entry.gen, entry.applied, b64(snapshot), uuid.uuid4().hex[:16], dropped],
        )
        if done:
            metrics.BLOCK_COMPACTIONS.labels("shallow" if dropped else "full").inc()
            self.drop(block_id)  # the next use loads the new snapshot


def _over_limit(label: str, after: int, limit: int, before: int) -> BlockLimitExceeded:
    return BlockLimitExceeded(
        f"block {label!r} would have {after}/{limit} characters (it has {before}); nothing "
        "was changed. Shorten it first (core_memory_replace or memory_rethink), move "
        "details to archival memory (archival_insert), or raise its char_limit"
    )
