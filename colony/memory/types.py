"""What memory is made of: entries, queries, lenses, configuration and the introspection types a
planner reads (MemoryMap, MemoryScopeInfo).

Every model here is JSON: it is stored in the blackboard, crosses the HTTP API and is rendered into
prompts. Bounds live here too (text length, tag count, result count), so a hostile HTTP body or a
model's action parameters are refused at the edge with the field named.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from colony.blackboard.models import TagFilter
from colony.blackboard.protocol import validate_tag

__all__ = [
    "ENTRY_ID_PATTERN",
    "MaintenanceConfig",
    "MemoryEntry",
    "MemoryIngestPolicy",
    "MemoryLens",
    "MemoryMap",
    "MemoryProducerConfig",
    "MemoryQuery",
    "MemoryScopeConfig",
    "MemoryScopeInfo",
    "MemorySubscription",
    "NewMemory",
    "RecalledEntry",
    "TagFilter",
    "WriteOutcome",
    "content_hash",
]

# entry ids become part of a blackboard key: a closed alphabet, bounded
ENTRY_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_QUERY_CHARS = 2000
MAX_SOURCES = 256


def content_hash(text: str) -> str:
    """Hash of an entry's normalised text (case and runs of whitespace ignored): exact dedup."""
    normalised = " ".join(text.lower().split())
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()[:32]


def _check_tags(tags: frozenset[str]) -> frozenset[str]:
    for tag in tags:
        validate_tag(tag)
    return tags


class MemoryEntry(BaseModel):
    """One memory: text that is indexed (`content`), an optional JSON payload (`data`), tags, and
    where it came from (`sources`: `scope_id#entry_id` of the entries it was derived from)."""

    model_config = ConfigDict(frozen=True)

    entry_id: str
    scope_id: str
    content: str
    data: Any = None
    tags: frozenset[str] = frozenset()
    kind: str | None = None
    created_at: float = Field(default_factory=time.time)
    expires_at: float | None = None
    importance: float = Field(0.5, ge=0, le=1)
    sources: list[str] = Field(default_factory=list, max_length=MAX_SOURCES)
    content_hash: str = ""
    created_by: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        """`scope_id#entry_id`: how provenance names an entry."""
        return f"{self.scope_id}#{self.entry_id}"

    def age_seconds(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.created_at)


class NewMemory(BaseModel):
    """An entry to write; `entry_id` makes the write idempotent (the same id is one entry)."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1)
    data: Any = None
    tags: frozenset[str] = frozenset()
    kind: str | None = Field(None, pattern=r"^[a-z][a-z0-9_:-]{0,63}$")
    ttl_seconds: float | None = Field(None, gt=0, le=10 * 365 * 24 * 3600)
    entry_id: str | None = Field(None, pattern=rf"^{ENTRY_ID_PATTERN.pattern}$")
    sources: list[str] = Field(default_factory=list, max_length=MAX_SOURCES)
    importance: float = Field(0.5, ge=0, le=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    _tags = field_validator("tags")(_check_tags)


class WriteOutcome(BaseModel):
    """What one write did: `created` False when an identical (hash) or near-identical (nearest
    neighbour above the dedup threshold) entry already held it; `duplicate_of` names that entry."""

    entry: MemoryEntry
    created: bool
    duplicate_of: str | None = None


class RecalledEntry(BaseModel):
    """An entry a query found, with its relevance in [0, 1] and the parts it was computed from."""

    entry: MemoryEntry
    relevance: float
    scores: dict[str, float] = Field(default_factory=dict)


class MemoryQuery(BaseModel):
    """A recall: logical filters first (tags, key pattern, time), then ranking by the semantic
    `query` (hybrid: vector + keyword + recency) or, without one, by recency and importance."""

    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, max_length=MAX_QUERY_CHARS, description="what to look for, by meaning")
    tag_filter: TagFilter | None = None
    key_pattern: str | None = Field(
        None, max_length=128, pattern=r"^[A-Za-z0-9_.*?\[\]-]+$", description="glob on entry ids"
    )
    time_range: tuple[float, float] | None = Field(None, description="created_at between (unix seconds)")
    max_age_seconds: float | None = Field(None, gt=0)
    min_relevance: float = Field(0.0, ge=0, le=1)
    max_results: int = Field(10, ge=1, le=1000)
    scopes: list[str] | None = Field(
        None, max_length=32, description="scope types (working, stm, ...) or full scope ids; None = all"
    )
    mode: Literal["hybrid", "vector", "keyword"] = "hybrid"

    @model_validator(mode="after")
    def _check_range(self) -> MemoryQuery:
        if self.time_range is not None and self.time_range[0] > self.time_range[1]:
            raise ValueError("time_range: start must not be after end")
        return self

    def passes(self, entry: MemoryEntry, now: float | None = None) -> bool:
        """The logical part of the query (everything but ranking and min_relevance)."""
        now = now or time.time()
        if self.tag_filter is not None and not self.tag_filter.matches(entry.tags):
            return False
        if self.key_pattern is not None and not fnmatch.fnmatchcase(entry.entry_id, self.key_pattern):
            return False
        if self.time_range is not None and not self.time_range[0] <= entry.created_at <= self.time_range[1]:
            return False
        if self.max_age_seconds is not None and entry.age_seconds(now) > self.max_age_seconds:
            return False
        return entry.expires_at is None or entry.expires_at > now


class MaintenanceConfig(BaseModel):
    """The subconscious upkeep of one scope. Relevance decays at read time (nothing is rewritten in
    the background): decayed relevance = importance x (1 - decay_rate) ** age_minutes, the order in
    which a scope over its cap loses entries. The seed's prune_threshold, reindex_interval and
    track_access are not kept: pruning happens at the cap (an entry below a threshold is simply
    first in line), the indexes follow the event streams instead of a timer, and recalls write
    nothing (docs/memory.md, What we chose)."""

    decay_rate: float = Field(0.01, ge=0, lt=1, description="relevance decay per minute")
    dedup_threshold: float = Field(0.95, gt=0, le=1, description="cosine above which a write is a duplicate")

    def decayed(self, entry: MemoryEntry, now: float | None = None) -> float:
        return entry.importance * (1.0 - self.decay_rate) ** (entry.age_seconds(now) / 60.0)


class MemorySubscription(BaseModel):
    """An edge of the memory dataflow graph: this scope pulls entries written to `source_scope_id`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source_scope_id: str
    tag_filter: TagFilter | None = None


