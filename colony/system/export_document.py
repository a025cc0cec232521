"""The agent export document: its format, as pydantic models with bounds, and its parsing.

Everything in a document is data read from outside the colony (docs/transfer.md): every field is
validated here (ids and names by pattern, sizes and nesting bounded, action-log records checked with
the log's own model) before `colony.system.transfer` writes any of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator
from pydantic import model_validator as after_model

from colony.agents.models import ActionResult, AgentMetadata, AgentRun, AgentState, SuspensionRequest
from colony.agents.state.action_log import LogRecord
from colony.agents.state.checkpoints import Checkpoint
from colony.agents.state.persistence import MAX_CONTEXT_ITEMS
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import ImportRejected
from colony.memory.blocks import BlockType
from colony.memory.blocks.types import MAX_DESCRIPTION_CHARS
from colony.wire.ids import ID_PATTERN
from colony.wire.input_check import check_input

FORMAT = "colony-agent-export"
FORMAT_VERSION = 1
MAX_DEPTH = 64  # nesting a document may hold (run inputs nest up to api.max_input_depth, plus wrappers)
STATE_VALUES = frozenset(s.value for s in AgentState)
# State the colony.context parts keep under one name each, as an entry or a ring (or both): carried
# as they are stored, whatever their shape, so they travel with the agent
PARTS = ("checkpoints", "action_log")
MAX_HISTORY = 100  # block versions listed per block (for the record; not replayed)
# the agent's state outside its blocks and memory (policy and capability states, context, rings,
# archived outputs, its run), as compact JSON: junk a document carries there is refused, not stored
MAX_STATE_BYTES = 8 * 1024 * 1024
STATE_FIELDS = ("current_run", "policy_state", "context", "capabilities", "suspension", "parts", "archived")
# a block's settings carried over (its owner, id and bookkeeping are the target's)
BLOCK_SETTINGS = {"label", "description", "block_type", "char_limit", "read_only"}
BLOCK_SETTINGS |= {"log_max_entries", "log_shown_entries"}

AgentIdText = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
Namespace = Annotated[str, StringConstraints(pattern=r"^memory-[a-z0-9][a-z0-9-]{0,62}$")]
BlockLabel = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Strict):
    tenant_id: AgentIdText
    colony_id: AgentIdText


class BlueprintRef(_Strict):
    """How the importing colony gets the agent's code: a catalog name, or a signed blueprint."""

    catalog: AgentIdText | None = None
    signed: str | None = Field(None, max_length=64 * 1024 * 1024)


class StrictMetadata(AgentMetadata):
    """`AgentMetadata` refusing fields it does not have (a document's junk is refused, not dropped)."""

    model_config = ConfigDict(**{**AgentMetadata.model_config, "extra": "forbid"})


class StrictRun(AgentRun):
    """`AgentRun` refusing fields it does not have."""

    model_config = ConfigDict(**{**AgentRun.model_config, "extra": "forbid"})


class StrictSuspension(SuspensionRequest):
    """`SuspensionRequest` refusing fields it does not have."""

    model_config = ConfigDict(**{**SuspensionRequest.model_config, "extra": "forbid"})


class ContextHead(_Strict):
    """The `agent:context` entry: the ring's position, the last result, page accesses."""

    context_total: int = Field(0, ge=0)
    last_result: ActionResult | None = None
    page_accesses: list[dict[str, Any]] = Field(default_factory=list, max_length=100_000)


class ContextPart(_Strict):
    head: ContextHead | None = None
    items: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CONTEXT_ITEMS)

    @after_model(mode="after")
    def _consistent(self) -> ContextPart:
        if self.head is not None and self.head.context_total < len(self.items):
            raise ValueError("context.head.context_total is below the number of context items")
        return self


class StoredPart(_Strict):
    """One `PARTS` name as stored: its entry value and/or its ring items."""

    entry: Any = None
    ring: list[Any] | None = Field(None, max_length=100_000)


