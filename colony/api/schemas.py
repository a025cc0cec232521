"""What the API accepts and answers, as declared in its OpenAPI document.

Every identifier that reaches a Redis key (run ids, agent ids, namespaces, page ids, replica ids)
is checked against `ID_PATTERN` at the edge, so a key is never built from raw input. Every route
declares each status it can answer with, and errors share one body model, `ErrorBody`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from colony.memory.shared import MAX_MEMBERS as MAX_SHARED_MEMBERS
from colony.memory.shared import AgentRef as SharedAgentRef
from colony.memory.shared import SharedScopeInfo
from colony.memory.types import MemoryEntry, RecalledEntry
from colony.wire.ids import ID_RULE, Identifier

AgentStateName = Literal["initialized", "running", "waiting", "idle", "suspended", "stopped", "failed"]


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. not_found, invalid_request")
    message: str = Field(description="what went wrong and what to do about it")


class ErrorBody(BaseModel):
    """Every error answer: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


class MapSource(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"path": "/srv/code"}]})

    path: str = Field(
        min_length=1, max_length=4096, description="a folder (or git checkout) under vcm.allowed_roots"
    )
    page_tokens: int = Field(2048, ge=64, le=1_000_000)

    @field_validator("path")
    @classmethod
    def _encodable(cls, value: str) -> str:
        """A path the OS can be asked about: no NUL byte, valid Unicode (else os.* raises, a 500)."""
        if "\x00" in value:
            raise ValueError("a path cannot hold a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a path must be valid Unicode (it holds a lone surrogate)") from None
        return value


class MappedSource(BaseModel):
    source_id: str
    path: str
    pages: list[dict[str, Any]]


class Health(BaseModel):
    status: str
    version: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "the request is malformed (e.g. a body that is not JSON, a bad Last-Event-ID)",
        401: "missing or wrong bearer token",
        403: "the token may not do this (a verb it lacks; docs/api.md, Scoped tokens), or the path is "
        "outside vcm.allowed_roots",
        404: "no such run, agent or feature",
        409: "the agent is not in a state that allows this",
        410: "the run ended and was removed after runs.retention_seconds (retired): its result is gone",
        413: "the request body (or the source to map) is too large",
        422: "a parameter or body field is invalid; the message names it",
        429: "the agent already has its max_concurrent_runs runs open; retry after Retry-After seconds",
        503: "Redis or a replica is unavailable; retry later",
    }
    answers: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": what[status]} for status in statuses
    }
    if 429 in answers:
        answers[429]["headers"] = {
            "Retry-After": {
                "description": "seconds to wait before trying again",
                "schema": {"type": "integer"},
            },
        }
    return answers


COMMON = (401, 403, 422, 503)
READ_ONE = _errors(*COMMON, 404)
RUN_ONE = _errors(*COMMON, 404, 410)
SUBMIT = _errors(*COMMON, 400, 404, 413, 429)
EVENTS = _errors(*COMMON, 400, 404, 410)
CONTROL = _errors(*COMMON, 404, 409)
MAP_SOURCE = _errors(*COMMON, 400, 403, 404, 413)
LISTING = _errors(*COMMON)
WITH_BODY = _errors(*COMMON, 400)
NO_PARAMS = _errors(401, 403, 503)
PAGES = _errors(*COMMON, 404)

# one server-sent event: `data` is the run event as JSON text (event_type, data, seq, ...)
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["id", "event", "data"],
}

# a submit with `stream: true`: the run's event stream, its id in a header
SUBMIT_STREAM: dict[str, Any] = {
    "description": "with `stream: true`: the run's events (as GET /v1/runs/{run_id}/events sends "
    "them); with `wait_s`: the run, ended within the wait (as GET /v1/runs/{run_id} shows it)",
    "content": {
        "text/event-stream": {"schema": SSE_EVENT},
        "application/json": {"schema": {"$ref": "#/components/schemas/RunView"}},
    },
    "headers": {
        "Colony-Run-Id": {"description": "the run's id", "schema": {"type": "string"}},
        "Content-Location": {
            "description": "what the body shows: the run's events URL (stream), the run's URL (wait_s)",
            "schema": {"type": "string"},
        },
    },
}


# -- agent memory (colony.api.routes.memory) and the agent catalog -------------------------------------
#
# The request models below repeat the memory models' bounds as JSON-schema constraints (patterns,
# lengths, counts), so what the document promises is exactly what the API validates before a route
# runs. Bounds set in `memory.*` settings (max_content_chars, max_tags_per_entry) may be tighter
# than these ceilings; the store checks them and answers 422 naming the field.

