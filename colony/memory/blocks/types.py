"""What a memory block is, who may do what to it, and what its history looks like.

A block is a labelled, described piece of text an agent keeps in its prompt (CORE always, WORKING
unless swapped out, LOG as its last entries). Its content lives in a Loro document; these models
are the metadata and the views callers get back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints

LABEL_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")
Label = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
MAX_DESCRIPTION_CHARS = 1000
MAX_MESSAGE_CHARS = 500
MAX_TEMPLATE_NAME_CHARS = 64


class BlockType(StrEnum):
    """Where a block goes in the prompt: CORE always, WORKING unless swapped out, LOG as its
    last entries (system-written, read-only to agents)."""

    CORE = "core"
    WORKING = "working"
    LOG = "log"


class SharedAccess(StrEnum):
    """What an agent may do with a block it does not own (colony blocks: every agent)."""

    READ_ONLY = "read_only"
    APPEND_ONLY = "append_only"
    READ_WRITE = "read_write"

    @property
    def can_write(self) -> bool:
        return self is not SharedAccess.READ_ONLY

    @property
    def can_delete(self) -> bool:
        return self is SharedAccess.READ_WRITE


class BlockInfo(BaseModel):
    """A block's metadata (no content)."""

    model_config = ConfigDict(frozen=True)

    block_id: str
    owner: str
    label: str
    description: str
    block_type: BlockType
    char_limit: int
    read_only: bool = False
    swapped_out: bool = False
    template: str | None = None
    colony_access: SharedAccess | None = None  # set on colony-wide blocks only
    log_max_entries: int | None = None
    log_shown_entries: int | None = None
    created_at: float
    updated_at: float
    created_by: str

    @property
    def is_colony(self) -> bool:
        return self.colony_access is not None


class BlockView(BaseModel):
    """A block as one agent sees it: metadata, content at a version, and that agent's access."""

    info: BlockInfo
    content: str
    chars: int
    version: int
    access: SharedAccess
    entries: list[dict[str, Any]] | None = None  # LOG blocks: the entries (newest last)
    head: bool = True  # False when this is a historical view (read-only)


class BlockVersion(BaseModel):
    """One edit in a block's history (version 1 is the creation)."""

    version: int
    edit_id: str
    author: str
    via: str
    op: str
    message: str = ""
    timestamp: float
    chars_delta: int = 0


class BlockHistory(BaseModel):
    block_id: str
    label: str
    owner: str
    versions: list[BlockVersion]
    head: int
    oldest_viewable: int  # versions below this were folded into a shallow snapshot


class EditOutcome(BaseModel):
    """What an accepted edit did (`chars`: the block's length right after it)."""

    block_id: str
    label: str
    owner: str
    version: int
    chars: int
    char_limit: int
    op: str
    # True when the edit was found made before (a redone action) and not applied again
    _repeated: bool = PrivateAttr(default=False)


class NewBlock(BaseModel):
    """A block to create (HTTP body and library argument)."""

    model_config = ConfigDict(extra="forbid")

    label: Label
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] = ""
    block_type: BlockType = BlockType.WORKING
    char_limit: Annotated[int, Field(ge=1)] | None = None
    read_only: bool = False
    content: str = ""
    template: Annotated[str, Field(max_length=MAX_TEMPLATE_NAME_CHARS)] | None = None
    log_max_entries: Annotated[int, Field(ge=1, le=10_000)] | None = None
    log_shown_entries: Annotated[int, Field(ge=1, le=1000)] | None = None


class Share(BaseModel):
    """A grant of one agent's access to another owner's block."""

    block_id: str
    owner: str
    label: str
    agent_id: str
    access: SharedAccess


Principal = str  # an agent id, or SYSTEM / OPERATOR below
SYSTEM = "_system"  # Colony itself (rolling logs, templates): not bound by access levels
OPERATOR = "_operator"  # the HTTP API's colony endpoints (bearer token): owns colony blocks
EditVia = Literal["tool", "http", "system", "cli", "library"]


@dataclass(frozen=True)
class History:
    """The block's edit ids in log order and how many versions came before the first."""

    order: list[str]
    base: int


class EditOptions(TypedDict, total=False):
    """Options every edit takes: `owner` (another owner's block, or COLONY), `via` (the channel
    kept in history: tool, http, cli, library, system), `message` (a note kept in history) and
    `base_version` (edit only if the block is still at that version: BlockVersionConflict if not),
    `idempotency_key` (an action's: the edit is made once, a redo under that key gets its outcome)."""

    owner: str | None
    via: str
    message: str
    base_version: int | None
    idempotency_key: str | None
