"""A process's copies of block documents, kept in step with Redis, and the commits of edits to them:
the snapshot and update log of each block, read by a Lua script that returns only the updates the
copy has not imported, and each edit's update appended (the log folded into the snapshot when it
grows past `compact_after_updates`). BlockStore holds one (`store.documents`)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from colony import metrics
from colony.blackboard.protocol import BlockProtocol
from colony.config import BlockSettings
from colony.errors import BlockError, BlockLimitExceeded, BlockNotFound, BlockVersionConflict
from colony.memory.blocks import scripts
from colony.memory.blocks.directory import b64, unb64
from colony.memory.blocks.document import BlockDocument, EditMeta, raised_by_loro
from colony.memory.blocks.types import BlockInfo, BlockType, EditOutcome, History, SharedAccess

log = logging.getLogger(__name__)

Apply = Callable[[BlockDocument, EditMeta, SharedAccess, History], bytes]
EDIT_ATTEMPTS = 10  # an edit redone after this many compactions in a row gives up


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

    async def refresh(self, block_id: str, entry: CachedBlock, *, versions: bool = False) -> BlockDocument:
        """Bring the cached document up to Redis (the caller holds `entry.lock`); with `versions`,
        also the block's edit ids in log order (`entry.order`), read in the same script."""
        reply = await self._read(
            keys=_keys(block_id, "meta", "snap", "log", "ver"),
            args=[entry.gen if entry.document is not None else "-", entry.applied, "1" if versions else "0"],
        )
        if reply is None:
            self.drop(block_id)
            raise BlockNotFound(f"block {block_id} does not exist (it was deleted)")
        gen, vbase, vcount, nmeta = reply[0], int(reply[1]), int(reply[2]), int(reply[3])
        flat = reply[4 : 4 + nmeta]
        at = 4 + nmeta
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
        entry.vbase, entry.vcount = vbase, vcount
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
        compacted between its read and its append is redone on the new snapshot (its update could
        depend on history the snapshot folded away)."""
        entry = self.entry(info.block_id)
        for attempt in range(EDIT_ATTEMPTS):
            if attempt:  # the last try met a compaction: let the compactor's burst pass
                await asyncio.sleep(random.uniform(0, 0.005 * attempt))
            async with entry.lock:
                outcome = await self._try_commit(entry, info, access, meta, apply, op, base_version)
            if outcome is not None:
                return outcome
        raise BlockError(
            f"block {info.label!r} was compacted {EDIT_ATTEMPTS} times while this edit was made; nothing "
            "was changed, try again"
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
    ) -> EditOutcome | None:
        """One try of `commit` (the caller holds `entry.lock`); None when the block was compacted
        meanwhile (then the edit is redone)."""
        label = info.label
        document = await self.refresh(info.block_id, entry, versions=op in ("rollback", "undo"))
        if base_version is not None and entry.head != base_version:
            raise BlockVersionConflict(
                f"block {label!r} is at version {entry.head}, not {base_version}; read it again "
                "and redo the edit on the current content (or leave base_version out to merge)",
                current_version=entry.head,
            )
        before = document.size()
        update = self._applied(entry, info, document, apply, meta, access)
        after = document.size()
        limit = int(entry.fields.get("char_limit", info.char_limit))
        if info.block_type is not BlockType.LOG and after > limit and after > before:
            self.drop(info.block_id)
            raise BlockLimitExceeded(
                f"block {label!r} would have {after}/{limit} characters (it has {before}); nothing "
                "was changed. Shorten it first (core_memory_replace or memory_rethink), move "
                "details to archival memory (archival_insert), or raise its char_limit"
            )
        version = await self._append_update(entry, info, document, update)
        if version is None:
            return None
        return EditOutcome(
            block_id=info.block_id,
            label=label,
            owner=info.owner,
            version=version,
            chars=after,
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
        self, entry: CachedBlock, info: BlockInfo, document: BlockDocument, update: bytes
    ) -> int | None:
        """Append `update` to the block's log: the new version, or None when the block was compacted
        since the cached document was read. Folds the log when it grew past `compact_after_updates`."""
        try:
            reply = await self._append(
                keys=_keys(info.block_id, "meta", "log", "ver"),
                args=[b64(update), repr(time.time()), document.last_edit_id, entry.gen],
            )
        except Exception:
            self.drop(info.block_id)
            raise
        if reply == -1:
            self.drop(info.block_id)
            raise BlockNotFound(f"block {info.label!r} was deleted while being edited")
        if reply == -2:  # compacted meanwhile: reload and redo (after a short, growing pause)
            self.drop(info.block_id)
            return None
        length, version = int(reply[0]), int(reply[1])
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