# characters no tag or scope id holds: wildcards, braces, controls (C0, DEL, C1) and whitespace, the
# whitespace spelled out (`\s` differs between Python, Rust (pydantic) and ECMA (the document) regexes)
_NOT_IN_KEYS = r"*?\[\]\\{}\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
TAG_PATTERN = rf"^[^{_NOT_IN_KEYS}]{{1,256}}$"
Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
MEMORY_ENTRY_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
MAX_MEMORY_CONTENT = 200_000  # the ceiling of memory.max_content_chars
MAX_MEMORY_TAGS = 256  # the ceiling of memory.max_tags_per_entry
MAX_SCOPE_REF = 512
# provenance: `scope_id#entry_id` (a scope id without wildcards, braces or whitespace; an entry id)
SOURCE_REF = rf"^[^{_NOT_IN_KEYS}#]{{1,895}}#[A-Za-z0-9][A-Za-z0-9_.\-]{{0,127}}$"


class MemoryTagFilter(BaseModel):
    """Tags a recalled entry must carry: every one of `all_of`, one of `any_of`, none of `none_of`."""

    model_config = ConfigDict(extra="forbid")

    all_of: list[Tag] = Field(default_factory=list, max_length=64)
    any_of: list[Tag] = Field(default_factory=list, max_length=64)
    none_of: list[Tag] = Field(default_factory=list, max_length=64)


# a JSON number, never `true`/`false` or a numeric string (pydantic's lax mode would take them)
Number = Annotated[float, Field(strict=True)]


class RecallBody(BaseModel):
    """A recall (colony.memory.types.MemoryQuery): the logical filters first, then ranking by
    meaning (`query`) or, without text, by importance and recency."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"query": "when is the release?", "min_relevance": 0.3}]},
    )

    query: str | None = Field(None, max_length=2000, description="what to look for, by meaning")
    tag_filter: MemoryTagFilter | None = None
    key_pattern: str | None = Field(
        None, max_length=128, pattern=r"^[A-Za-z0-9_.*?\[\]-]+$", description="glob on entry ids"
    )
    time_range: tuple[Number, Number] | None = Field(
        None, description="created_at between [start, end] (unix seconds; start <= end, else 422)"
    )
    max_age_seconds: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True)
    min_relevance: float = Field(0.0, ge=0, le=1, strict=True)
    max_results: int = Field(
        10,
        ge=1,
        le=1000,
        strict=True,
        description="at most this many (and at most memory.max_recall_results)",
    )
    mode: Literal["hybrid", "vector", "keyword"] = "hybrid"


class MemoryQueryBody(RecallBody):
    """A recall from an agent's memory: RecallBody plus `scopes`, the agent's scopes to search."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"query": "where does the user live?", "scopes": ["working"], "min_relevance": 0.3}]
        },
    )

    scopes: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_SCOPE_REF)]] | None = Field(
        None,
        max_length=32,
        description="scope types (working, stm, ltm:episodic, ...) or full scope ids, of this agent's "
        "scopes only (another scope: 404); absent = all of them",
    )


class EntryBody(BaseModel):
    """An entry to store (colony.memory.types.NewMemory)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"content": "The release is on 3 March.", "tags": ["fact"]}]},
    )

    content: str = Field(min_length=1, max_length=MAX_MEMORY_CONTENT, description="the indexed text")
    data: Any = Field(None, description="any JSON payload kept with the entry (not indexed)")
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_MEMORY_TAGS)
    kind: str | None = Field(None, pattern=r"^[a-z][a-z0-9_:-]{0,63}$")
    ttl_seconds: float | None = Field(
        None, gt=0, le=10 * 365 * 24 * 3600, strict=True, description="default: the scope's"
    )
    entry_id: str | None = Field(
        None, pattern=MEMORY_ENTRY_ID, description="makes the write idempotent: one entry per id"
    )
    sources: list[Annotated[str, StringConstraints(max_length=1024, pattern=SOURCE_REF)]] = Field(
        default_factory=list, max_length=256, description="`scope_id#entry_id` of entries it came from"
    )
    importance: float = Field(0.5, ge=0, le=1, strict=True)
    metadata: dict[str, Any] = Field(default_factory=dict)


class MemoryWrite(EntryBody):
    """An entry to store in one of the agent's scopes (EntryBody plus `scope`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"scope": "working", "content": "The user lives in Lyon.", "tags": ["fact"]}]
        },
    )

    scope: str = Field(
        min_length=1,
        max_length=MAX_SCOPE_REF,
        description="a scope type of the agent (working, stm, ...) or the full id of one of its scopes",
    )


class RecalledEntries(BaseModel):
    """What a recall found, most relevant first."""

    entries: list[RecalledEntry] = Field(description="entries with relevance in [0, 1] and its parts")


class WrittenMemory(BaseModel):
    """What a write did: `created` false when the scope already held the entry (`duplicate_of`)."""

    entry: MemoryEntry = Field(description="the entry stored (or the one already holding it)")
    created: bool
    duplicate_of: str | None = None


