"""The planner's side of memory: actions (recall, list_tags, memory_map, forget, consolidate,
remember) and lenses rendered into the planning prompt.

The actions reach only this agent's own memory scopes (those of its MemoryCapabilities): a scope a
model names is looked up among them, never used as a key, so model output cannot read or change
another agent's memory.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents.actions import action_executor
from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.models import ActionType
from colony.agents.state.action_log import current_idempotency_key
from colony.agents.state.log_records import effect_id
from colony.blackboard import Blackboard, TagFilter
from colony.config import ColonySettings
from colony.errors import AgentUsageError, MemoryAccessDenied
from colony.memory.capability import MemoryCapability, private_memory
from colony.memory.grounding import check_lines, refusal, refuse_user_tag, said_by_user
from colony.memory.introspection import agent_memory_map
from colony.memory.scopes import MemoryScope
from colony.memory.service import MemoryService, memory_service
from colony.memory.transformers import SummarizingTransformer
from colony.memory.types import PLANNING_LENS, MemoryEntry, MemoryLens, MemoryQuery, NewMemory, RecalledEntry
from colony.wire.run_task import user_words

if TYPE_CHECKING:
    from colony.agents.base import Agent

LINE_CHARS = 300
MAX_ACTION_RESULTS = 20
# parameters of the recall actions (this one's and shared memory's)
Query = Annotated[str, Field(max_length=2000)]
TagName = Annotated[str, Field(max_length=64)]
Results = Annotated[int, Field(ge=1, le=MAX_ACTION_RESULTS)]
Relevance = Annotated[float, Field(ge=0, le=1)]
MIN_FACT_WORDS = 3  # a "fact" of one or two words ("fact", a bare number) carries no meaning alone


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def render_lens(lens: MemoryLens, recalled: Sequence[RecalledEntry], now: float | None = None) -> str:
    """A lens as a prompt section: one line per entry, newest facts first as ranked ("" when empty)."""
    if not recalled:
        return ""
    now = now or time.time()
    title = f"## Memory: {lens.name}" + (f" ({lens.description})" if lens.description else "")
    lines = [title, ""]
    for item in recalled:
        entry = item.entry
        text = prompt_line(entry.content)
        text = text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 3] + "..."
        lines.append(f"- [{_kind(entry)}, {_age(entry.age_seconds(now))}] {text}")
    return "\n".join(lines)


def prompt_line(text: str) -> str:
    """Stored text as one line of a prompt: whitespace runs (line breaks included) become one
    space, and invisible format characters (zero-width, bidirectional overrides) are dropped, so
    remembered text cannot change how the prompt around it reads."""
    return " ".join("".join(c for c in text if unicodedata.category(c) != "Cf").split())


def _kind(entry: MemoryEntry) -> str:
    return MemoryScope.scope_type(entry.scope_id)


def _brief(item: RecalledEntry) -> dict[str, Any]:
    entry = item.entry
    return {
        "entry_id": entry.entry_id,
        "scope": MemoryScope.scope_type(entry.scope_id),
        "content": entry.content[:1000],
        "tags": sorted(entry.tags),
        "relevance": round(item.relevance, 4),
    }


def action_query(query: str, tag: str | None, max_results: int, min_relevance: float) -> MemoryQuery:
    """The MemoryQuery of a recall action's parameters."""
    return MemoryQuery(
        query=query,
        tag_filter=TagFilter(all_of=frozenset({tag})) if tag else None,
        max_results=max(1, min(max_results, MAX_ACTION_RESULTS)),
        min_relevance=min_relevance,
    )


def run_message(agent: Agent | None) -> str:
    """The task of the agent's current run, as given (what the user said; "" without one)."""
    run = agent.current_run if agent is not None else None
    if run is None:
        return ""
    return user_words(run.input) or ""


def entry_id_for(scope_id: str, n: int = 0, *content: str) -> str | None:
    """The id of the `n`th entry the action being executed writes to `scope_id`: derived from the
    action's idempotency key, so the action redone after a crash (between its write and the
    record of its result) finds the entry it wrote (the store treats a write of an id it holds as
    held) instead of storing it again; None outside an action (the store picks a fresh id).
    `content` (what the entry is made from) goes into the id too: a step re-executed after an
    undo keeps its key, and if it now writes something else, that is a new entry, not a lost one."""
    key = current_idempotency_key()
    if key is None:
        return None
    return f"act-{effect_id(key, 'memory', scope_id, str(n), *content, length=32)}"


