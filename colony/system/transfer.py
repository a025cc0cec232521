"""Agent export and import: one JSON document carries an agent's persisted state from one colony
(or Redis) to another, where it resumes at the step it had reached (docs/transfer.md).

The document holds data only. The one piece of an agent that is code, its blueprint (cloudpickled),
is never taken from a document on trust: the importing colony rebuilds it from its own catalog (a
built-in or an operator's `agents:` entry, by name), or accepts the document's signed blueprint only
when its HMAC verifies under the importing colony's own secret (the same trust a replica gives a
blueprint it reads from Redis): only once it verifies is it loaded, for its metadata. A blueprint
that does not verify is never unpickled. Anything else is refused (`ImportRejected`).

Everything else is validated (pydantic models with bounds, ids by pattern, nesting depth, the whole
document within `context.max_export_bytes`), and every Redis key is built by the protocol classes
from validated names; the document chooses no key, scope or file.

An export is taken while the agent is not RUNNING (idle, waiting, suspended, or ended): a step in
progress is refused with 409 (`AgentStateConflict`). It is a consistent snapshot: the agent's
lifecycle is read before and after, and a change in between (a run began) takes it again.
An import writes nothing before its first transaction, fenced on the agent's lifecycle (a refused
import leaves an agent of that id as it was); that commit holds the state without the blueprint, so
no replica can restore the agent while its blocks and memory are written; a second fenced commit
adds the blueprint and an IMMEDIATE resumption condition, and the agent is registered SUSPENDED:
the resumption monitor places it on a replica, which drives its unfinished run on from the step it
had reached. Who the agent is (role, type, priority) comes from its trusted blueprint, never from
the document.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import (
    TypeAdapter,
    ValidationError,
)

from colony.agents.models import (
    TERMINAL_STATES,
    AgentMetadata,
    AgentState,
    ResumptionCondition,
    ResumptionKind,
    SuspensionRequest,
)
from colony.agents.state.persistence import MAX_CONTEXT_ITEMS, STATE_NAMES
from colony.blackboard import Blackboard, BlackboardScope, Transaction, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.blackboard.protocol import BlackboardProtocol, MemoryProtocol
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    ColonyError,
    ConcurrentModificationError,
    ContextError,
    ImportRejected,
    InvalidArgument,
    InvalidKey,
)
from colony.memory.blocks import SYSTEM, BlockType, NewBlock, block_store
from colony.memory.introspection import agent_memory_scopes
from colony.memory.store import MemoryStore
from colony.memory.types import NewMemory
from colony.system.export_document import (
    BLOCK_SETTINGS,
    FORMAT,
    FORMAT_VERSION,
    MAX_HISTORY,
    PARTS,
    STATE_VALUES,
    AgentExport,
    AgentIdText,
    ExportedMemory,
    json_bytes,
    parse_document,
)
from colony.system.import_trust import trusted_blueprint
from colony.system.registry import AgentRecord, AgentRegistry

EXPORT_ATTEMPTS = 3  # snapshots retaken when the agent changed while it was read
LIFECYCLE = Keys.key("lifecycle")


# -- export ---------------------------------------------------------------------------------------


def agent_board(blackboard: Blackboard, agent_id: str, tenant_id: str, colony_id: str) -> Blackboard:
    return blackboard.scoped(
        scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)
    )


_ID_ADAPTER: TypeAdapter[str] = TypeAdapter(AgentIdText)


def _check_agent_id(agent_id: str) -> str:
    try:
        return _ID_ADAPTER.validate_python(agent_id)
    except ValidationError:
        raise InvalidArgument(f"agent id {agent_id[:80]!r}: 1-128 letters, digits, '_', '.', '-'") from None


def _state_of(entry: Any) -> AgentState:
    value = entry.value if isinstance(entry.value, dict) else {}
    try:
        return AgentState(value.get("state"))
    except ValueError:
        raise ContextError(
            f"the stored lifecycle holds no known state ({str(value.get('state'))[:32]!r})"
        ) from None


async def export_agent(
    blackboard: Blackboard,
    agent_id: str,
    *,
    settings: ColonySettings,
    tenant_id: str | None = None,
    colony_id: str | None = None,
) -> dict[str, Any]:
    """The export document of `agent_id` of the colony (`settings`' tenant and colony unless
    given), read from the Redis `blackboard` is on. AgentNotFound when it has no state there;
    AgentStateConflict while it is RUNNING or when it kept changing; ContextError when the
    document would exceed `context.max_export_bytes`."""
    tenant = tenant_id or settings.tenant_id
    colony = colony_id or settings.colony_id
    _check_agent_id(agent_id)
    board = agent_board(blackboard, agent_id, tenant, colony)
    for _ in range(EXPORT_ATTEMPTS):
        before = await board.read(LIFECYCLE)
        if before is None:
            raise AgentNotFound(f"no agent {agent_id!r} in colony {colony!r} (tenant {tenant!r}) to export")
        state = _state_of(before)
        if state is AgentState.RUNNING:
            raise AgentStateConflict(
                f"agent {agent_id} is running a step; an export is taken between runs or while the agent "
                f"is idle, waiting or suspended: wait for its run to end, or suspend it (POST "
                f"/v1/agents/{agent_id}/suspend), then export again"
            )
        document = await _gather(board, agent_id, state, settings, tenant, colony)
        after = await board.read(LIFECYCLE)
        if after is not None and after.version == before.version:
            _bounded(agent_id, len(json_bytes(document)), settings)
            return document
    raise AgentStateConflict(
        f"agent {agent_id} changed state while it was exported ({EXPORT_ATTEMPTS} tries); suspend it "
        f"(POST /v1/agents/{agent_id}/suspend) and export again"
    )


def _bounded(agent_id: str, size: int, settings: ColonySettings) -> None:
    limit = settings.context.max_export_bytes
    if size > limit:
        raise ContextError(
            f"the export of agent {agent_id} is over {limit} bytes (context.max_export_bytes): raise that "
            "setting (on both colonies) or trim the agent's memory first"
        )


async def _gather(
    board: Blackboard, agent_id: str, state: AgentState, settings: ColonySettings, tenant: str, colony: str
) -> dict[str, Any]:
    entries = await board.read_many([Keys.key(n) for n in STATE_NAMES])
    stored = {
        name: (e.value if e is not None else None) for name, e in zip(STATE_NAMES, entries, strict=True)
    }
    if stored["blueprint"] is None or stored["metadata"] is None:
        raise AgentNotFound(f"agent {agent_id!r} has no stored blueprint or metadata: nothing to export")
    run = None
    if isinstance(stored["current_run"], str):
        run_entry = await board.read(Keys.run_key(stored["current_run"]))
        run = run_entry.value if run_entry is not None else None
    head = stored["context"] if isinstance(stored["context"], dict) else None
    capabilities = {}
    async for entry in board.iter_query(Keys.pattern("capability_state")):
        name = Keys.parse("capability_state", entry.key)["name"]
        capabilities[name] = entry.value
    parts: dict[str, Any] = {}
    for name in PARTS:
        entry = await board.read(Keys.key(name))
        ring = await board.ring(Keys.key(name))
        if entry is not None or ring:
            parts[name] = {"entry": entry.value if entry is not None else None, "ring": ring or None}
    archived = {}
    async for entry in board.iter_query(Keys.pattern("archived_output")):
        archived[Keys.parse("archived_output", entry.key)["digest"]] = entry.value
    catalog = agent_id if agent_id in _catalog_names(settings) else None
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": time.time(),
        "source": {"tenant_id": tenant, "colony_id": colony},
        "agent_id": agent_id,
        "state": state.value,
        "blueprint": {"catalog": catalog, "signed": stored["blueprint"]},
        "metadata": stored["metadata"],
        "current_run": run,
        "policy_state": stored["policy_state"],
        "context": {"head": head, "items": await board.ring(Keys.key("context")) if head else []},
        "capabilities": capabilities,
        "suspension": stored["suspension"],
        "parts": parts,
        "archived": archived,
        "blocks": await _export_blocks(board, agent_id, settings),
        "memory": await _export_memory(board, settings),
    }


def _catalog_names(settings: ColonySettings) -> set[str]:
    from colony.system.catalog import BUILTIN_AGENTS  # here: the catalog imports the built-in agents

    return set(BUILTIN_AGENTS) | set(settings.agents)


async def _export_blocks(board: Blackboard, agent_id: str, settings: ColonySettings) -> list[dict[str, Any]]:
    store = block_store(board.redis, settings)
    blocks = []
    for info in sorted(await store.list_owned(agent_id), key=lambda i: i.label):
        view = await store.read(agent_id, info.label, owner=agent_id)
        history = await store.history(agent_id, info.label, owner=agent_id, limit=MAX_HISTORY)
        settings_of_block = info.model_dump(mode="json", include=BLOCK_SETTINGS)
        blocks.append(
            {
                **settings_of_block,
                "template": info.template or None,
                "content": "" if info.block_type is BlockType.LOG else view.content,
                "entries": view.entries,
                "version": view.version,
                "history": [v.model_dump(mode="json") for v in history.versions],
            }
        )
    return blocks


async def _export_memory(board: Blackboard, settings: ColonySettings) -> list[dict[str, Any]]:
    """Entries of the agent's own memory scopes (shared colony scopes stay with their colony)."""
    store = MemoryStore(board, settings)
    prefix = board.scope_id + ":namespace:"
    scopes, size, fields = [], 0, set(ExportedMemory.model_fields)
    for scope in await agent_memory_scopes(board, board.scope_id):
        if not scope.startswith(prefix):
            continue
        entries = [e.model_dump(mode="json", include=fields) for e in await store.entries(scope)]
        size += len(json_bytes({"entries": entries}))
        _bounded(board.scope_id.rsplit(":", 1)[-1], size, settings)  # before the rest is read
        scopes.append({"namespace": scope[len(prefix) :], "entries": entries})
    return scopes