class Reindexed(BaseModel):
    """Entries re-embedded per scope; `vector` false when this API process has no vector index
    (then only its keyword index was rebuilt; `vector_error` says why)."""

    scopes: dict[str, int]
    vector: bool
    vector_error: str | None = None


class SharedScopeBody(BaseModel):
    """A shared memory scope's definition: who may read, who may write (agent ids, `*`: every agent
    of the colony; a writer also reads), and its purpose, TTL and cap. A field left out keeps its
    value (a new scope: every agent reads, none writes, memory.default_max_entries, no TTL)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"readers": ["*"], "writers": ["researcher-1", "researcher-2"]}]},
    )

    readers: list[SharedAgentRef] | None = Field(
        None, max_length=MAX_SHARED_MEMBERS, description="the whole list"
    )
    writers: list[SharedAgentRef] | None = Field(
        None, max_length=MAX_SHARED_MEMBERS, description="the whole list"
    )
    purpose: str | None = Field(None, max_length=200, pattern=r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$")
    ttl_seconds: float | None = Field(
        None, ge=0, le=10 * 365 * 24 * 3600, strict=True, description="entries' default TTL (0: none)"
    )
    max_entries: int | None = Field(None, ge=1, le=100_000, strict=True, description="the scope's cap")


class SharedScopes(BaseModel):
    """The colony's shared memory scopes, in the order they were defined."""

    scopes: list[SharedScopeInfo]


class CatalogAgent(BaseModel):
    """An agent the colony starts with: a built-in, or a user agent of the `agents:` settings."""

    name: str
    kind: Literal["builtin", "user"]
    factory: str | None = Field(None, description="user agents: the `package.module:factory` it is built by")
    role: str | None = Field(None, description="the blueprint's role, once the agent is placed")
    agent_type: str | None = None
    state: str | None = Field(None, description="its state (absent: not placed yet)")
    replica: str | None = None


MEMORY = _errors(*COMMON, 404)
MEMORY_WRITE = _errors(*COMMON, 400, 404, 413)
SHARED_MEMORY = _errors(*COMMON, 400, 413)


# -- memory blocks (colony.api.routes.blocks) -----------------------------------------------------------
#
# Ceilings of what one request may carry; the `blocks.*` settings (max_edit_chars, max_char_limit)
# may be tighter, and the store answers 422 naming the bound.

BLOCK_LABEL = r"^[a-z][a-z0-9_]{0,63}$"
BLOCK_LABEL_RULE = "1-64 characters: lowercase letters, digits and '_', starting with a letter"
BlockLabel = Annotated[str, StringConstraints(pattern=BLOCK_LABEL)]
MAX_BLOCK_LIMIT = 1_000_000  # the ceiling of blocks.max_char_limit
# the most text one request carries: a longer text is a 422 naming the field, not a 413, even
# written as JSON escapes of astral characters (12 bytes each) within api.max_body_bytes' default
# 1 MiB; blocks.max_edit_chars (default 20,000) is the tighter bound of one edit
MAX_BLOCK_TEXT = 80_000


def _unicode(value: str) -> str:
    """Text Redis, Loro and other clients can take: valid Unicode (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (it holds a lone surrogate)") from None
    return value


BlockText = Annotated[str, AfterValidator(_unicode)]
MAX_BLOCK_MESSAGE = 500
MAX_BLOCK_DESCRIPTION = 1000
BlockAccessName = Literal["read_only", "append_only", "read_write"]
BlockTypeName = Literal["core", "working", "log"]


class BlockCreate(BaseModel):
    """A block to create (colony.memory.blocks.NewBlock, bounded)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"label": "human", "description": "Key details about the user", "content": ""}]
        },
    )

    label: BlockLabel = Field(description=BLOCK_LABEL_RULE)
    description: BlockText = Field("", max_length=MAX_BLOCK_DESCRIPTION, description="what the block is for")
    block_type: BlockTypeName = "working"
    char_limit: int | None = Field(
        None,
        ge=1,
        le=MAX_BLOCK_LIMIT,
        description="default blocks.default_char_limit; at most blocks.max_char_limit",
    )
    read_only: bool = Field(False, description="only the system or the operator changes it")
    content: BlockText = Field(
        "", max_length=MAX_BLOCK_TEXT, description="initial content (not for log blocks)"
    )
    template: BlockLabel | None = Field(
        None,
        description="a block template (persona, human, scratchpad, organization, custom): its type, "
        "description and limit are the defaults, its fields the initial content",
    )
    fields: dict[str, Any] | None = Field(
        None,
        max_length=256,
        description="with `template`: the fields its schema takes (the content is rendered from them)",
    )
    template_schema: dict[str, Any] | None = Field(
        None, description="with the `custom` template: the JSON schema (type object) of its fields"
    )
    log_max_entries: int | None = Field(None, ge=1, le=10_000, description="log blocks: entries kept")
    log_shown_entries: int | None = Field(None, ge=1, le=1000, description="log blocks: entries rendered")


