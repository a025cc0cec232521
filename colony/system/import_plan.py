"""What an agent import will write, checked against this colony before it writes anything
(docs/transfer.md, step 4): every block fits this colony's block limits (char limits, blocks per
owner, labels no colony-wide or shared block of the agent's view already has), and every memory
entry passes the memory store's own checks (content, tags, payload size). A document refused here
leaves no key; what can still fail after it (Redis, a crash) is undone by the import.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import ValidationError

from colony.blackboard import Blackboard
from colony.blackboard.protocol import BlackboardProtocol
from colony.errors import AgentStateConflict, ColonyError, ImportRejected, InvalidKey
from colony.memory.blocks import BlockType, NewBlock
from colony.memory.blocks.store import BlockStore
from colony.memory.store import MemoryStore
from colony.memory.types import NewMemory
from colony.system.export_document import BLOCK_SETTINGS, AgentExport


@dataclass
class ImportPlan:
    """The document's blocks and memory entries as this colony's stores take them."""

    blocks: list[NewBlock]
    memories: list[tuple[str, list[NewMemory]]]  # (target scope, its entries)


async def plan_import(
    store: BlockStore, memory: MemoryStore, board: Blackboard, doc: AgentExport, *, replace: bool
) -> ImportPlan:
    """The import's blocks and entries, each checked as its store will check it; ImportRejected
    (422) naming the block or entry, AgentStateConflict (409) for blocks the id has without
    `replace`."""
    blocks = new_blocks(store, doc)
    await _check_block_room(store, doc, replace)
    memories = new_memories(board, doc)
    for (_, entries), scope in zip(memories, doc.memory, strict=True):
        for entry in entries:
            try:
                memory._check(entry)  # the check write_many makes
            except ColonyError as exc:
                raise ImportRejected(
                    f"memory entry {entry.entry_id} of {scope.namespace} cannot be written here: {exc}"
                ) from None
    return ImportPlan(blocks=blocks, memories=memories)


def new_blocks(store: BlockStore, doc: AgentExport) -> list[NewBlock]:
    """The document's blocks as blocks to create, checked against this colony's block limits."""
    blocks = []
    for index, block in enumerate(doc.blocks):
        content = "" if block.block_type is BlockType.LOG else block.content
        limit = block.char_limit
        if limit > store.settings.max_char_limit or len(content.removesuffix("\n")) > limit:
            raise ImportRejected(
                f"blocks[{index}] {block.label!r} does not fit this colony's blocks (char_limit {limit}, "
                f"content {len(content)} characters, blocks.max_char_limit {store.settings.max_char_limit})"
            )
        blocks.append(NewBlock(**block.model_dump(include=BLOCK_SETTINGS | {"template"}), content=content))
    return blocks


async def _check_block_room(store: BlockStore, doc: AgentExport, replace: bool) -> None:
    """Blocks the id owns here (an old agent's, or provisioned for it): 409 unless `replace`, which
    deletes them all and creates the document's (so the document's blocks alone count)."""
    owned = {info.label for info in await store.list_owned(doc.agent_id)}
    labels = [b.label for b in doc.blocks]
    if owned and not replace:
        raise AgentStateConflict(
            f"agent {doc.agent_id} already owns blocks here ({', '.join(sorted(owned)[:20])}: an agent's, "
            "or provisioned for it); import with replace=true to replace them with the document's, or "
            "delete them first"
        )
    total, cap = len(labels), store.settings.max_blocks_per_owner
    if total > cap:
        raise ImportRejected(
            f"blocks: the agent would own {total} blocks here (the document's), over "
            f"blocks.max_blocks_per_owner ({cap}): trim the document's blocks or raise that setting"
        )
    for index, label in enumerate(labels):
        try:
            await store._check_label_free(doc.agent_id, label)
        except ColonyError as exc:
            raise ImportRejected(f"blocks[{index}] {label!r} cannot be created here: {exc}") from None


def new_memories(board: Blackboard, doc: AgentExport) -> list[tuple[str, list[NewMemory]]]:
    """The document's memory entries as entries to write, by target scope (the agent's own scopes
    here); entries expired in transit are dropped."""
    now, scopes = time.time(), []
    for scope in doc.memory:
        target = BlackboardProtocol.namespaced_scope(board.scope_id, scope.namespace)
        memories = []
        for e in scope.entries:
            if e.expires_at is not None and e.expires_at <= now:
                continue  # expired in transit
            try:
                ttl = e.expires_at - now if e.expires_at is not None else None
                kept = e.model_dump(exclude={"created_at", "expires_at", "tags"})
                memories.append(NewMemory(**kept, tags=frozenset(e.tags), ttl_seconds=ttl))
            except (ValidationError, InvalidKey) as exc:
                raise ImportRejected(f"memory entry {e.entry_id} of {scope.namespace}: {exc}") from None
        scopes.append((target, memories))
    return scopes
