"""How many bytes of Redis a tenant other than the colony's own holds, for its quota
(`api.tenant_max_redis_bytes`): the keys of its agents (their state, memory, sessions, runs), of its
own scopes (shared memory, audit trail) and of its memory blocks, each weighed with MEMORY USAGE.

Measured by a SCAN of the keyspace with the tenant's patterns (AccessProtocol.tenant_patterns) and
its block namespace's owner indexes, at most once per `refresh_seconds` per tenant and process (the
figure is cached in between), so the check before a write costs nothing most of the time and a
tenant over its quota is refused within that time. A scan that meets more than MAX_KEYS keys of the
tenant stops there: the figure is then a floor."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from colony import metrics
from colony.blackboard.access_keys import AccessProtocol
from colony.blackboard.block_protocol import BlockProtocol
from colony.config import ApiSettings
from colony.errors import TenantQuotaExceeded

log = logging.getLogger(__name__)
MAX_KEYS = 200_000  # keys of one tenant weighed at most per measurement
BATCH = 256  # MEMORY USAGE calls per pipeline
SCAN_COUNT = 2000
CACHE_TENANTS = 4096  # tenants whose figure a process keeps (the oldest go first)


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


@dataclass
class _Weight:
    """A tenant's last weighing in this process, what was admitted since, and the weighing under way."""

    at: float
    used: int
    refreshing: asyncio.Task[int] | None = None


_cache: dict[tuple[int, str, str], _Weight] = {}
_first: dict[tuple[int, str, str], asyncio.Future[int]] = {}  # first weighings under way


async def _weighed(key: tuple[int, str, str], redis: Redis, tenant: str, home: str, colony_id: str) -> int:
    used = await measure(redis, tenant, home=home, colony_id=colony_id)
    metrics.TENANT_REDIS_BYTES.labels(tenant).set(used)
    held = _cache.get(key)
    if held is not None:
        held.at, held.used, held.refreshing = time.monotonic(), used, None
    else:
        while len(_cache) >= CACHE_TENANTS:
            _cache.pop(next(iter(_cache)))
        _cache[key] = _Weight(time.monotonic(), used)
    return used


async def check_bytes(
    api: ApiSettings, redis: Redis, tenant: str, *, home: str, colony_id: str, adding: int = 0
) -> None:
    """TenantQuotaExceeded (429) when the tenant holds `api.tenant_max_redis_bytes` or more, or
    would with `adding` more, as last weighed plus what was admitted since (weighed again every
    `api.tenant_usage_refresh_seconds`: one weighing per tenant at a time in a process, in the
    background while the last figure, and what was added to it, still decides)."""
    cap = api.tenant_max_redis_bytes
    if cap is None or tenant == home:
        return
    key = (id(redis), colony_id, tenant)
    held = _cache.get(key)
    if held is None:
        first = _first.get(key)
        if first is None:  # (one first weighing per tenant, whoever asks meanwhile waits for it)
            first = _first[key] = asyncio.ensure_future(_weighed(key, redis, tenant, home, colony_id))
            first.add_done_callback(lambda _: _first.pop(key, None))
        await asyncio.shield(first)
        held = _cache[key]
    elif held.refreshing is None and time.monotonic() - held.at >= api.tenant_usage_refresh_seconds:
        held.refreshing = asyncio.ensure_future(_weighed(key, redis, tenant, home, colony_id))
        held.refreshing.add_done_callback(_keep_quiet)
    if held.used + adding > cap:
        metrics.TENANT_REFUSALS.labels(tenant, "redis_bytes").inc()
        raise TenantQuotaExceeded(
            f"tenant {tenant!r} holds {held.used} bytes in Redis, its most is {cap} "
            f"(api.tenant_max_redis_bytes){f' and this call would add about {adding}' if adding else ''}: "
            "delete sessions, memory entries or blocks it no longer needs (deleting is always allowed) "
            "and retry",
            retry_after_seconds=api.tenant_usage_refresh_seconds,
        )
    held.used += adding


def _keep_quiet(task: asyncio.Task[int]) -> None:
    """A background weighing that failed (Redis away) leaves the last figure in place."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("weighing a tenant's keys failed: %r", task.exception())
