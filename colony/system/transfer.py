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
An import is all or nothing: everything it would write is checked first (colony.system.import_plan:
block limits, blocks per owner, labels, memory entries), then every Redis key of the id is kept
(colony.system.import_snapshot: DUMP + PTTL, in memory, bounded), and nothing is written before its
first transaction, fenced on the agent's lifecycle (a refused import leaves an agent of that id as it
was); that commit holds the state without the blueprint, and the import's mark (with its lease), so no
replica can restore the agent and no other import or `colony doctor --prune-orphans` touches it while
its blocks and memory are written; a second fenced commit adds the blueprint and an IMMEDIATE
resumption condition, and the agent is registered SUSPENDED: the resumption monitor places it on a
replica, which drives its unfinished run on from the step it had reached. A failure after the first
commit restores the kept keys and removes the others: the id is exactly as it was before. Who the
agent is (role, type, priority) comes from its trusted blueprint, never from the document.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from pydantic import TypeAdapter, ValidationError

from colony.agents.models import (
    TERMINAL_STATES,
    AgentState,
    ResumptionCondition,
    ResumptionKind,
    SuspensionRequest,
)
from colony.agents.state.persistence import STATE_NAMES
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    ColonyError,
    ContextError,
    ImportRejected,
    InvalidArgument,
)
from colony.memory.blocks import SYSTEM, BlockType, NewBlock, agent_block_store
from colony.memory.introspection import agent_memory_scopes
from colony.memory.scopes import NAMESPACE_PREFIX
from colony.memory.store import MemoryStore
from colony.memory.types import NewMemory
from colony.system.agent_purge import UNLINK_BATCH
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
    check_state_size,
    json_bytes,
    parse_document,
)
from colony.system.import_plan import ImportPlan, plan_import
from colony.system.import_snapshot import KeySnapshot, memory_keys, restore_snapshot, take_snapshot
from colony.system.import_trust import trusted_blueprint
from colony.system.import_write import (
    IMPORT_LEASE_SECONDS,
    LIFECYCLE,
    Landing,
    imported_lifecycle,
    importing,
    release,
    write_state,
)
from colony.system.registry import AgentRecord, AgentRegistry

