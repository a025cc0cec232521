"""How many bytes of Redis a tenant other than the colony's own holds, for its quota
(`api.tenant_max_redis_bytes`): the keys of its agents (their state, memory, sessions, runs), of its
own scopes (shared memory, audit trail) and of its memory blocks, each weighed with MEMORY USAGE.

Measured by a SCAN of the keyspace with the tenant's patterns (AccessProtocol.tenant_patterns) and
its block namespace's owner indexes, at most once per `refresh_seconds` per tenant and process (the
figure is cached in between), so the check before a write costs nothing most of the time and a
tenant over its quota is refused within that time. A scan that meets more than MAX_KEYS keys of the
tenant stops there: the figure is then a floor."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from colony import metrics
from colony.blackboard.access_keys import AccessProtocol
from colony.blackboard.block_protocol import BlockProtocol
from colony.config import ApiSettings
from colony.errors import TenantQuotaExceeded

MAX_KEYS = 200_000  # keys of one tenant weighed at most per measurement
BATCH = 256  # MEMORY USAGE calls per pipeline
SCAN_COUNT = 2000
CACHE_TENANTS = 4096  # tenants whose figure a process keeps (the oldest go first)

_cache: dict[tuple[int, str, str], tuple[float, int]] = {}


async def _weigh(redis: Redis, keys: list[str]) -> int:
    total = 0
    for start in range(0, len(keys), BATCH):
        async with redis.pipeline(transaction=False) as pipe:
            for key in keys[start : start + BATCH]:
                pipe.memory_usage(key, samples=0)
            total += sum(int(size or 0) for size in await pipe.execute())
    return total


async def measure(redis: Redis, tenant: str, *, home: str, colony_id: str) -> int:
    """The bytes the tenant's keys take in Redis now (a floor past MAX_KEYS keys)."""
    keys: list[str] = []
    for pattern in AccessProtocol.tenant_patterns(tenant, home, colony_id):
        async for key in redis.scan_iter(match=pattern, count=SCAN_COUNT):
            keys.append(key.decode() if isinstance(key, bytes) else str(key))
            if len(keys) >= MAX_KEYS:
                return await _weigh(redis, keys)
    namespace = BlockProtocol.namespace(tenant, colony_id)
    owners = [
        o.decode() if isinstance(o, bytes) else str(o)
        for o in await redis.smembers(BlockProtocol.owners_key(namespace))
    ]
    keys.append(BlockProtocol.owners_key(namespace))
    for owner in sorted(owners)[:MAX_KEYS]:
        index = BlockProtocol.owner_index(namespace, owner)
        keys.append(index)
        for block_id in list((await redis.hgetall(index)).values())[:MAX_KEYS]:
            name = block_id.decode() if isinstance(block_id, bytes) else str(block_id)
            keys.extend(BlockProtocol.key(name, part) for part in sorted(BlockProtocol.PARTS))
        if len(keys) >= MAX_KEYS:
            break
    return await _weigh(redis, keys[:MAX_KEYS])


async def check_bytes(api: ApiSettings, redis: Redis, tenant: str, *, home: str, colony_id: str) -> None:
    """TenantQuotaExceeded (429) when the tenant holds `api.tenant_max_redis_bytes` or more (as
    last measured, at most `api.tenant_usage_refresh_seconds` ago)."""
    cap = api.tenant_max_redis_bytes
    if cap is None or tenant == home:
        return
    key = (id(redis), colony_id, tenant)
    now = time.monotonic()
    held = _cache.get(key)
    if held is None or now - held[0] >= api.tenant_usage_refresh_seconds:
        used = await measure(redis, tenant, home=home, colony_id=colony_id)
        _cache.pop(key, None)
        while len(_cache) >= CACHE_TENANTS:
            _cache.pop(next(iter(_cache)))
        _cache[key] = held = (now, used)
        metrics.TENANT_REDIS_BYTES.labels(tenant).set(used)
    if held[1] >= cap:
        metrics.TENANT_REFUSALS.labels(tenant, "redis_bytes").inc()
        raise TenantQuotaExceeded(
            f"tenant {tenant!r} holds {held[1]} bytes in Redis, its most is {cap} "
            "(api.tenant_max_redis_bytes): delete sessions, memory entries or blocks it no longer needs "
            "(deleting is always allowed) and retry",
            retry_after_seconds=api.tenant_usage_refresh_seconds,
        )