class ColonyBlockCreate(BlockCreate):
    """A colony-wide block: every agent, present and future, sees it with `access`."""

    access: BlockAccessName = Field("read_only", description="what every agent may do with it")


class BlockPut(BaseModel):
    """New content of a block (a rewrite: an append-only agent may only add text)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"content": "The user is Ada."}]}
    )

    content: BlockText = Field(max_length=MAX_BLOCK_TEXT, description="the whole new content")
    base_version: int | None = Field(
        None, ge=1, le=2**31, description="edit only if the block is still at this version (else 409)"
    )
    message: BlockText = Field("", max_length=MAX_BLOCK_MESSAGE, description="kept in the block's history")


class BlockAppend(BaseModel):
    """Text to add at the end of a block (on a new line)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"text": "Likes tea."}]})

    text: BlockText = Field(min_length=1, max_length=MAX_BLOCK_TEXT)
    base_version: int | None = Field(
        None, ge=1, le=2**31, description="edit only if the block is still at this version (else 409)"
    )
    message: BlockText = Field("", max_length=MAX_BLOCK_MESSAGE)


class BlockPatch(BaseModel):
    """A block's settings (its owner, or the operator for colony blocks); absent fields unchanged."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"swapped_out": True}]})

    description: BlockText | None = Field(None, max_length=MAX_BLOCK_DESCRIPTION)
    char_limit: int | None = Field(
        None, ge=1, le=MAX_BLOCK_LIMIT, description="at most blocks.max_char_limit"
    )
    swapped_out: bool | None = Field(None, description="working blocks: out of the prompt while true")


class BlockRollback(BaseModel):
    """Roll back to a version: a new commit holding that version's content (history kept)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"version": 1}]})

    version: int = Field(ge=1, le=2**31)
    message: BlockText = Field("", max_length=MAX_BLOCK_MESSAGE)


class BlockUndo(BaseModel):
    """Undo the acting agent's own latest edit of the block (others' edits are kept)."""

    model_config = ConfigDict(extra="forbid")


class BlockShareBody(BaseModel):
    """Give `agent_id` `access` to `owner`'s block `label`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"owner": "assistant", "label": "human", "agent_id": "helper", "access": "read_only"}
            ]
        },
    )

    owner: Identifier = Field(description=f"the owning agent; {ID_RULE}")
    label: BlockLabel = Field(description=BLOCK_LABEL_RULE)
    agent_id: Identifier = Field(description="the agent the block is shared with")
    access: BlockAccessName


class BlockUnshareBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    owner: Identifier
    label: BlockLabel
    agent_id: Identifier


class Unshared(BaseModel):
    removed: bool = Field(description="false when the agent had no grant")


class BlockListItem(BaseModel):
    """One block an agent sees (or one colony block): metadata, size and the agent's access."""

    label: str
    owner: str
    block_type: BlockTypeName
    description: str
    chars: int = Field(description="characters of the content (log blocks: of the rendered entries)")
    char_limit: int
    access: BlockAccessName
    read_only: bool
    swapped_out: bool
    colony: bool = Field(description="a colony-wide block")
    updated_at: float


class VersionConflictDetail(ErrorDetail):
    current_version: int = Field(description="the block's head version now")


class VersionConflictBody(BaseModel):
    """409 of an edit sent with a stale `base_version` (edits without one merge, never 409)."""

    error: VersionConflictDetail


def _block_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "the request is malformed (a body that is not JSON)",
        401: "missing or wrong bearer token",
        403: "the agent's access does not allow this (read-only, append-only, not shared, not the owner)",
        404: "the agent sees no such block (or no such version of it)",
        409: "a block with that label exists",
        413: "the request body is too large",
        422: "a parameter or body field is invalid, or the edit is refused (over the char limit, too "
        "long, no unique match); the message names it",
        503: "Redis is unavailable; retry later",
    }
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": what[status]} for status in statuses
    }
    return out


BLOCK_READ = _block_errors(400, 401, 403, 404, 422, 503)
BLOCK_CREATE = _block_errors(400, 401, 403, 404, 409, 413, 422, 503)
BLOCK_EDIT = {
    **_block_errors(400, 401, 403, 404, 413, 422, 503),
    409: {
        "model": VersionConflictBody,
        "description": "`base_version` was given and the block has moved on (`current_version`)",
    },
}
BLOCK_SHARE = _block_errors(400, 401, 403, 404, 409, 413, 422, 503)