class CapabilityState(_Strict):
    state: dict[str, Any] = Field(default_factory=dict)
    events_from: str | None = Field(None, max_length=64)  # the source's stream position (not imported)


class ExportedBlock(_Strict):
    """A memory block the agent owns: its settings and content (log blocks: their entries)."""

    label: BlockLabel
    description: str = Field("", max_length=MAX_DESCRIPTION_CHARS)
    block_type: BlockType = BlockType.WORKING
    char_limit: int = Field(ge=1, le=10_000_000)
    read_only: bool = False
    template: str | None = Field(None, max_length=64)
    log_max_entries: int | None = Field(None, ge=1, le=10_000)
    log_shown_entries: int | None = Field(None, ge=1, le=1000)
    content: str = Field("", max_length=10_000_000)
    entries: list[dict[str, Any]] | None = Field(None, max_length=10_000)
    version: int = Field(1, ge=1)
    history: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_HISTORY)


class ExportedMemory(_Strict):
    entry_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    content: str = Field(min_length=1)
    data: Any = None
    tags: list[str] = Field(default_factory=list, max_length=256)
    kind: str | None = None
    importance: float = Field(0.5, ge=0, le=1)
    sources: list[str] = Field(default_factory=list, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float | None = None
    expires_at: float | None = None


class ExportedScope(_Strict):
    namespace: Namespace  # of the agent's own scope (e.g. memory-working): re-rooted on import
    entries: list[ExportedMemory] = Field(default_factory=list, max_length=1_000_000)


class AgentExport(_Strict):
    """The export document (`format`/`version` name its shape; older readers refuse newer ones)."""

    format: Literal["colony-agent-export"]
    version: Literal[1]
    exported_at: float
    source: Source
    agent_id: AgentIdText
    state: AgentState
    blueprint: BlueprintRef
    metadata: StrictMetadata  # for the record: an import takes role, type, parent from the trusted blueprint
    current_run: StrictRun | None = None
    policy_state: dict[str, Any] | None = None
    context: ContextPart = Field(default_factory=ContextPart)
    capabilities: dict[str, CapabilityState] = Field(default_factory=dict, max_length=256)
    suspension: StrictSuspension | None = None  # as it was (the import resumes it IMMEDIATE)
    parts: dict[Literal["checkpoints", "action_log"], StoredPart] = Field(default_factory=dict)
    archived: dict[Digest, Any] = Field(default_factory=dict, max_length=100_000)
    blocks: list[ExportedBlock] = Field(default_factory=list, max_length=1000)
    memory: list[ExportedScope] = Field(default_factory=list, max_length=64)

    @field_validator("parts")
    @classmethod
    def _records(cls, value: dict[str, StoredPart]) -> dict[str, StoredPart]:
        """Every checkpoint and action-log item must be one its reader takes (the same models they
        are read back with): a document with anything else is refused, not half taken (an
        imported checkpoint whose run is not one would fail its undo later)."""
        models: dict[str, type[BaseModel]] = {"action_log": LogRecord, "checkpoints": Checkpoint}
        for name, model in models.items():
            part = value.get(name)  # type: ignore[call-overload]
            for index, item in enumerate((part.ring or []) if part is not None else []):
                try:
                    model.model_validate(item)
                except ValidationError as exc:
                    what = f"parts.{name}.ring[{index}]"
                    raise ValueError(f"{what} is not a record of that kind: {exc}") from None
        return value

    @field_validator("blocks")
    @classmethod
    def _one_block_per_label(cls, value: list[ExportedBlock]) -> list[ExportedBlock]:
        """Two blocks of one label would be one block here (the second overwriting the first)."""
        _refuse_repeats("blocks", "label", [block.label for block in value], "block's label")
        return value

    @field_validator("memory")
    @classmethod
    def _one_scope_per_namespace(cls, value: list[ExportedScope]) -> list[ExportedScope]:
        _refuse_repeats("memory", "namespace", [scope.namespace for scope in value], "scope's")
        return value

    @field_validator("capabilities")
    @classmethod
    def _capability_names(cls, value: dict[str, CapabilityState]) -> dict[str, CapabilityState]:
        for name in value:
            if len(name) > 128:
                raise ValueError(f"capability name {name[:40]!r}... is longer than 128 characters")
            Keys.capability_state_key(name)  # InvalidKey (a ValueError) for a name no key may hold
        return value

    @after_model(mode="after")
    def _bounded_state(self) -> AgentExport:
        """The agent's state (all but its blocks and memory, which have their own limits) within
        MAX_STATE_BYTES: what a colony writes there is far smaller; more is junk."""
        check_state_size(self.model_dump(mode="json", include=set(STATE_FIELDS)))
        return self

    @after_model(mode="after")
    def _one_agent(self) -> AgentExport:
        if self.metadata.agent_id != self.agent_id:
            raise ValueError(
                f"metadata.agent_id {self.metadata.agent_id!r} is not agent_id {self.agent_id!r}"
            )
        if self.current_run is not None:
            if self.current_run.agent_id != self.agent_id:
                raise ValueError(
                    f"current_run.agent_id {self.current_run.agent_id!r} is not {self.agent_id!r}"
                )
            if len(self.current_run.run_id) > 128:
                raise ValueError("current_run.run_id is longer than 128 characters")
            Keys.run_key(self.current_run.run_id)  # InvalidKey (a ValueError) for an id no key may hold
        return self


# -- parsing ---------------------------------------------------------------------------------------


def check_state_size(document: Mapping[str, Any]) -> None:
    """ValueError when the document's state fields (`STATE_FIELDS`) are over MAX_STATE_BYTES of
    JSON, naming the largest (an export checks its own so, an import refuses such a document)."""
    sizes = {name: len(json_bytes({"v": document.get(name)})) for name in STATE_FIELDS}
    if sum(sizes.values()) > MAX_STATE_BYTES:
        largest = max(sizes, key=lambda n: sizes[n])
        raise ValueError(
            f"the agent state is {sum(sizes.values())} bytes of JSON, over {MAX_STATE_BYTES} "
            f"(the largest part: {largest}, {sizes[largest]} bytes); an agent's state is never that "
            "large: trim it (or its policy's or capabilities' state) and export it again"
        )


def json_bytes(document: Mapping[str, Any]) -> bytes:
    """The document as compact UTF-8 JSON (what is measured against `context.max_export_bytes`)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def parse_document(document: Any, max_bytes: int) -> AgentExport:
    """The validated document, or ImportRejected saying what is wrong with it."""
    if not isinstance(document, Mapping):
        raise ImportRejected(
            "an agent export document is a JSON object (`colony agent export ID` writes one)"
        )
    try:
        check_input(document, MAX_DEPTH, "document")
        size = len(json_bytes(document))
    except (ValueError, TypeError) as exc:
        raise ImportRejected(f"the document cannot be imported: {exc}") from None
    if size > max_bytes:
        raise ImportRejected(
            f"the document is {size} bytes, over context.max_export_bytes ({max_bytes}); raise that setting"
        )
    if document.get("format") != FORMAT or document.get("version") != FORMAT_VERSION:
        raise ImportRejected(
            f"not a {FORMAT} version {FORMAT_VERSION} document (format {str(document.get('format'))[:40]!r}, "
            f"version {str(document.get('version'))[:10]!r}); export it with this version of Colony"
        )
    try:
        return AgentExport.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ImportRejected(f"the document is refused: {where}: {first['msg']}{more}") from None


def _refuse_repeats(field: str, member: str, values: list[str], whose: str) -> None:
    """ValueError naming the first item of `field` whose `member` repeats an earlier one's."""
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            raise ValueError(f"{field}[{index}].{member} {value!r} repeats an earlier {whose}")
        seen.add(value)
