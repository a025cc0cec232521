"""What an agent remembers, read from Redis alone: the MemoryMap.

Any process can build them (the HTTP API, another replica, the agent's own planner): the scopes an
agent has are listed in its own scope (`mem:scopes`), each scope's configuration is stored beside its
entries (`mem:config`), and pending ingestion is the source entries written after a subscription's
stored position.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import MemoryProtocol
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryMap, MemoryScopeInfo

Keys = MemoryProtocol
MAX_PENDING_COUNTED = 10_000
MAX_TAGS_SHOWN = 50


def agent_scope(agent_id: str, tenant_id: str = "default", colony_id: str = "default") -> str:
    return scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)


async def agent_memory_scopes(board: Blackboard, agent_scope_id: str) -> list[str]:
    """The memory scopes an agent has (registered by its MemoryCapabilities when they start)."""
    stored = await board.scoped(agent_scope_id).read(Keys.scopes_key())
    if stored is None or not isinstance(stored.value, list):
        return []
    # only the agent's own namespaces and shared ones of its colony: a list some writer of Redis
    # changed cannot point the API at another tenant's or colony's memory
    colony_prefix = agent_scope_id.rsplit(":agent:", 1)[0] + ":namespace:"
    return [
        s
        for s in stored.value
        if isinstance(s, str)
        and MemoryScope.is_memory_scope(s)
        and (s.startswith(agent_scope_id + ":namespace:") or s.startswith(colony_prefix))
    ]


async def pending_ingestion(store: MemoryStore, scope: str, sources: list[str]) -> int:
    """Live source entries not yet taken in by `scope` (bounded count): those written after its
    position that still exist; every live one for a subscription that has no position yet or
    whose position the stream was trimmed past (an upper bound: it re-takes them)."""
    pending = 0
    board = store.board(scope)
    for source in sources:
        stored = await board.read(Keys.position_key(source))
        if stored is None or not isinstance(stored.value, dict):
            pending += await store.count(source)
            continue
        batch = await store.changes(
            source, str(stored.value.get("position", "0-0")), count=MAX_PENDING_COUNTED
        )
        if batch.truncated:
            pending += await store.count(source)
            continue
        live = await store.get_many([(source, i) for i in dict.fromkeys(batch.upserted)])
        pending += sum(entry is not None for entry in live)
    return pending


async def scope_info(store: MemoryStore, scope: str) -> MemoryScopeInfo:
    config = await store.config(scope)
    tags = await store.tag_counts(scope)
    sources = config.subscribed_to if config is not None else []
    return MemoryScopeInfo(
        scope_id=scope,
        scope_type=config.scope_type if config is not None else MemoryScope.scope_type(scope),
        purpose=config.purpose if config is not None else "",
        ttl_seconds=config.ttl_seconds if config is not None else None,
        max_entries=config.max_entries if config is not None else None,
        entry_count=await store.count(scope),
        pending_ingestion=await pending_ingestion(store, scope, sources),
        subscribed_to=sources,
        available_tags=list(tags)[:MAX_TAGS_SHOWN],
    )


async def agent_memory_map(
    store: MemoryStore,
    agent_id: str,
    *,
    tenant_id: str = "default",
    colony_id: str = "default",
    hidden: Callable[[str], Awaitable[bool]] | None = None,
) -> MemoryMap:
    """The agent's whole memory layout: every scope with counts, tags and dataflow edges (but the
    scopes `hidden` says are not to be shown: shared ones the agent may not read)."""
    own = agent_scope(agent_id, tenant_id, colony_id)
    scopes = await agent_memory_scopes(store.board(own), own)
    memory_map = MemoryMap(agent_id=agent_id)
    for scope in scopes:
        if hidden is not None and await hidden(scope):
            continue
        info = await scope_info(store, scope)
        memory_map.scopes[scope] = info
        memory_map.dataflow_edges += [(source, scope) for source in info.subscribed_to]
        memory_map.total_entries += info.entry_count
        memory_map.total_pending_ingestion += info.pending_ingestion
    return memory_map