log = logging.getLogger(__name__)
EXPORT_ATTEMPTS = 3  # snapshots retaken when the agent changed while it was read


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
            try:
                check_state_size(document)
            except ValueError as exc:
                raise ContextError(f"the export of agent {agent_id} is refused: {exc}") from None
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
        # without its profile (for people, recomputed where the agent is hosted): a reader of
        # format version 1 that knows no `profile` field takes this document too
        "metadata": {k: v for k, v in stored["metadata"].items() if k != "profile"}
        if isinstance(stored["metadata"], dict)
        else stored["metadata"],
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
    store = agent_block_store(board.redis, settings, agent_id)
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

    An agent of that id that exists here and has not ended, or another import of it in progress:
    AgentStateConflict (409), unless `replace` and it is suspended (a hosted one must be suspended
    first); blocks the id owns here (an old agent's or provisioned): 409 too unless `replace`.

    All or nothing: everything is checked first (`plan_import`), the id's keys are kept
    (`take_snapshot`), then two commits fenced on the agent's lifecycle frame the block and memory
    writes (module docstring). A failure after that (a store refusing, Redis, a cancellation, the
    IMPORT_LEASE_SECONDS limit) puts the id back exactly as it was (`_undo`)."""
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
    store = agent_block_store(board.redis, settings, doc.agent_id)
    plan = await plan_import(store, MemoryStore(board, settings), board, doc, replace=replace)
    labels = [b.label for b in plan.blocks]
    kept = await take_snapshot(board, doc.agent_id, labels, settings)
    token = uuid.uuid4().hex
    condition = ResumptionCondition(kind=ResumptionKind.IMMEDIATE, reason="imported")
    landing = Landing(
        metadata=metadata,
        blueprint=trusted.text,
        pending=imported_lifecycle(doc, False, token),
        lifecycle=imported_lifecycle(doc, True),
        suspension=SuspensionRequest(agent_id=doc.agent_id, condition=condition).model_dump(mode="json"),
    )
    mine: set[int] = set()
    try:
        async with asyncio.timeout(IMPORT_LEASE_SECONDS):
            fence = (found.version if found else 0, mine)
            entries = await _land(board, doc, plan, landing, settings, fence, kept if replace else None)
            kind, suspended = metadata.agent_type.value, AgentState.SUSPENDED.value
            record = AgentRecord(agent_id=doc.agent_id, role=metadata.role, agent_type=kind, state=suspended)
            await registry.put(record)
    except BaseException as exc:
        # shielded: a second cancellation (a client gone, a timeout) does not cut the undo short
        await asyncio.shield(_undo(board, doc, settings, labels, kept, (mine, token), exc))
        if isinstance(exc, TimeoutError):
            raise ContextError(
                f"the import of agent {doc.agent_id} took longer than {IMPORT_LEASE_SECONDS:g}s and was "
                "undone: import it again when Redis answers faster"
            ) from None
        raise
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
    if found is not None and importing(found.value, time.time()):
        raise AgentStateConflict(
            f"agent {agent_id} is being imported here by another import (until it lands or is undone, at "
            f"most {IMPORT_LEASE_SECONDS:g}s); import it again once that one has answered (an import "
            "whose process died leaves keys that `colony doctor --prune-orphans` removes after that time)"
        )
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


async def _land(
    board: Blackboard,
    doc: AgentExport,
    plan: ImportPlan,
    landing: Landing,
    settings: ColonySettings,
    fence: tuple[int, set[int]],
    replaced: KeySnapshot | None,
) -> int:
    """The writes: the state commit, the blocks, the memory entries, the release commit (each
    commit's lifecycle version goes into `fence[1]`, which the undo recognises; the first commit is
    fenced on `fence[0]`). With `replaced` (a replace), the old agent's blocks the document lacks
    and its memory scopes are removed first. Returns the entries created."""
    version, mine = fence
    scopes = [scope for scope, _ in plan.memories]
    mine.add(await write_state(board, doc, landing, scopes, settings, version))
    store = agent_block_store(board.redis, settings, doc.agent_id)
    if replaced is not None:
        await _clear_replaced(board, store, doc, replaced)
    await _import_blocks(store, doc, plan.blocks)
    entries = await _import_memory(board, doc, plan.memories, settings)
    mine.add(await release(board, doc.agent_id, landing, max(mine)))
    return entries


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


# -- undo -------------------------------------------------------------------------------------------


async def _clear_replaced(board: Blackboard, store: Any, doc: AgentExport, kept: KeySnapshot) -> None:
    """What the agent a `replace` overwrites has and the document does not: its other blocks and
    every entry of its own memory scopes (the document's entries are then written alone)."""
    labels = {b.label for b in doc.blocks}
    for label in sorted(set(kept.blocks) - labels):
        await store.delete(SYSTEM, doc.agent_id, label)
    keys = memory_keys(kept, board.scope_id, NAMESPACE_PREFIX)
    for start in range(0, len(keys), UNLINK_BATCH):
        async with board.guard("import replace"):
            await board.redis.unlink(*keys[start : start + UNLINK_BATCH])


async def _undo(
    board: Blackboard,
    doc: AgentExport,
    settings: ColonySettings,
    labels: list[str],
    kept: KeySnapshot,
    marks: tuple[set[int], str],
    cause: BaseException,
) -> None:
    """After a failure: unless another agent's lifecycle now holds the id (one none of this
    import's commits wrote, without its mark: another import or a spawn took it), put the id back
    exactly as the snapshot taken before the first write found it (`restore_snapshot`)."""
    mine, token = marks
    try:
        now = await board.read(LIFECYCLE)
        value = now.value if now is not None and isinstance(now.value, dict) else {}
        if now is not None and now.version not in mine and value.get("import") != token:
            if not mine:
                return  # refused at the first commit: nothing of this import was written
            log.warning("import of agent %s failed (%r); the id was taken meanwhile", doc.agent_id, cause)
            return
        await restore_snapshot(board, kept, labels, settings)
        log.warning("import of agent %s failed (%r); the id was put back as it was", doc.agent_id, cause)
    except Exception:
        log.exception(
            "import of agent %s failed (%r) and its undo failed too: `colony doctor` lists the keys left "
            "(orphaned_agent_keys) and `colony doctor --prune-orphans` removes them",
            doc.agent_id,
            cause,
        )
