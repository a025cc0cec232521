"""Loro-versioned memory blocks: core / working / log blocks per agent and colony-wide, shared with
access levels, full history with rollback and selective undo (docs/blocks.md)."""

from colony.memory.blocks.document import BlockDocument, EditMeta
from colony.memory.blocks.logs import render_log
from colony.memory.blocks.store import COLONY, BlockStore
from colony.memory.blocks.stores import agent_block_store, block_store
from colony.memory.blocks.types import (
    OPERATOR,
    SYSTEM,
    BlockHistory,
    BlockInfo,
    BlockType,
    BlockVersion,
    BlockView,
    EditOutcome,
    NewBlock,
    Share,
    SharedAccess,
)

__all__ = [
    "COLONY",
    "OPERATOR",
    "SYSTEM",
    "BlockDocument",
    "BlockHistory",
    "BlockInfo",
    "BlockStore",
    "BlockType",
    "BlockVersion",
    "BlockView",
    "EditMeta",
    "EditOutcome",
    "NewBlock",
    "Share",
    "SharedAccess",
    "agent_block_store",
    "block_store",
    "render_log",
]
