"""One `BlockStore` per Redis client and colony in a process: each store keeps a document cache,
which every caller in the process (the block tools, the API, export/import) shares."""

from __future__ import annotations

import redis.asyncio as aioredis

from colony.config import ColonySettings
from colony.memory.blocks.store import BlockStore
from colony.wire.tenants import tenant_of

_stores: dict[tuple[int, str, str, str], BlockStore] = {}
MAX_STORES = 64


def block_store(redis: aioredis.Redis, settings: ColonySettings, *, tenant: str | None = None) -> BlockStore:
    """The process's BlockStore for this Redis client, colony and tenant (one document cache
    each); `tenant`: whose blocks (default: the colony's own tenant's; another tenant's blocks
    live in their own namespace, colony.wire.tenants)."""
    tenant = tenant or settings.tenant_id
    # by the colony, never by id(settings): a collected settings object's id is reused by the next
    # one, which may name another colony
    key = (id(redis), settings.tenant_id, settings.colony_id, tenant)
    store = _stores.get(key)
    if store is None or store.redis is not redis or store.settings != settings.blocks:
        store = _stores[key] = BlockStore(redis, settings, tenant=tenant)
        while len(_stores) > MAX_STORES:
            _stores.pop(next(iter(_stores)))
    return store


def agent_block_store(redis: aioredis.Redis, settings: ColonySettings, agent_id: str) -> BlockStore:
    """The block store holding `agent_id`'s blocks: its tenant's (read from its id)."""
    return block_store(redis, settings, tenant=tenant_of(agent_id, settings.tenant_id))
