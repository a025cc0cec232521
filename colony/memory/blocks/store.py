"""Memory blocks in Redis: a Loro snapshot + an append-only update log per block, access checked on
every call.

An edit loads the block (a per-process cache imports only the updates it has not seen), checks the
caller's access, applies the edit as one Loro commit and appends that commit's update to the log.
Concurrent edits from other processes are other updates in the same log: Loro merges them, so
nothing is lost and nobody gets a conflict (unless a client asked to edit from a given version).
When the log grows past `compact_after_updates` it is folded into the snapshot (a shallow one once
history exceeds `history_versions`); a generation number makes concurrent compactions safe.

Metadata hash fields: owner, label, description, block_type, char_limit, read_only, swapped_out,
template, colony_access, log_max_entries, log_shown_entries, created_at, updated_at, created_by,
gen (a fresh token per snapshot), vbase (versions trimmed from the front of the `ver` list).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

import redis.asyncio as aioredis

from colony import metrics
from colony.blackboard.protocol import BlockProtocol
from colony.config import BlockSettings, ColonySettings, load_settings
from colony.errors import (
    BlockAccessDenied,
    BlockEditRejected,
    BlockError,
    BlockExists,
    BlockLimitExceeded,
    BlockNotFound,
    BlockVersionConflict,
    InvalidArgument,
)
from colony.memory.blocks import scripts
from colony.memory.blocks.directory import (
    COLONY,
    BlockDirectory,
    b64,
    check_access,
    check_agent,
    check_label,
    clean_text,
    encodable,
    info_from_fields,
    unb64,
)
from colony.memory.blocks.document import BlockDocument, EditMeta, as_lines, raised_by_loro
from colony.memory.blocks.logs import MAX_LOG_FIELDS, bounded_log_value, render_log
from colony.memory.blocks.types import (
    MAX_DESCRIPTION_CHARS,
    OPERATOR,
    SYSTEM,
    BlockHistory,
    BlockInfo,
    BlockType,
    BlockView,
    EditOptions,
    EditOutcome,
    History,
    NewBlock,
    Principal,
    SharedAccess,
)

log = logging.getLogger(__name__)


Apply = Callable[[BlockDocument, EditMeta, SharedAccess, History], bytes]
APPEND_ONLY_REFUSAL = (
    "your access to this block is append-only: you may add text at its end only (core_memory_append), "
    "not insert, replace or remove text"
)
EDIT_ATTEMPTS = 10  # an edit redone after this many compactions in a row gives up


@dataclass
class _Cached:
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


class BlockStore(BlockDirectory):
    """Blocks of one colony on one Redis client (`block_store()` gives the process's instance)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: ColonySettings | None = None,
    ) -> None:
        self.redis = redis
        colony_settings = settings or load_settings()
        self.settings: BlockSettings = colony_settings.blocks
        self.namespace = BlockProtocol.namespace(colony_settings.tenant_id, colony_settings.colony_id)
        self._create = redis.register_script(scripts.CREATE)
        self._read = redis.register_script(scripts.READ)
        self._append = redis.register_script(scripts.APPEND)
        self._compact = redis.register_script(scripts.COMPACT)
        self._cache: OrderedDict[str, _Cached] = OrderedDict()

    # -- keys and cache -------------------------------------------------------------------------

    def _keys(self, block_id: str, *parts: str) -> list[str]:
        return [BlockProtocol.key(block_id, p) for p in parts]

    def _cached(self, block_id: str) -> _Cached:
        entry = self._cache.get(block_id)
        if entry is None:
            entry = self._cache[block_id] = _Cached()
            while len(self._cache) > self.settings.cached_documents:
                oldest, victim = next(iter(self._cache.items()))
                if victim.lock.locked():
                    break
                self._cache.pop(oldest)
        else:
            self._cache.move_to_end(block_id)
        return entry

    def _drop(self, block_id: str) -> None:
        entry = self._cache.get(block_id)
        if entry is not None:
            entry.document, entry.gen, entry.applied = None, "", 0

    async def _refresh(self, block_id: str, entry: _Cached, *, versions: bool = False) -> BlockDocument:
        """Bring the cached document up to Redis (the caller holds `entry.lock`); with `versions`,
        also the block's edit ids in log order (`entry.order`), read in the same script."""
        reply = await self._read(
            keys=self._keys(block_id, "meta", "snap", "log", "ver"),
            args=[entry.gen if entry.document is not None else "-", entry.applied, "1" if versions else "0"],
        )
        if reply is None:
            self._drop(block_id)
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
            self._drop(block_id)
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

    # -- creation, lookup, listing ------------------------------------------------------------------

    async def create(self, owner: str, block: NewBlock, *, created_by: Principal = SYSTEM) -> BlockInfo:
        """Create a block of agent `owner` (colony-wide blocks: `create_colony_block`)."""
        check_agent(owner)
        return await self._create_block(owner, block, created_by=created_by, colony_access=None)

    async def create_colony_block(
        self, block: NewBlock, access: SharedAccess, *, created_by: Principal = OPERATOR
    ) -> BlockInfo:
        """A colony-wide block: every agent, present and future, sees it with `access`."""
        return await self._create_block(COLONY, block, created_by=created_by, colony_access=access)

    async def _create_block(
        self, owner: str, block: NewBlock, *, created_by: Principal, colony_access: SharedAccess | None
    ) -> BlockInfo:
        if owner != COLONY:
            check_agent(owner)
        check_label(block.label)
        limit = block.char_limit or self.settings.default_char_limit
        if limit > self.settings.max_char_limit:
            raise InvalidArgument(f"char_limit {limit} is above the maximum {self.settings.max_char_limit}")
        if len(block.description) > MAX_DESCRIPTION_CHARS:
            raise InvalidArgument(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")
        self._check_text(block.content)
        if block.block_type is not BlockType.LOG and len(block.content.removesuffix("\n")) > limit:
            raise BlockEditRejected(
                f"initial content has {len(block.content)} characters; the block's limit is {limit}"
            )
        if block.block_type is BlockType.LOG and block.content:
            raise InvalidArgument(
                "a log block starts empty: the system appends its entries (leave content out)"
            )
        if owner != COLONY and await self.info_of(self.block_id(COLONY, block.label)) is not None:
            raise BlockExists(
                f"{block.label!r} is a colony-wide block every agent sees; pick another label for {owner}'s"
            )
        if owner == COLONY:
            for agent in await self.redis.smembers(BlockProtocol.owners_key(self.namespace)):
                if agent != COLONY and await self.redis.hexists(
                    BlockProtocol.owner_index(self.namespace, agent), block.label
                ):
                    raise BlockExists(
                        f"agent {agent} has a block labelled {block.label!r}; a colony block of that label "
                        "would collide with it in its view"
                    )
        if owner != COLONY and await self._shared_label(owner, block.label) is not None:
            raise BlockExists(
                f"agent {owner} already sees a shared block labelled {block.label!r}; pick another label"
            )
        index = BlockProtocol.owner_index(self.namespace, owner)
        if await self.redis.hlen(index) >= self.settings.max_blocks_per_owner:
            raise InvalidArgument(
                f"{owner} has {self.settings.max_blocks_per_owner} blocks (blocks.max_blocks_per_owner); "
                "delete one first"
            )
        block_id = self.block_id(owner, block.label)
        document = BlockDocument()
        meta = EditMeta(created_by, "system" if created_by == SYSTEM else "library", "create", "created")
        if block.block_type is BlockType.LOG:
            document.create("", meta)
        else:
            document.create(block.content, meta)
        now = time.time()
        fields: dict[str, Any] = {
            "owner": owner,
            "label": block.label,
            "description": clean_text(block.description),
            "block_type": block.block_type.value,
            "char_limit": limit,
            "read_only": "1" if block.read_only else "0",
            "swapped_out": "0",
            "template": block.template or "",
            "colony_access": colony_access.value if colony_access else "",
            "log_max_entries": block.log_max_entries
            or (self.settings.log_max_entries if block.block_type is BlockType.LOG else ""),
            "log_shown_entries": block.log_shown_entries
            or (self.settings.log_shown_entries if block.block_type is BlockType.LOG else ""),
            "created_at": repr(now),
            "updated_at": repr(now),
            "created_by": created_by,
            # a fresh token per snapshot (not a counter): a process that cached a deleted block
            # must not mistake a new block of the same label for it
            "gen": uuid.uuid4().hex[:16],
            "vbase": "0",
        }
        args: list[Any] = [b64(document.snapshot()), document.last_edit_id]
        for name, value in fields.items():
            args += [name, str(value)]
        created = await self._create(keys=self._keys(block_id, "meta", "snap", "log", "ver"), args=args)
        if not created:
            raise BlockExists(f"{owner} already has a block labelled {block.label!r}")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(index, block.label, block_id)
            pipe.sadd(BlockProtocol.owners_key(self.namespace), owner)
            await pipe.execute()
        return info_from_fields({k: str(v) for k, v in fields.items()}, block_id)

    async def ensure(self, owner: str, block: NewBlock, *, created_by: Principal = SYSTEM) -> BlockInfo:
        """The block, created if missing (templates and capabilities call this at start)."""
        try:
            return await self.create(owner, block, created_by=created_by)
        except BlockExists:
            info = await self.info_of(self.block_id(owner, block.label))
            if info is None:
                raise
            return info

    def _forget(self, block_id: str) -> None:
        self._cache.pop(block_id, None)

    # -- reading ------------------------------------------------------------------------------------

    async def read(
        self, principal: Principal, label: str, *, owner: str | None = None, version: int | None = None
    ) -> BlockView:
        info, access = await self.resolve(principal, label, owner=owner)
        entry = self._cached(info.block_id)
        async with entry.lock:
            past = version is not None
            document = await self._refresh(info.block_id, entry, versions=past)
            head = entry.head
            if version is None or version == head:
                content, entries = document.content(), document.entries()
                version_out, is_head = head, True
            else:
                content, entries = document.view(version, entry.order or [], entry.vbase)
                version_out, is_head = version, False
            fresh = info_from_fields(entry.fields, info.block_id)
        if fresh.block_type is BlockType.LOG:
            content = render_log(entries, fresh.log_shown_entries or self.settings.log_shown_entries)
        return BlockView(
            info=fresh,
            content=content,
            chars=len(content.removesuffix("\n")),
            version=version_out,
            access=access,
            entries=entries if fresh.block_type is BlockType.LOG else None,
            head=is_head,
        )

    async def history(
        self, principal: Principal, label: str, *, owner: str | None = None, limit: int = 100
    ) -> BlockHistory:
        info, _ = await self.resolve(principal, label, owner=owner)
        entry = self._cached(info.block_id)
        async with entry.lock:
            document = await self._refresh(info.block_id, entry, versions=True)
            versions = document.versions(entry.order or [], entry.vbase)
            head, base = entry.head, entry.vbase
        limit = max(1, min(limit, 10_000))
        return BlockHistory(
            block_id=info.block_id,
            label=info.label,
            owner=info.owner,
            versions=versions[-limit:],
            head=head,
            oldest_viewable=base + 1,
        )

    # -- edits ----------------------------------------------------------------------------------

    async def _edit(
        self,
        principal: Principal,
        label: str,
        op: str,
        needs: str,
        apply: Apply,
        **options: Unpack[EditOptions],
    ) -> EditOutcome:
        """`_apply_edit`, counted by operation and outcome (colony_block_edits_total)."""
        try:
            outcome = await self._apply_edit(principal, label, op, needs, apply, **options)
        except BlockError as exc:
            metrics.BLOCK_EDITS.labels(op, _refusal(exc)).inc()
            raise
        except InvalidArgument:
            metrics.BLOCK_EDITS.labels(op, "invalid").inc()
            raise
        metrics.BLOCK_EDITS.labels(op, "applied").inc()
        return outcome

    async def _apply_edit(
        self,
        principal: Principal,
        label: str,
        op: str,
        needs: str,
        apply: Apply,
        *,
        owner: str | None = None,
        via: str = "library",
        message: str = "",
        base_version: int | None = None,
    ) -> EditOutcome:
        """Check access, apply `apply(document, meta, access, history)` -> update, check the
        character limit, append the update to the log (folding the log when it is long). An edit
        whose block was compacted between its read and its append is redone on the new snapshot
        (its update could depend on history the snapshot folded away)."""
        info, access = await self.resolve(principal, label, owner=owner)
        if principal != SYSTEM:
            check_access(info, access, needs, principal)
        meta = EditMeta(principal, via, op, clean_text((message or "")[:500]))
        entry = self._cached(info.block_id)
        for attempt in range(EDIT_ATTEMPTS):
            if attempt:  # the last try met a compaction: let the compactor's burst pass
                await asyncio.sleep(random.uniform(0, 0.005 * attempt))
            async with entry.lock:
                document = await self._refresh(info.block_id, entry, versions=op in ("rollback", "undo"))
                if base_version is not None and entry.head != base_version:
                    raise BlockVersionConflict(
                        f"block {label!r} is at version {entry.head}, not {base_version}; read it again "
                        "and redo the edit on the current content (or leave base_version out to merge)",
                        current_version=entry.head,
                    )
                before = document.size()
                try:
                    update = apply(document, meta, access, History(entry.order or [], entry.vbase))
                except BaseException as exc:
                    self._drop(info.block_id)  # the cached document may hold a partial local change
                    if not raised_by_loro(exc):
                        raise
                    raise BlockError(f"the edit of block {label!r} failed in Loro: {exc}") from exc
                after = document.size()
                limit = int(entry.fields.get("char_limit", info.char_limit))
                if info.block_type is not BlockType.LOG and after > limit and after > before:
                    self._drop(info.block_id)
                    raise BlockLimitExceeded(
                        f"block {label!r} would have {after}/{limit} characters (it has {before}); nothing "
                        "was changed. Shorten it first (core_memory_replace or memory_rethink), move "
                        "details to archival memory (archival_insert), or raise its char_limit"
                    )
                try:
                    reply = await self._append(
                        keys=self._keys(info.block_id, "meta", "log", "ver"),
                        args=[b64(update), repr(time.time()), document.last_edit_id, entry.gen],
                    )
                except Exception:
                    self._drop(info.block_id)
                    raise
                if reply == -1:
                    self._drop(info.block_id)
                    raise BlockNotFound(f"block {label!r} was deleted while being edited")
                if reply == -2:  # compacted meanwhile: reload and redo (after a short, growing pause)
                    self._drop(info.block_id)
                    continue
                length, version = int(reply[0]), int(reply[1])
                if length > self.settings.compact_after_updates:
                    try:  # the edit is stored: folding is housekeeping, retried by the next edit
                        await self._fold(info.block_id, entry, info)
                    except Exception as exc:
                        self._drop(info.block_id)
                        log.warning("block %s: folding the update log failed (%r); will retry", label, exc)
            return EditOutcome(
                block_id=info.block_id,
                label=info.label,
                owner=info.owner,
                version=version,
                chars=after,
                char_limit=limit,
                op=op,
            )
        raise BlockError(
            f"block {label!r} was compacted {EDIT_ATTEMPTS} times while this edit was made; nothing was "
            "changed, try again"
        )

    async def _fold(self, block_id: str, entry: _Cached, info: BlockInfo) -> None:
        """Fold the update log into the snapshot (the caller holds the lock): a full snapshot, or a
        shallow one when more than `history_versions` versions are listed (a LOG block keeps as many
        versions as entries: older ones say nothing its cap kept)."""
        document = await self._refresh(block_id, entry, versions=True)
        keep = self.settings.history_versions
        if info.block_type is BlockType.LOG:
            keep = max(10, min(keep, info.log_max_entries or self.settings.log_max_entries))
        snapshot, dropped = document.compacted(entry.order or [], keep)
        done = await self._compact(
            keys=self._keys(block_id, "meta", "snap", "log", "ver"),
            args=[entry.gen, entry.applied, b64(snapshot), uuid.uuid4().hex[:16], dropped],
        )
        if done:
            metrics.BLOCK_COMPACTIONS.labels("shallow" if dropped else "full").inc()
            self._drop(block_id)  # the next use loads the new snapshot

    async def append(
        self, principal: Principal, label: str, text: str, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Add `text` as a line at the end."""
        self._check_text(text)
        return await self._edit(
            principal, label, "append", "append", lambda d, m, a, b: d.append(text, m), **options
        )

    async def insert(
        self, principal: Principal, label: str, text: str, line: int = -1, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Insert `text` as a line before line `line` (0 = top, -1 = the end; append-only access:
        the end only)."""
        self._check_text(text)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            at_end = line in (-1, document.line_count())
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM and not at_end:
                raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
            return document.insert_line(text, line, meta)

        return await self._edit(principal, label, "insert", "append", apply, **options)

    async def replace(
        self, principal: Principal, label: str, old: str, new: str, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Replace the one occurrence of `old` by `new` (append-only: only when `new` keeps `old`)."""
        self._check_text(old)
        self._check_text(new)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM:
                raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
            return document.replace(old, new, meta)

        return await self._edit(principal, label, "replace", "append", apply, **options)

    async def set_content(
        self,
        principal: Principal,
        label: str,
        content: str,
        *,
        op: str = "rethink",
        **options: Unpack[EditOptions],
    ) -> EditOutcome:
        """Rewrite the whole content (append-only: only when nothing is deleted)."""
        self._check_text(content)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM:
                if not as_lines(content).startswith(document.content()):
                    raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
                return document.set_content(content, meta, inserts_only=True)  # adds at the end only
            return document.set_content(content, meta)

        return await self._edit(principal, label, op, "append", apply, **options)

    async def rollback(
        self, principal: Principal, label: str, version: int, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """A new version whose content is `version`'s (the versions in between stay)."""
        options["message"] = options.get("message") or f"rollback to v{version}"
        options.pop("base_version", None)
        return await self._edit(
            principal,
            label,
            "rollback",
            "write",
            lambda d, m, a, h: d.rollback(version, m, h.order, h.base),
            **options,
        )

    async def undo(
        self, principal: Principal, label: str, *, author: str | None = None, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Undo `author`'s (default: the principal's) latest edit, keeping everyone else's."""
        who = author or principal
        options.pop("base_version", None)
        return await self._edit(
            principal, label, "undo", "write", lambda d, m, a, h: d.undo_last_of(who, m, h.order), **options
        )

    async def log_append(
        self, owner: str, label: str, entry: dict[str, Any], *, via: str = "system"
    ) -> EditOutcome:
        """The system appends an entry to a rolling LOG block (capped at its log_max_entries)."""
        info = await self.info_of(self.block_id(owner, label))
        if info is None:
            raise BlockNotFound(f"{owner} has no log block labelled {label!r}")
        if info.block_type is not BlockType.LOG:
            raise InvalidArgument(f"block {label!r} of {owner} is not a LOG block")
        cap = info.log_max_entries or self.settings.log_max_entries
        stamped = {
            "at": round(time.time(), 3),
            **{str(k)[:64]: bounded_log_value(v) for k, v in list(entry.items())[:MAX_LOG_FIELDS]},
        }
        return await self._edit(
            SYSTEM,
            label,
            "log",
            "append",
            lambda d, m, a, b: d.log_append(stamped, cap, m),
            owner=owner,
            via=via,
        )

    def _check_text(self, text: str) -> None:
        if not isinstance(text, str):
            raise InvalidArgument("block text must be a string")
        if not encodable(text):
            raise BlockEditRejected("the text holds a lone surrogate (not valid Unicode); send valid UTF-8")
        if len(text) > self.settings.max_edit_chars:
            raise BlockEditRejected(
                f"the edit carries {len(text)} characters; one edit takes at most "
                f"{self.settings.max_edit_chars}"
            )


def _refusal(exc: BlockError) -> str:
    """The outcome label of a refused edit."""
    if isinstance(exc, BlockAccessDenied):
        return "access"
    if isinstance(exc, BlockLimitExceeded):
        return "limit"
    if isinstance(exc, BlockVersionConflict):
        return "conflict"
    return "invalid"
