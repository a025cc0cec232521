"""Every Redis key of one agent id, found and removed: what `colony doctor --prune-orphans` removes
for an agent id that no registry record names (keys a crash left behind). The SCAN (`scan`) is also
how an import finds the keys it keeps to put back (colony.system.import_snapshot).

An agent id's keys are its blackboard scope and the scopes namespaced inside it (state entries,
rings, memory entries, run requests, event streams, tag and expiry indexes: all carry the scope id
as their hash tag, `BlackboardKeyspace.family_match`) and the memory blocks it owns (block ids are
digests: found through the owner's block index, plus any labels the caller names, for a block
whose creation stopped before its index was written). Finding them is a SCAN of the keyspace
(MATCH on the scope's hash tag), bounded by `MAX_SCAN_CALLS`: the agent scope has no index of its
keys. Nothing here checks whether the agent is live: the caller does (the doctor re-checks that no
record names the id and that its lifecycle is the one it saw just before it purges).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import ApiRunProtocol, BlackboardKeyspace, BlockProtocol
from colony.config import ColonySettings
from colony.memory.blocks import SYSTEM, agent_block_store
from colony.memory.scopes import AGENT_LEVELS, NAMESPACE_PREFIX, MemoryScope
from colony.memory.service import memory_service
from colony.wire.tenants import tenant_of

log = logging.getLogger(__name__)

SCAN_COUNT = 1000  # keys Redis looks at per SCAN call
MAX_SCAN_CALLS = 100_000  # 100 M keys looked at, at most, per listing
UNLINK_BATCH = 500


@dataclass
class AgentKeys:
    """What one agent id holds in Redis: its scope's keys and the labels of the blocks it owns."""

    keys: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    truncated: bool = False  # the SCAN stopped at MAX_SCAN_CALLS

    @property
    def count(self) -> int:
        return len(self.keys) + len(self.blocks)


def agent_scope(agent_id: str, tenant_id: str, colony_id: str) -> str:
    return scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)


async def scan(board: Blackboard, match: str, limit: int | None = None) -> tuple[list[str], bool]:
    """Redis keys matching `match` (a SCAN of the keyspace), at most `limit`; and whether the
    listing was cut short (limit or MAX_SCAN_CALLS)."""
    found: list[str] = []
    cursor = 0
    for _ in range(MAX_SCAN_CALLS):
        async with board.guard("scan"):
            cursor, keys = await board.redis.scan(cursor, match=match, count=SCAN_COUNT)
        found.extend(str(k) for k in keys)
        if limit is not None and len(found) >= limit:
            return found[:limit], True
        if int(cursor) == 0:
            return sorted(set(found)), False
    return sorted(set(found)), True


async def agent_keys(board: Blackboard, agent_id: str, *, tenant_id: str, colony_id: str) -> AgentKeys:
    """Every key `agent_id` holds in the colony: its scope family's and its owned blocks' labels."""
    scope = agent_scope(agent_id, tenant_id, colony_id)
    keys, truncated = await scan(board, BlackboardKeyspace(scope).family_match())
    blocks_of = tenant_of(agent_id, tenant_id)  # another tenant's agent: its blocks are in its namespace
    index = BlockProtocol.owner_index(BlockProtocol.namespace(blocks_of, colony_id), agent_id)
    async with board.guard("agent_keys"):
        labels = sorted(str(label) for label in await board.redis.hkeys(index))
    return AgentKeys(keys=keys, blocks=labels, truncated=truncated)


async def purge_agent(
    board: Blackboard,
    agent_id: str,
    *,
    settings: ColonySettings,
    labels: Iterable[str] = (),
) -> AgentKeys:
    """Delete every key of `agent_id` in the colony of `settings` (its tenant and colony): its
    blocks (those its index lists and `labels`), then its scope family's keys and the index of its
    HTTP runs' records. Returns what was
    deleted. The registry record is not touched (the caller decides about it)."""
    found = await agent_keys(board, agent_id, tenant_id=settings.tenant_id, colony_id=settings.colony_id)
    store = agent_block_store(board.redis, settings, agent_id)
    blocks = sorted({*found.blocks, *labels})
    deleted = [label for label in blocks if await store.delete(SYSTEM, agent_id, label)]
    for start in range(0, len(found.keys), UNLINK_BATCH):
        async with board.guard("purge_agent"):
            await board.redis.unlink(*found.keys[start : start + UNLINK_BATCH])
    # the index of its runs' records in the colony's api scope (`GET /v1/runs?agent=`), alone: it
    # hashes to another slot (the records expire with the runs' retention, as they always do)
    runs_index = BlackboardKeyspace(ApiRunProtocol.scope(settings.tenant_id, settings.colony_id)).tag_key(
        ApiRunProtocol.agent_tag(agent_id)
    )
    async with board.guard("purge_agent"):
        await board.redis.unlink(runs_index)
    if any(f"namespace:{NAMESPACE_PREFIX}" in key for key in found.keys):  # it had memory
        await _forget_memory_index(board, agent_id, settings, found.keys)
    return AgentKeys(keys=found.keys, blocks=deleted, truncated=found.truncated)


async def _forget_memory_index(
    board: Blackboard, agent_id: str, settings: ColonySettings, keys: Iterable[str]
) -> None:
    """Drop the rows of the agent's memory scopes from the vector index (derived from the entries
    just deleted): its levels, and every other memory scope its keys show (found by review: a scope
    of its own graph, `memory-notes`, kept its rows). Best effort: an index that does not answer
    keeps rows no entry backs any more, which recall skips (it reads every hit's entry from Redis)."""
    where = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
    space = BlackboardKeyspace(agent_scope(agent_id, settings.tenant_id, settings.colony_id))
    held = {space.nested_scope(key) for key in keys}
    scopes = sorted(
        {MemoryScope.agent(agent_id, level, **where) for level in AGENT_LEVELS}
        | {s for s in held if s is not None and MemoryScope.is_memory_scope(s)}
    )
    try:
        await memory_service(board, settings).forget_scopes(scopes)
    except Exception as exc:
        log.warning("agent %s: its memory's vector index rows were not dropped: %r", agent_id, exc)
