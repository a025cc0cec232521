"""Agent memory over HTTP: the map of an agent's scopes, recall, seeding writes and reindexing.

Every route reads Redis (the one source of truth for memory) through the process's MemoryService,
so any API replica answers the same for any agent, wherever the agent is hosted. An agent's memory
is what its MemoryCapabilities registered in its own scope (`mem:scopes`): a request can name only
those scopes, by type ("working", "stm", "ltm:episodic", ...) or by full id, and a name the agent
does not have is a 404, never a read of some other scope. Scope ids, entry ids and tags reach
Redis keys only after that check or the patterns of colony.api.schemas.

Shared scopes (collective, task, global) the agent is a member of are not the agent's own: the map
shows those it may read (by their stored rules, as the agent's `memory_map` action does), and
their entries are read and written through /v1/memory/shared/{name} only, under the rules and
token scopes of those routes (a name of one here is a 404 that says so).

Writes are for seeding and tests: they go through MemoryStore.write (exact and near-duplicate
dedup, bounds of the `memory.*` settings: 422 naming the field; the scope's TTL and cap, as for
every writer); the agent's own ingestion takes the entry in from the scope's event stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError

from colony import metrics
from colony.api.deps import GUARDED, ApiContext, Context, settings_of
from colony.api.errors import MemoryScopeNotFound
from colony.api.idempotency import effect_key
from colony.api.params import AgentId
from colony.api.schemas import (
    MEMORY,
    MEMORY_WRITE,
    EntryBody,
    MemoryQueryBody,
    MemoryWrite,
    RecallBody,
    RecalledEntries,
    Reindexed,
    WrittenMemory,
)
from colony.api.tenancy import within_bytes
from colony.blackboard import TagFilter
from colony.config import ColonySettings
from colony.errors import AgentNotFound, InvalidArgument
from colony.memory.introspection import agent_memory_map, agent_memory_scopes, agent_scope
from colony.memory.scopes import MemoryScope
from colony.memory.service import MemoryService, memory_service
from colony.memory.shared import shared_name, unreadable_by
from colony.memory.types import MemoryMap, MemoryQuery, NewMemory
from colony.wire.input_check import check_input

WRITER = "api"  # created_by of entries written over HTTP (every client shares the one token)
router = APIRouter(dependencies=[*GUARDED, Depends(within_bytes)])  # 429 past a tenant's bytes


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())


def _scope_type(scope: str) -> str:
    try:
        return MemoryScope.scope_type(scope)
    except ValueError:
        return "unknown"


@dataclass
class AgentMemory:
    """One request's view of an agent's memory: the scopes it has and the service to read them."""

    agent_id: str
    settings: ColonySettings
    service: MemoryService
    scopes: list[str]  # its own (private) scopes
    shared: list[str]  # shared scopes it is a member of

    def _missing(self, name: str) -> MemoryScopeNotFound:
        for scope in self.shared:
            if scope == name or _scope_type(scope) == name:
                shared = shared_name(scope)
                return MemoryScopeNotFound(
                    f"{name[:80]!r} is shared memory ({shared}), not agent {self.agent_id!r}'s own: read "
                    f"and write it with /v1/memory/shared/{shared} (its access rules apply there)"
                )
        have = ", ".join(sorted({_scope_type(s) for s in self.scopes})) or "none"
        return MemoryScopeNotFound(
            f"agent {self.agent_id!r} has no memory scope {name[:80]!r} (its scope types: {have}; "
            f"GET /v1/agents/{self.agent_id}/memory lists their ids)"
        )

    def select(self, names: list[str] | None) -> list[str]:
        """The agent's scopes named by type or full id (None: all of them); 404 on a name it lacks."""
        if names is None:
            return list(self.scopes)
        chosen: list[str] = []
        for name in names:
            matched = [s for s in self.scopes if s == name or _scope_type(s) == name]
            if not matched:
                raise self._missing(name)
            chosen += matched
        return list(dict.fromkeys(chosen))

    def one(self, name: str) -> str:
        """Exactly one of the agent's scopes (a write goes to one); 422 when a type names several."""
        matched = self.select([name])
        if len(matched) > 1:
            raise InvalidArgument(
                f"scope: agent {self.agent_id!r} has {len(matched)} scopes of type {name!r}; give the full "
                f"id of one: {', '.join(matched)}"
            )
        return matched[0]


def checked(body: RecallBody | EntryBody, max_depth: int) -> None:
    """What JSON parsing lets through and Redis or other clients cannot take: NaN/Infinity,
    lone surrogates, nesting past api.max_input_depth (422 naming the place)."""
    payload = body.model_dump()
    if payload.get("time_range") is not None:
        payload["time_range"] = list(payload["time_range"])
    try:
        check_input(payload, max_depth, "body")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


async def _agent_memory(ctx: ApiContext, agent_id: str) -> AgentMemory:
    services = await ctx.services()
    if await services.registry.get(agent_id) is None:
        raise AgentNotFound(f"no agent named {agent_id!r}")
    settings = settings_of(services)
    service = memory_service(services.runs.api_board, settings)
    own = agent_scope(agent_id, settings.tenant_id, settings.colony_id)
    scopes = await agent_memory_scopes(service.store.board(own), own)
    private = [s for s in scopes if shared_name(s) is None]
    return AgentMemory(agent_id, settings, service, private, [s for s in scopes if s not in private])