Transformer = Callable[..., Any]


class MemoryIngestPolicy(BaseModel):
    """What a scope ingests (`subscriptions`) and how (`transformer`; None copies each entry, with
    its provenance). A transformer is an object with `async transform(entries, capability) ->
    list[NewMemory]`; it must be picklable (it travels in the agent's blueprint)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    subscriptions: list[MemorySubscription] = Field(default_factory=list, max_length=16)
    transformer: Any = None
    batch_size: int = Field(16, ge=1, le=1000, description="source entries handed to the transformer at once")


class MemoryProducerConfig(BaseModel):
    """A hook that turns calls of a `@hookable` method into memories, so agents never write their
    own action memories. `extractor(ctx, result)` returns None (nothing to store) or a `NewMemory`
    (or a dict of its fields); it must be picklable."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pointcut: Any = Field(description="a colony.agents.hooks.Pointcut, or a 'Class.method' glob")
    extractor: Any
    ttl_seconds: float | None = Field(None, gt=0)
    name: str = Field("producer", pattern=r"^[a-z][a-z0-9_-]{0,63}$")


class MemoryScopeConfig(BaseModel):
    """How one scope is configured, stored beside its entries so any process (the HTTP API, another
    replica) can describe it without the agent object."""

    scope_id: str
    scope_type: str
    purpose: str = ""
    ttl_seconds: float | None = None
    max_entries: int | None = None
    subscribed_to: list[str] = Field(default_factory=list)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    owner: str | None = None


class MemoryScopeInfo(BaseModel):
    """Per-scope details a planner sees: capacity, TTL, edges, counts, tags present."""

    scope_id: str
    scope_type: str
    purpose: str = ""
    ttl_seconds: float | None = None
    max_entries: int | None = None
    entry_count: int = 0
    pending_ingestion: int = 0
    subscribed_to: list[str] = Field(default_factory=list)
    available_tags: list[str] = Field(default_factory=list)


class MemoryMap(BaseModel):
    """The whole memory layout of an agent: scopes and the dataflow edges between them."""

    agent_id: str
    scopes: dict[str, MemoryScopeInfo] = Field(default_factory=dict)
    dataflow_edges: list[tuple[str, str]] = Field(default_factory=list)
    total_entries: int = 0
    total_pending_ingestion: int = 0


class MemoryLens(BaseModel):
    """A read-only view for one purpose (planning, reflection, skills): which scope types, which
    tags, how far back, how many. Lenses copy nothing; they are configured queries."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    description: str = ""
    scopes: list[str] = Field(
        default_factory=list, description="scope types (working, stm, ltm:episodic, ...)"
    )
    tags_include: frozenset[str] = frozenset()
    tags_exclude: frozenset[str] = frozenset()
    time_range: float | None = Field(None, gt=0, description="only entries younger than this (s)")
    max_results: int = Field(10, ge=1, le=100)

    def to_query(self, text: str | None = None) -> MemoryQuery:
        """The query this lens stands for; `text` (e.g. the task) ranks by meaning."""
        tag_filter = (
            TagFilter(any_of=self.tags_include, none_of=self.tags_exclude)
            if self.tags_include or self.tags_exclude
            else None
        )
        return MemoryQuery(
            query=text[:MAX_QUERY_CHARS] if text else None,
            tag_filter=tag_filter,
            max_age_seconds=self.time_range,
            max_results=self.max_results,
            scopes=list(self.scopes) or None,
        )


PLANNING_LENS = MemoryLens(
    name="planning",
    description="Recent actions and goals",
    scopes=["working", "stm"],
    time_range=3600.0,
    max_results=10,
)
REFLECTION_LENS = MemoryLens(
    name="reflection",
    description="Past experiences and outcomes",
    scopes=["stm", "ltm:episodic"],
    max_results=10,
)
SKILL_LENS = MemoryLens(
    name="skill",
    description="Procedural knowledge: strategies and skills",
    scopes=["ltm:procedural"],
    max_results=5,
)