class MemoryToolsCapability(AgentCapability):
    """Memory actions over the agent's own MemoryCapabilities, and its prompt lenses.

    `ground_facts`: `remember` stores a fact only when it is what the user said, verbatim or an
    extract (colony.memory.grounding), else fails naming why; for an agent whose facts are about
    its user. Off by default: a planner's facts may come from its tools, not from a user."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        lenses: Sequence[MemoryLens] = (PLANNING_LENS,),
        remember_level: str = "ltm:semantic",
        settings: ColonySettings | None = None,
        capability_key: str = "memory",
        ground_facts: bool = False,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.lenses = list(lenses)
        self.remember_level = remember_level
        self.settings = settings
        self.ground_facts = ground_facts

    # -- the agent's scopes -------------------------------------------------------------------------

    def scopes(self) -> dict[str, MemoryCapability]:
        """The agent's memory capabilities by scope type."""
        if self.agent is None:
            return {}
        return {c.scope_type: c for c in private_memory(self.agent)}

    def resolve(self, names: Sequence[str] | None) -> list[str]:
        """Scope ids for scope types (or full ids) of this agent; None = all of them."""
        own = self.scopes()
        if not names:
            return [c.memory_scope for c in own.values()]
        by_id = {c.memory_scope: c for c in own.values()}
        out = []
        for name in names:
            if name in own:
                out.append(own[name].memory_scope)
            elif name in by_id:
                out.append(name)
            else:
                raise AgentUsageError(
                    f"no memory scope {name!r} here; this agent has: {', '.join(sorted(own)) or 'none'}"
                )
        return out

    def service(self) -> MemoryService:
        if self.settings is None:
            self.settings = agent_settings(self)
        return memory_service(self.blackboard, self.settings)

    # -- actions ------------------------------------------------------------------------------------

    @action_executor(action_type=ActionType.MEMORY_SEARCH)
    async def recall(
        self,
        query: Query,
        tag: TagName | None = None,
        scope: Annotated[str, Field(max_length=64)] | None = None,
        max_results: Results = 5,
        min_relevance: Relevance = 0.0,
    ) -> list[dict[str, Any]]:
        """Search your memory by meaning (optionally only entries with `tag`, or one `scope`, e.g.
        working, stm, ltm:semantic): the most relevant entries first."""
        found = await self.service().recall(
            action_query(query, tag, max_results, min_relevance), self.resolve([scope] if scope else None)
        )
        return [_brief(item) for item in found]

    @action_executor(action_type=ActionType.MEMORY_READ)
    async def list_tags(self, scope: str | None = None) -> dict[str, dict[str, int]]:
        """The tags present in your memory (per scope, with counts), to build targeted recalls."""
        store = self.service().store
        scope_ids = self.resolve([scope] if scope else None)
        return {
            MemoryScope.scope_type(s): dict(list((await store.tag_counts(s)).items())[:50]) for s in scope_ids
        }

    @action_executor(action_type=ActionType.MEMORY_READ)
    async def memory_map(self) -> dict[str, Any]:
        """Your memory's layout: scopes, purposes, counts, caps, TTLs, pending ingestion, edges
        (shared scopes only while you may read them)."""
        if self.agent is None:
            return {}
        memory_map = await agent_memory_map(
            self.service().store,
            self.agent.agent_id,
            tenant_id=self.agent.metadata.tenant_id,
            colony_id=self.agent.metadata.colony_id,
        )
        seen = {c.memory_scope for c in private_memory(self.agent)}
        for capability in self.agent.capabilities.values():  # shared scopes: those it may read now
            if isinstance(capability, MemoryCapability) and capability.shared:
                try:
                    await capability.check("read")  # type: ignore[attr-defined]
                    seen.add(capability.memory_scope)
                except MemoryAccessDenied:
                    pass
        shown = memory_map.model_copy(
            update={
                "scopes": {k: v for k, v in memory_map.scopes.items() if k in seen},
                "dataflow_edges": [(a, b) for a, b in memory_map.dataflow_edges if b in seen],
            }
        )
        shown.total_entries = sum(i.entry_count for i in shown.scopes.values())
        shown.total_pending_ingestion = sum(i.pending_ingestion for i in shown.scopes.values())
        return shown.model_dump(mode="json")

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def forget(self, entry_id: str, scope: str) -> dict[str, Any]:
        """Delete one entry of your memory (by the entry_id a recall returned), with its copies in
        your other scopes (the same text, copied down the hierarchy)."""
        [scope_id] = self.resolve([scope])
        store = self.service().store
        entry = await store.get(scope_id, entry_id)
        if entry is None:
            return {"forgotten": False, "entry_id": entry_id}
        removed = await store.delete(scope_id, [entry_id], created_by=self._who())
        copies = 0
        for other in self.resolve(None):
            if other != scope_id:
                for copy_id in await store.holding(other, entry.content):
                    copies += await store.delete(other, [copy_id], created_by=self._who())
        return {"forgotten": bool(removed), "entry_id": entry_id, "copies_forgotten": copies}

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write",))
    async def remember(
        self,
        fact: Annotated[str, Field(min_length=1, max_length=4000)],
        tag: Annotated[str, Field(max_length=64)] | None = None,
    ) -> dict[str, Any]:
        """Store a fact (a whole sentence) in long-term memory so later runs can recall it."""
        if self.ground_facts:
            said = await said_by_user(self.service(), self.resolve(None), fact, self._message())
            verdict = check_lines(fact, said)
            if not verdict.grounded:
                raise AgentUsageError(refusal("long-term memory", verdict, "remember_message"))
        return await self._remember(fact.strip(), tag)

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write",))
    async def remember_message(self) -> dict[str, Any]:
        """Store what the user just told you in long-term memory so later runs can recall it."""
        message = self._message()
        if len(message.split()) < MIN_FACT_WORDS or message.endswith("?"):
            raise AgentUsageError(
                "the user's message is a question or too short to be a fact; nothing stored"
            )
        return await self._remember(message, None)

    async def _remember(self, text: str, tag: str | None) -> dict[str, Any]:
        refuse_user_tag([tag] if tag else [])
        target = self.scopes().get(self.remember_level)
        if target is None:
            raise AgentUsageError(f"this agent has no {self.remember_level} memory to remember into")
        tags = frozenset({"fact", tag} if tag else {"fact"})
        entry_id = entry_id_for(target.memory_scope, 0, text)
        outcome = await target.write(NewMemory(content=text, tags=tags, kind="fact", entry_id=entry_id))
        made = outcome.created or outcome.entry.entry_id == entry_id  # (by this call, cut off before)
        return {
            "entry_id": outcome.entry.entry_id,
            "stored": made,
            "duplicate_of": None if made else outcome.duplicate_of,
        }

    def _message(self) -> str:
        """The current run's task, as text (what the user said)."""
        return run_message(self.agent).strip()

    @action_executor(action_type=ActionType.CONTEXT_SUMMARIZE, effects=("memory_write",))
    async def consolidate(
        self, source: str = "working", target: str = "stm", max_entries: int = 20
    ) -> dict[str, Any]:
        """Summarise your newest `source` memories into one `target` entry that names them as its
        sources (the sources stay until their own scope prunes them)."""
        source_id, target_id = self.resolve([source, target])
        by_id = {c.memory_scope: c for c in self.scopes().values()}
        store = self.service().store
        entries = sorted(await store.entries(source_id), key=lambda e: e.created_at)
        picked = entries[-max(1, min(max_entries, 100)) :]
        if not picked:
            return {"consolidated": 0}
        target_cap = by_id[target_id]
        made = await SummarizingTransformer().transform(picked, target_cap)
        ids = []
        for n, memory in enumerate(made):
            if memory.entry_id is None:  # a redo (whose summary may read otherwise) finds its entry
                sources = [e.entry_id for e in picked]  # ... made of the same sources
                memory = memory.model_copy(update={"entry_id": entry_id_for(target_id, n, *sources)})
            outcome = await target_cap.write(memory)
            ids.append(outcome.entry.entry_id)
        return {"consolidated": len(picked), "entries": ids}

    def _who(self) -> str | None:
        return self.agent.agent_id if self.agent is not None else None

    # -- the prompt ---------------------------------------------------------------------------------

    async def memory_sections(self, task: str | None = None) -> list[str]:
        """One rendered section per lens (those with entries), ranked by the task's meaning."""
        own = self.scopes()
        sections = []
        for lens in self.lenses:
            scope_ids = (
                [own[s].memory_scope for s in lens.scopes if s in own] if lens.scopes else self.resolve(None)
            )
            if not scope_ids:
                continue
            found = await self.service().recall(lens.to_query(task), scope_ids)
            rendered = render_lens(lens, found)
            if rendered:
                sections.append(rendered)
        return sections
