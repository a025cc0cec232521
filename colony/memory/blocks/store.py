"""Memory blocks in Redis: a Loro snapshot + an append-only update log per block, access checked on
every call.

An edit loads the block (a per-process cache imports only the updates it has not seen), checks the
caller's access, applies the edit as one Loro commit and appends that commit's update to the log.
Concurrent edits from other processes are other updates in the same log: Loro merges them, so
nothing is lost and nobody gets a conflict (unless a client asked to edit from a given version).
When the log grows past `compact_after_updates` it is folded into the snapshot (a shallow one once
history exceeds `history_versions`); a generation number makes concurrent compactions safe.

Every non-LOG edit is appended only if no other update was appended since its editor read the
block (compare-and-set in the append script, which also checks the limit in the metadata): an
edit overtaken by another writer is redone on the new content, so concurrent writers never carry a
block past its character limit. An edit given an action's idempotency key gets an edit id derived
from it: the action redone after a crash finds that id in the block's versions and gets the first
outcome back, the edit is not made twice.

Metadata hash fields: owner, label, description, block_type, char_limit, read_only, swapped_out,
template, colony_access, log_max_entries, log_shown_entries, created_at, updated_at, created_by,
gen (a fresh token per snapshot), vbase (versions trimmed from the front of the `ver` list), chars
(the content's length after the latest edit).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any, Unpack

import redis.asyncio as aioredis

from colony import metrics
from colony.blackboard.protocol import BlockProtocol
from colony.config import BlockSettings, ColonySettings
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
from colony.memory.blocks.cache import Apply, DocumentCache
from colony.memory.blocks.directory import (
    COLONY,
    BlockDirectory,
    check_access,
    check_agent,
    check_label,
    clean_text,
    encodable,
    info_from_fields,
)
from colony.memory.blocks.document import BlockDocument, EditMeta, as_lines
from colony.memory.blocks.listing import BlockListing
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

APPEND_ONLY_REFUSAL = (
    "your access to this block is append-only: you may add text at its end only (core_memory_append), "
    "not insert, replace or remove text"
)


class BlockStore(BlockDirectory):
    """Blocks of one colony on one Redis client (`block_store()` gives the process's instance)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: ColonySettings,
        *,
        tenant: str | None = None,
    ) -> None:
        """`tenant`: whose blocks it holds (default: the colony's own tenant's); the agents it
        checks are the colony's (its registry, under the colony's own tenant)."""
        self.redis = redis
        colony_settings = settings
        self.settings: BlockSettings = colony_settings.blocks
        self.block_tenant = tenant or colony_settings.tenant_id
        self.namespace = BlockProtocol.namespace(self.block_tenant, colony_settings.colony_id)
        self.tenant_id, self.colony_id = colony_settings.tenant_id, colony_settings.colony_id
        self.documents = DocumentCache(redis, self.settings)
        self.listing = BlockListing(
            redis, self.namespace, self.settings.max_blocks_per_owner, self.settings.max_shares_per_block
        )

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
        limit = _checked_char_limit(block, self.settings)
        block_id = self.block_id(owner, block.label)
        # listed first, checked in the same script (view collisions, max_blocks_per_owner); then the
        # block's keys (another hash slot), which CREATE writes only if the block does not exist
        await self.listing.list_label(owner, block.label, block_id)
        fields = _new_block_fields(owner, block, limit, created_by, colony_access, self.settings)
        document = _first_document(block, created_by)
        fields["chars"] = document.size()
        if not await self.documents.write_new(block_id, document, fields):
            raise BlockExists(f"{owner} already has a block labelled {block.label!r}")
        return info_from_fields({k: str(v) for k, v in fields.items()}, block_id)

    async def _check_label_free(self, owner: str, label: str) -> None:
        """Raise BlockExists when a block `owner` would create as `label` collides in a view: an
        agent's with a colony-wide one or one shared with it; a colony-wide one with any agent's.
        A read-only early check (an import's plan); creation checks again atomically as it lists
        the label (colony.memory.blocks.listing)."""
        if owner != COLONY and await self.info_of(self.block_id(COLONY, label)) is not None:
            raise BlockExists(
                f"{label!r} is a colony-wide block every agent sees; pick another label for {owner}'s"
            )
        if owner == COLONY:
            for agent in await self.redis.smembers(BlockProtocol.owners_key(self.namespace)):
                if agent != COLONY and await self.redis.hexists(
                    BlockProtocol.owner_index(self.namespace, agent), label
                ):
                    raise BlockExists(
                        f"agent {agent} has a block labelled {label!r}; a colony block of that label "
                        "would collide with it in its view"
                    )
        if owner != COLONY and await self._shared_label(owner, label) is not None:
            raise BlockExists(
                f"agent {owner} already sees a shared block labelled {label!r}; pick another label"
            )

    async def ensure(self, owner: str, block: NewBlock, *, created_by: Principal = SYSTEM) -> BlockInfo:
        """The block, created if missing (templates and capabilities call this at start)."""
        try:
            return await self.create(owner, block, created_by=created_by)
        except BlockExists:
            info = await self.info_of(self.block_id(owner, block.label))
            if info is None:
                raise
            return info

    # -- reading ------------------------------------------------------------------------------------

    async def read(
        self, principal: Principal, label: str, *, owner: str | None = None, version: int | None = None
    ) -> BlockView:
        info, access = await self.resolve(principal, label, owner=owner)
        entry = self.documents.entry(info.block_id)
        async with entry.lock:
            past = version is not None
            document = await self.documents.refresh(info.block_id, entry, versions=past)
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
        entry = self.documents.entry(info.block_id)
        async with entry.lock:
            document = await self.documents.refresh(info.block_id, entry, versions=True)
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
        *,
        owner: str | None = None,
        via: str = "library",
        message: str = "",
        base_version: int | None = None,
        idempotency_key: str | None = None,
        what: tuple[Any, ...] = (),
    ) -> EditOutcome:
        """Check access and commit `apply(document, meta, access, history)` -> update
        (`DocumentCache.commit`), counted by operation and outcome (colony_block_edits_total).
        With `idempotency_key` (an action's), the edit's id derives from it and from the edit
        (`what`): made once, its outcome returned again to a redo."""
        try:
            info, access = await self.resolve(principal, label, owner=owner)
            if principal != SYSTEM:
                check_access(info, access, needs, principal)
            edit_id = _edit_id(idempotency_key, info.block_id, principal, op, what) if idempotency_key else ""
            meta = EditMeta(principal, via, op, clean_text((message or "")[:500]), edit_id)
            outcome = await self.documents.commit(info, access, meta, apply, op=op, base_version=base_version)
        except BlockError as exc:
            metrics.BLOCK_EDITS.labels(op, _refusal(exc)).inc()
            raise
        except InvalidArgument:
            metrics.BLOCK_EDITS.labels(op, "invalid").inc()
            raise
        metrics.BLOCK_EDITS.labels(op, "repeated" if outcome._repeated else "applied").inc()
        return outcome

    async def append(
        self, principal: Principal, label: str, text: str, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Add `text` as a line at the end."""
        _check_text(self.settings, text)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            return document.append(text, meta)

        return await self._edit(principal, label, "append", "append", apply, what=(text,), **options)

    async def insert(
        self, principal: Principal, label: str, text: str, line: int = -1, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Insert `text` as a line before line `line` (0 = top, -1 = the end; append-only access:
        the end only)."""
        _check_text(self.settings, text)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            at_end = line in (-1, document.line_count())
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM and not at_end:
                raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
            return document.insert_line(text, line, meta)

        return await self._edit(principal, label, "insert", "append", apply, what=(text, line), **options)

    async def replace(
        self, principal: Principal, label: str, old: str, new: str, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Replace the one occurrence of `old` by `new` (append-only: only when `new` keeps `old`)."""
        _check_text(self.settings, old)
        _check_text(self.settings, new)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM:
                raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
            return document.replace(old, new, meta)

        return await self._edit(principal, label, "replace", "append", apply, what=(old, new), **options)

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
        _check_text(self.settings, content)

        def apply(document: BlockDocument, meta: EditMeta, access: SharedAccess, history: History) -> bytes:
            if access is SharedAccess.APPEND_ONLY and principal != SYSTEM:
                if not as_lines(content).startswith(document.content()):
                    raise BlockAccessDenied(APPEND_ONLY_REFUSAL)
                return document.set_content(content, meta, inserts_only=True)  # adds at the end only
            return document.set_content(content, meta)

        return await self._edit(principal, label, op, "append", apply, what=(content,), **options)

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
            what=(version,),
            **options,
        )

    async def undo(
        self, principal: Principal, label: str, *, author: str | None = None, **options: Unpack[EditOptions]
    ) -> EditOutcome:
        """Undo `author`'s (default: the principal's) latest edit, keeping everyone else's."""
        who = author or principal
        options.pop("base_version", None)
        return await self._edit(
            principal,
            label,
            "undo",
            "write",
            lambda d, m, a, h: d.undo_last_of(who, m, h.order),
            what=(who,),
            **options,
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


def _edit_id(key: str, block_id: str, principal: str, op: str, what: tuple[Any, ...]) -> str:
    """The id of the edit an action makes under idempotency key `key`: the same for the same edit
    redone under that key (so it is found made), another for any other edit, block or author."""
    text = json.dumps([key, block_id, principal, op, list(what)], separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def _refusal(exc: BlockError) -> str:
    """The outcome label of a refused edit."""
    if isinstance(exc, BlockAccessDenied):
        return "access"
    if isinstance(exc, BlockLimitExceeded):
        return "limit"
    if isinstance(exc, BlockVersionConflict):
        return "conflict"
    return "invalid"


def _check_text(settings: BlockSettings, text: str) -> None:
    """Refuse text a block cannot take: not a string, not valid Unicode, over `max_edit_chars`."""
    if not isinstance(text, str):
        raise InvalidArgument("block text must be a string")
    if not encodable(text):
        raise BlockEditRejected("the text holds a lone surrogate (not valid Unicode); send valid UTF-8")
    if len(text) > settings.max_edit_chars:
        raise BlockEditRejected(
            f"the edit carries {len(text)} characters; one edit takes at most {settings.max_edit_chars}"
        )


def _checked_char_limit(block: NewBlock, settings: BlockSettings) -> int:
    """The character limit of new block `block`, after checking its label, description, limit
    and initial content."""
    check_label(block.label)
    limit = block.char_limit or settings.default_char_limit
    if limit > settings.max_char_limit:
        raise InvalidArgument(f"char_limit {limit} is above the maximum {settings.max_char_limit}")
    if len(block.description) > MAX_DESCRIPTION_CHARS:
        raise InvalidArgument(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")
    _check_text(settings, block.content)
    if block.block_type is not BlockType.LOG and len(block.content.removesuffix("\n")) > limit:
        raise BlockEditRejected(
            f"initial content has {len(block.content)} characters; the block's limit is {limit}"
        )
    if block.block_type is BlockType.LOG and block.content:
        raise InvalidArgument("a log block starts empty: the system appends its entries (leave content out)")
    return limit


def _first_document(block: NewBlock, created_by: Principal) -> BlockDocument:
    """The document of a new block: its initial content as version 1 (a LOG block's empty)."""
    document = BlockDocument()
    meta = EditMeta(created_by, "system" if created_by == SYSTEM else "library", "create", "created")
    if block.block_type is BlockType.LOG:
        document.create("", meta)
    else:
        document.create(block.content, meta)
    return document


def _new_block_fields(
    owner: str,
    block: NewBlock,
    limit: int,
    created_by: Principal,
    colony_access: SharedAccess | None,
    settings: BlockSettings,
) -> dict[str, Any]:
    """The metadata hash of a new block (the fields the module's docstring lists)."""
    now = time.time()
    is_log = block.block_type is BlockType.LOG
    return {
        "owner": owner,
        "label": block.label,
        "description": clean_text(block.description),
        "block_type": block.block_type.value,
        "char_limit": limit,
        "read_only": "1" if block.read_only else "0",
        "swapped_out": "0",
        "template": block.template or "",
        "colony_access": colony_access.value if colony_access else "",
        "log_max_entries": block.log_max_entries or (settings.log_max_entries if is_log else ""),
        "log_shown_entries": block.log_shown_entries or (settings.log_shown_entries if is_log else ""),
        "created_at": repr(now),
        "updated_at": repr(now),
        "created_by": created_by,
        # a fresh token per snapshot (not a counter): a process that cached a deleted block
        # must not mistake a new block of the same label for it
        "gen": uuid.uuid4().hex[:16],
        "vbase": "0",
    }
