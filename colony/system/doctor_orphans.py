"""Orphaned agent keys (`colony doctor`): Redis keys of an agent id that no registry record names,
no live replica hosts, that do not expire and that were last written before the grace period:
what a process cut off in the middle of a multi-key write (an import before its undo ran, a
spawn before its registration) leaves. Nothing loop ever reads them again, nothing removes them,
and an import of that id is refused while they are there.

The agent scopes have no index (an agent's keys are found by the hash tag they carry), so this
check SCANs the keyspace for the colony's scopes (`BlackboardKeyspace.family_match`), in
pages of SCAN_COUNT, at most MAX_SCAN_CALLS pages; the registry's listing of agents must be whole
for it to judge (else it is skipped). `colony doctor --prune-orphans` removes what it finds
(`colony.system.agent_purge.purge_agent`), re-checking just before each id that the registry still
does not name it and that its lifecycle is the one the check saw (`fenced`).

Not orphans: an id an import is still writing (its lifecycle carries the import's mark, within the
import's lease: `import_write.importing`); an id written within the grace period: its lifecycle's
or metadata's last write, or, with neither (a session whose tree `start_session` wrote before its
agent is registered), the smallest OBJECT IDLETIME of its keys; and the memory an ended agent
keeps: an id with no state left (its lifecycle and metadata expired with `runs.retention_seconds`)
whose keys are all its memory scopes' (`<scope>:namespace:memory-...` and its `mem:scopes` list).
Long-term memory outlives its agent on purpose (an agent started again under that id finds it):
the doctor lists such ids apart (`retained`, not a violation) and `--prune-orphans` leaves them.
"""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol, BlackboardKeyspace, BlockProtocol, MemoryProtocol
from colony.errors import InvalidKey
from colony.memory.scopes import NAMESPACE_PREFIX
from colony.system.agent_purge import scan
from colony.system.import_write import LIFECYCLE, importing
from colony.wire.tenants import tenant_of

SCAN_COUNT = 1000
MAX_SCAN_CALLS = 100_000
MAX_AGED_KEYS = 1000  # keys of one id without lifecycle whose idle times are read


@dataclass
class Orphan:
    agent_id: str
    keys: int  # Redis keys of its scopes
    blocks: int  # blocks it owns
    written_at: float | None  # its last write: lifecycle's or metadata's, else by its keys' idle time
    version: int = 0  # its lifecycle's version (0: none), which --prune-orphans fences on
    retained: bool = False  # an ended agent's memory (module docstring): listed, not a violation


def agent_scope_prefix(tenant_id: str, colony_id: str) -> str:
    """The scope id of every agent of the colony up to the agent id (`...:agent:`)."""
    return scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id="a")[:-1]


async def keys_by_agent(
    root: Blackboard, tenant_id: str, colony_id: str, skip: Container[str], max_ids: int
) -> tuple[dict[str, int], bool]:
    """How many Redis keys each agent id of the colony holds, ids in `skip` left out, at most
    `max_ids` ids; and whether the listing was cut short."""
    prefix = agent_scope_prefix(tenant_id, colony_id)
    counts: dict[str, int] = {}
    cursor = 0
    colony = BlackboardKeyspace(scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id))
    for _ in range(MAX_SCAN_CALLS):
        async with root.guard("doctor orphans"):
            cursor, keys = await root.redis.scan(cursor, match=colony.family_match(), count=SCAN_COUNT)
        for raw in keys:
            scope = colony.nested_scope(raw.decode() if isinstance(raw, bytes) else str(raw))
            if scope is None or not scope.startswith(prefix):
                continue
            agent_id = scope[len(prefix) :].split(":", 1)[0]
            if agent_id in skip:
                continue
            if agent_id not in counts and len(counts) >= max_ids:
                return counts, True
            counts[agent_id] = counts.get(agent_id, 0) + 1
        if int(cursor) == 0:
            return counts, False
    return counts, True


async def find_orphans(
    root: Blackboard,
    *,
    tenant_id: str,
    colony_id: str,
    known: Container[str],
    now: float,
    grace_seconds: float,
    max_ids: int,
) -> tuple[list[Orphan], bool]:
    """The colony's agent ids with keys that no record in `known` (registered or hosted) names,
    past the grace period, not expiring and not an import's in progress (those with `retained`
    set: an ended agent's memory); and whether the scan was cut short."""
    counts, truncated = await keys_by_agent(root, tenant_id, colony_id, known, max_ids)
    orphans = []
    for agent_id, count in sorted(counts.items()):
        try:
            board = root.scoped(
                scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)
            )
        except InvalidKey:
            continue  # no key of the colony's own making
        found = await judge(root, board, now, grace_seconds)
        if found is None:
            continue
        async with root.guard("doctor orphans"):
            namespace = BlockProtocol.namespace(tenant_of(agent_id, tenant_id), colony_id)  # its tenant's
            blocks = await root.redis.hlen(BlockProtocol.owner_index(namespace, agent_id))
        orphans.append(Orphan(agent_id, count, int(blocks), *found))
    return orphans, truncated


async def judge(
    root: Blackboard, board: Blackboard, now: float, grace_seconds: float
) -> tuple[float | None, int, bool] | None:
    """Of one agent id (`board`: its scope) whose keys no record names: None when they are not
    orphans (being written: within the grace or an import's lease; expiring), else (when it was
    last written, its lifecycle's version, whether they are an ended agent's memory alone)."""
    names = [LIFECYCLE, AgentStateProtocol.key("metadata")]
    lifecycle, metadata = await board.read_many(names)
    if lifecycle is not None and importing(lifecycle.value, now):
        return None  # an import still writing it (its undo, or the lease, settles it)
    entries = [e for e in (lifecycle, metadata) if e is not None]
    written = max((e.updated_at for e in entries), default=None)
    memory_only = False
    if not entries:
        keys, _ = await scan(board, BlackboardKeyspace(board.scope_id).family_match(), MAX_AGED_KEYS)
        written = await _touched_at(root, keys, now)
        memory_only = all(_is_memory(board.scope_id, k) for k in keys)
    if written is not None and now - written <= grace_seconds:
        return None  # being written now (an import, a spawn, a session): judged once the grace passed
    if entries:
        async with root.guard("doctor orphans"):
            if await root.redis.pttl(board.keyspace.entry_key(entries[0].key)) > 0:
                return None  # an ended agent's state on its way out (its retention)
    return written, lifecycle.version if lifecycle is not None else 0, memory_only


async def _touched_at(root: Blackboard, keys: list[str], now: float) -> float | None:
    """When the most recently used of `keys` was last touched (their smallest OBJECT IDLETIME),
    on the clock `now` is on; None when Redis does not track idle times (an LFU eviction policy)."""
    if not keys:
        return None
    try:
        async with root.guard("doctor orphans"), root.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.object("idletime", key)
            idle: list[Any] = await pipe.execute()
    except ResponseError:
        return None
    seconds = [int(i) for i in idle if i is not None]
    return now - (min(seconds) + max(0.0, now - time.time())) if seconds else None


def _is_memory(scope: str, redis_key: str) -> bool:
    """Whether `redis_key` of agent scope `scope`'s family is its memory's: a key of one of its
    memory scopes, or its list of them."""
    nested = BlackboardKeyspace(scope).nested_scope(redis_key) or ""
    if nested.startswith(f"{scope}:namespace:{NAMESPACE_PREFIX}"):
        return True
    return redis_key == BlackboardKeyspace(scope).entry_key(MemoryProtocol.scopes_key())
