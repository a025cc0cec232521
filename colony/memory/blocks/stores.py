"""One `BlockStore` per Redis client and colony in a process: each store keeps a document cache,
which every caller in the process (the block tools, the API, export/import) shares."""

from __future__ import annotations

import redis.asyncio as aioredis

from colony.config import ColonySettings
from colony.memory.blocks.store import BlockStore

_stores: dict[tuple[int, str, str], BlockStore] = {}
MAX_STORES = 16


def block_store(redis: aioredis.Redis, settings: ColonySettings) -> BlockStore:
    """The process's BlockStore for this Redis client and colony (one document cache each)."""
    # by the colony, never by id(settings): a collected settings object's id is reused by the next
    # one, which may name another colony
    key = (id(redis), settings.tenant_id, settings.colony_id)
    store = _stores.get(key)
    if store is None or store.redis is not redis or store.settings != settings.blocks:
        store = _stores[key] = BlockStore(redis, settings)
        while len(_stores) > MAX_STORES:
            _stores.pop(next(iter(_stores)))
    return store