# -- import ---------------------------------------------------------------------------------------


async def import_agent(
    blackboard: Blackboard,
    document: Any,
    *,
    settings: ColonySettings,
    registry: AgentRegistry,
    catalog: str | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """Write an exported agent into this colony (`settings`' tenant and colony) on the Redis
    `blackboard` is on, and register it SUSPENDED with an IMMEDIATE resumption condition (the
    resumption monitor resumes it on a replica, at the step it had reached).

    An agent of that id that exists here and has not ended: AgentStateConflict (409), unless
    `replace` and it is suspended (a hosted one must be suspended first). Blocks of that agent id
    already here: 409 too unless `replace`. Returns what was imported.

    Nothing is written before the first commit, which is fenced on the agent's lifecycle: an
    import refused there (the agent was resumed or changed meanwhile) leaves the agent here as it
    was. That commit writes the state without the blueprint and the suspension request, so no
    replica can restore the agent (`restore_agent` needs its blueprint) and the monitor has no
    condition to meet while its blocks and memory are written; a second fenced commit then adds
    them, and the registry record follows."""
    doc = parse_document(document, settings.context.max_export_bytes)
    trusted = trusted_blueprint(doc, settings, catalog)
    tenant, colony = settings.tenant_id, settings.colony_id
    # who the agent is (role, type) decides routing and trust: its trusted blueprint's, never the
    # document's; its parent is dropped (children are not exported, nor parents)
    metadata = trusted.metadata.model_copy(
        update={"parent_id": None, "tenant_id": tenant, "colony_id": colony}
    )
    board = agent_board(blackboard, doc.agent_id, tenant, colony)
    found = await board.read(LIFECYCLE)
    await _check_free(doc.agent_id, found, await registry.get(doc.agent_id), replace)
    store = block_store(board.redis, settings)
    blocks = _new_blocks(store, doc)
    taken = [b.label for b in doc.blocks if await store.info_of(store.block_id(doc.agent_id, b.label))]
    if taken and not replace:
        raise AgentStateConflict(
            f"agent {doc.agent_id} already has blocks here ({', '.join(taken)}); import with replace=true "
            "to overwrite them"
        )
    memories = _new_memories(board, doc)
    scopes = [scope for scope, _ in memories]
    version = await _write_state(
        board, doc, metadata, scopes, settings, found.version if found is not None else 0
    )
    try:
        await _import_blocks(store, doc, blocks)
        entries = await _import_memory(board, doc, memories, settings)
    except ImportRejected as exc:
        raise ImportRejected(
            f"{exc} (agent {doc.agent_id}'s state is written but it has no blueprint here, so it is never "
            "resumed: fix that and import the document again with replace=true)"
        ) from exc
    await _release(board, doc, trusted.text, version)
    await registry.put(
        AgentRecord(
            agent_id=doc.agent_id,
            role=metadata.role,
            agent_type=metadata.agent_type.value,
            state=AgentState.SUSPENDED.value,
        )
    )
    run = doc.current_run
    return {
        "agent_id": doc.agent_id,
        "state": AgentState.SUSPENDED.value,
        "resumes": ResumptionKind.IMMEDIATE.value,
        "blueprint": trusted.origin,
        "source": doc.source.model_dump(),
        "run_id": run.run_id if run is not None else None,
        "run_status": run.status.value if run is not None else None,
        "step": run.steps if run is not None else None,
        "blocks": len(doc.blocks),
        "memory_entries": entries,
        "replaced": found is not None,
    }


async def _check_free(agent_id: str, found: Any, record: AgentRecord | None, replace: bool) -> None:
    state = _state_of(found) if found is not None else None
    if state is None and record is not None and record.state not in ("suspended", "stopped", "failed"):
        state = AgentState(record.state) if record.state in STATE_VALUES else AgentState.IDLE
    if state is None or state in TERMINAL_STATES:
        return  # a new id, or an ended agent: the imported one takes its place (like a spawn)
    if state is not AgentState.SUSPENDED:
        raise AgentStateConflict(
            f"agent {agent_id} is live in this colony ({state.value}); it is never overwritten while a "
            f"replica hosts it: suspend it (POST /v1/agents/{agent_id}/suspend) and import with "
            "replace=true, or stop it first"
        )
    if not replace:
        raise AgentStateConflict(
            f"agent {agent_id} already exists in this colony (suspended); import with replace=true to "
            "overwrite it with the document"
        )


def _new_blocks(store: Any, doc: AgentExport) -> list[NewBlock]:
    """The document's blocks as blocks to create, checked against this colony's block limits
    before anything is written."""
    blocks = []
    for block in doc.blocks:
        content = "" if block.block_type is BlockType.LOG else block.content
        limit = block.char_limit
        if limit > store.settings.max_char_limit or len(content.removesuffix("\n")) > limit:
            raise ImportRejected(
                f"block {block.label!r} does not fit this colony's blocks (char_limit {limit}, content "
                f"{len(content)} characters, blocks.max_char_limit {store.settings.max_char_limit})"
            )
        blocks.append(NewBlock(**block.model_dump(include=BLOCK_SETTINGS | {"template"}), content=content))
    return blocks


async def _import_blocks(store: Any, doc: AgentExport, blocks: list[NewBlock]) -> None:
    """Create the blocks (one of that label the agent owns here is replaced); a log block's
    entries are appended with their original times."""
    for block, exported in zip(blocks, doc.blocks, strict=True):
        try:
            if await store.info_of(store.block_id(doc.agent_id, block.label)):
                await store.delete(SYSTEM, doc.agent_id, block.label)
            await store.create(doc.agent_id, block, created_by=SYSTEM)
            logged = (exported.entries or []) if block.block_type is BlockType.LOG else []
            for entry in logged:
                await store.log_append(doc.agent_id, block.label, entry, via="system")
        except (InvalidArgument, ColonyError) as exc:
            raise ImportRejected(f"block {block.label!r} cannot be created here: {exc}") from exc


def _new_memories(board: Blackboard, doc: AgentExport) -> list[tuple[str, list[NewMemory]]]:
    """The document's memory entries as entries to write, by target scope (the agent's own scopes
    here), checked before anything is written; entries expired in transit are dropped."""
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


async def _import_memory(
    board: Blackboard,
    doc: AgentExport,
    memories: list[tuple[str, list[NewMemory]]],
    settings: ColonySettings,
) -> int:
    store, written = MemoryStore(board, settings), 0
    for (target, entries), scope in zip(memories, doc.memory, strict=True):
        try:
            outcomes = await store.write_many(target, entries, created_by=doc.agent_id)
        except InvalidArgument as exc:
            raise ImportRejected(f"memory of {scope.namespace} cannot be written here: {exc}") from exc
        written += sum(o.created for o in outcomes)
    return written


def _lifecycle(doc: AgentExport, done: bool) -> dict[str, Any]:
    how = "imported" if done else "being imported"
    return {
        "state": AgentState.SUSPENDED.value,
        "since": time.time(),
        "reason": f"{how} from tenant {doc.source.tenant_id} colony {doc.source.colony_id}",
        "previous": doc.state.value,
    }


async def _fenced_commit(tx: Transaction, agent_id: str, version: int, what: str) -> list[Any]:
    """Commit `tx` only if the agent's lifecycle is still at `version` (0: absent)."""
    refused = AgentStateConflict(
        f"agent {agent_id} was {what} here during the import; import it again (with replace=true if "
        "it is suspended)"
    )
    stored = await tx.read(LIFECYCLE)  # in the read set: the commit checks it did not change
    if (stored.version if stored is not None else 0) != version:
        raise refused
    try:
        return await tx.commit()
    except ConcurrentModificationError:
        raise refused from None


async def _write_state(
    board: Blackboard,
    doc: AgentExport,
    metadata: AgentMetadata,
    scopes: list[str],
    settings: ColonySettings,
    version: int,
) -> int:
    """Every agent entry and ring but the blueprint and the suspension request, in one transaction
    applied only if the agent's lifecycle is still at `version` (0: absent): an agent resumed,
    created or changed meanwhile is never written over. Its rings are emptied in that same
    transaction. The lifecycle is written over, never deleted, so its version only grows (a second
    import, or a stale copy, can never find the version it expects again). Returns the new version."""
    old_capabilities = [e.key async for e in board.iter_query(Keys.pattern("capability_state"))]
    old_archived = [e.key async for e in board.iter_query(Keys.pattern("archived_output"))]
    caps = {
        "checkpoints": settings.context.checkpoints_kept,
        "action_log": settings.context.action_log_max_entries,
    }
    by = doc.agent_id
    tx = board.transaction()
    names = [n for n in (*STATE_NAMES, *PARTS) if n != "lifecycle"]
    for key in [*(Keys.key(n) for n in names), MemoryProtocol.scopes_key(), *old_capabilities, *old_archived]:
        tx.delete(key)
    for name in ("context", *PARTS):
        tx.ring_truncate(Keys.key(name), 0)
    tx.write(Keys.key("metadata"), metadata.model_dump(mode="json"), created_by=by)
    tx.write(LIFECYCLE, _lifecycle(doc, done=False), created_by=by)
    if doc.current_run is not None:
        run = doc.current_run
        ttl = settings.runs.retention_seconds if run.done else None
        tx.write(Keys.run_key(run.run_id), run.model_dump(mode="json"), created_by=by, ttl_seconds=ttl)
        tx.write(Keys.key("current_run"), run.run_id, created_by=by)
    if doc.policy_state is not None:
        tx.write(Keys.key("policy_state"), doc.policy_state, created_by=by)
    for name, capability in doc.capabilities.items():
        # events_from is a position in the source's event stream: the agent starts from now here
        tx.write(
            Keys.capability_state_key(name), {"state": capability.state, "events_from": None}, created_by=by
        )
    if doc.context.head is not None:
        tx.write(Keys.key("context"), doc.context.head.model_dump(mode="json"), created_by=by)
        tx.ring_push(Keys.key("context"), doc.context.items, MAX_CONTEXT_ITEMS)
    for name, part in doc.parts.items():
        if part.entry is not None:
            tx.write(Keys.key(name), part.entry, created_by=by)
        if part.ring:
            tx.ring_push(Keys.key(name), part.ring, caps[name])
    for digest, value in doc.archived.items():
        tx.write(Keys.archived_output_key(digest), value, created_by=by)
    if scopes:
        tx.write(MemoryProtocol.scopes_key(), scopes, created_by=by)
    results = await _fenced_commit(tx, doc.agent_id, version, "resumed, created or changed")
    return _version_of(results)


async def _release(board: Blackboard, doc: AgentExport, blueprint: str, version: int) -> None:
    """The second commit: the blueprint and the IMMEDIATE suspension request (the lifecycle written
    again after it, as a suspension does), only if no other import took the agent meanwhile."""
    by = doc.agent_id
    condition = ResumptionCondition(kind=ResumptionKind.IMMEDIATE, reason="imported")
    tx = board.transaction()
    tx.write(Keys.key("blueprint"), blueprint, created_by=by)
    request = SuspensionRequest(agent_id=doc.agent_id, condition=condition)
    tx.write(Keys.key("suspension"), request.model_dump(mode="json"), created_by=by)
    tx.write(LIFECYCLE, _lifecycle(doc, done=True), created_by=by)
    await _fenced_commit(tx, doc.agent_id, version, "imported again (another import)")


def _version_of(results: list[Any]) -> int:
    for entry in results:
        if entry is not None and entry.key == LIFECYCLE:
            return int(entry.version)
    raise ContextError("the import's state commit wrote no lifecycle")  # unreachable: it writes one