# the path's GET and POST are routes of one app, so a 405 on it names both in `Allow`
@router.get("/v1/agents/{agent_id}/memory", response_model=MemoryMap, responses=MEMORY)
async def memory_map(agent_id: AgentId, ctx: Context) -> MemoryMap:
    """The agent's memory: every scope (type, purpose, entries and cap, TTL, pending ingestion,
    tags present) and the dataflow edges between them, shared scopes only while it may read them;
    an agent without memory: no scopes."""
    memory = await _agent_memory(ctx, agent_id)
    settings, store = memory.settings, memory.service.store
    return await agent_memory_map(
        store,
        agent_id,
        tenant_id=settings.tenant_id,
        colony_id=settings.colony_id,
        hidden=unreadable_by(store, agent_id),
    )


@router.post("/v1/agents/{agent_id}/memory/query", response_model=RecalledEntries, responses=MEMORY_WRITE)
async def memory_query(agent_id: AgentId, body: MemoryQueryBody, ctx: Context) -> RecalledEntries:
    """Recall: entries of the agent's scopes (`scopes`: types or ids of its own) passing the
    filters, ranked by relevance in [0, 1], at most `max_results` (and memory.max_recall_results).
    A `time_range` whose start is after its end matches nothing."""
    checked(body, ctx.api.max_input_depth)
    memory = await _agent_memory(ctx, agent_id)
    return await recall(memory.service, memory.select(body.scopes), body)


async def recall(service: MemoryService, scopes: list[str], body: RecallBody) -> RecalledEntries:
    """A recall request's entries of `scopes` (none for no scope or a time range ending before it starts)."""
    empty_range = body.time_range is not None and body.time_range[0] > body.time_range[1]
    if not scopes or empty_range:
        return RecalledEntries(entries=[])
    fields = body.model_dump(exclude={"scopes", "tag_filter"})
    fields["max_results"] = min(body.max_results, service.settings.memory.max_recall_results)
    if body.tag_filter is not None:
        fields["tag_filter"] = TagFilter(**body.tag_filter.model_dump())
    try:
        query = MemoryQuery(**fields)
    except ValidationError as exc:
        raise InvalidArgument(_problems(exc)) from None
    return RecalledEntries(entries=await service.recall(query, scopes))


@router.post(
    "/v1/agents/{agent_id}/memory",
    status_code=201,
    response_model=WrittenMemory,
    responses={
        **MEMORY_WRITE,
        200: {"model": WrittenMemory, "description": "the scope already held it: nothing written"},
    },
)
async def memory_write(
    agent_id: AgentId, body: MemoryWrite, response: Response, ctx: Context, request: Request
) -> WrittenMemory:
    """Store an entry in one of the agent's scopes (201; 200 with `created` false when the scope
    already held the same text or entry id). The scope's TTL applies unless `ttl_seconds` is
    given, and its cap is kept (lowest decayed relevance pruned first). Sent with an
    Idempotency-Key and no `entry_id`, the entry's id derives from the key (`effect_key`): a retry
    whose first try wrote the entry and then answered 5xx finds it (answered as created), never
    writes it twice."""
    checked(body, ctx.api.max_input_depth)
    memory = await _agent_memory(ctx, agent_id)
    return await write_entry(memory.service, memory.one(body.scope), body, request, response)


async def write_entry(
    service: MemoryService, scope: str, body: EntryBody, request: Request, response: Response
) -> WrittenMemory:
    """Store a write request's entry in `scope` (200 instead of 201 when it was held already);
    with an Idempotency-Key and no `entry_id`, the entry's id derives from the key."""
    keyed = effect_key(request)
    derived = f"http-{keyed}" if keyed is not None and body.entry_id is None else None
    fields = body.model_dump(exclude={"scope"})
    if derived is not None:
        fields["entry_id"] = derived
    try:
        new = NewMemory(**fields)
    except ValidationError as exc:
        raise InvalidArgument(_problems(exc)) from None
    # the store applies the scope's TTL (when none is given) and keeps its cap
    outcome = await service.store.write(scope, new, created_by=WRITER, similar=service.nearest)
    redone = derived is not None and outcome.duplicate_of == derived  # this request's entry, written before
    created = outcome.created or redone
    metrics.MEMORY_WRITES.labels(_scope_type(scope), "created" if outcome.created else "duplicate").inc()
    if not created:
        response.status_code = 200
    return WrittenMemory(
        entry=outcome.entry, created=created, duplicate_of=None if redone else outcome.duplicate_of
    )


@router.post(
    "/v1/agents/{agent_id}/memory/reindex",
    response_model=Reindexed,
    response_model_exclude_none=True,
    responses=MEMORY,
)
async def memory_reindex(agent_id: AgentId, ctx: Context) -> Reindexed:
    """Rebuild the derived indexes of every scope of the agent's own from Redis: the vector rows
    in Chroma (re-embedded) and this process's keyword index. Entries embedded, per scope."""
    memory = await _agent_memory(ctx, agent_id)
    if not memory.scopes:
        return Reindexed(scopes={}, vector=False)
    counts = {scope: await memory.service.reindex(scope) for scope in memory.scopes}
    vector = (await memory.service.retriever()).vector is not None
    return Reindexed(scopes=counts, vector=vector, vector_error=memory.service.vector_error)
