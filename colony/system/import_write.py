"""The two fenced commits of an agent import (docs/transfer.md, step 4): the agent's state without
its blueprint and suspension request, then those (`colony.system.transfer` writes the blocks and
memory between them). Also used to put back the agent an import replaced, when that import fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from colony.agents.models import AgentMetadata, AgentState
from colony.agents.state.persistence import MAX_CONTEXT_ITEMS, STATE_NAMES
from colony.blackboard import Blackboard, Transaction
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.blackboard.protocol import MemoryProtocol
from colony.config import ColonySettings
from colony.errors import AgentStateConflict, ConcurrentModificationError, ContextError
from colony.system.export_document import PARTS, AgentExport

LIFECYCLE = Keys.key("lifecycle")
# the longest an import may write (it is cut off and undone after it): until then its mark on the
# lifecycle keeps other imports out (409) and `colony doctor` from pruning what it writes
IMPORT_LEASE_SECONDS = 600.0


@dataclass
class Landing:
    """What the commits write besides the document's state: who the agent is, its code, its
    lifecycle while it is written (`pending`) and after (`lifecycle`), its suspension request."""

    metadata: AgentMetadata
    blueprint: str
    pending: dict[str, Any]
    lifecycle: dict[str, Any]
    suspension: dict[str, Any] | None


def imported_lifecycle(doc: AgentExport, done: bool, token: str = "") -> dict[str, Any]:
    """The lifecycle of an agent being imported (`token`: the import's own mark, which its undo
    recognises, with the time its lease ends) or imported."""
    how = "imported" if done else "being imported"
    now = time.time()
    value = {
        "state": AgentState.SUSPENDED.value,
        "since": now,
        "reason": f"{how} from tenant {doc.source.tenant_id} colony {doc.source.colony_id}",
        "previous": doc.state.value,
    }
    return value if done else {**value, "import": token, "import_until": now + IMPORT_LEASE_SECONDS}


def importing(value: Any, now: float) -> bool:
    """Whether a stored lifecycle `value` is that of an import still within its lease (a crashed
    import's mark is past it: its keys are then orphans)."""
    if not isinstance(value, dict) or not value.get("import"):
        return False
    until = value.get("import_until")
    return isinstance(until, int | float) and until > now


async def fenced_commit(tx: Transaction, agent_id: str, version: int, what: str) -> list[Any]:
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


async def write_state(
    board: Blackboard,
    doc: AgentExport,
    landing: Landing,
    scopes: list[str],
    settings: ColonySettings,
    version: int,
) -> int:
    """Every agent entry and ring but the blueprint and the suspension request, in one transaction
    applied only if the agent's lifecycle is still at `version` (0: absent): an agent resumed,
    created or changed meanwhile is never written over. Its rings are emptied in that same
    transaction. Returns the lifecycle's new version."""
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
    tx.write(Keys.key("metadata"), landing.metadata.model_dump(mode="json"), created_by=by)
    tx.write(LIFECYCLE, landing.pending, created_by=by)
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
    results = await fenced_commit(tx, doc.agent_id, version, "resumed, created or changed")
    return version_of(results)


async def release(board: Blackboard, agent_id: str, landing: Landing, version: int) -> int:
    """The second commit: the blueprint and the suspension request (the lifecycle written again
    after it, as a suspension does), only if no other import took the agent meanwhile. Returns the
    lifecycle's new version."""
    tx = board.transaction()
    tx.write(Keys.key("blueprint"), landing.blueprint, created_by=agent_id)
    if landing.suspension is not None:
        tx.write(Keys.key("suspension"), landing.suspension, created_by=agent_id)
    tx.write(LIFECYCLE, landing.lifecycle, created_by=agent_id)
    return version_of(await fenced_commit(tx, agent_id, version, "imported again (another import)"))


def version_of(results: list[Any]) -> int:
    for entry in results:
        if entry is not None and entry.key == LIFECYCLE:
            return int(entry.version)
    raise ContextError("the import's commit wrote no lifecycle")  # unreachable: it writes one
