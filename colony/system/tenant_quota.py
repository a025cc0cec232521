"""Quotas of the tenants other than the colony's own (`api.tenant_*` settings): runs submitted per
second, runs submitted and not yet ended, and agents. Beyond one, the API answers 429 with
Retry-After (TenantQuotaExceeded) before anything is written for the call, so a tenant flooding
the colony is refused at the door while the others' calls go on. The colony's own tenant (the
operator's) has none of these; its agents' own bounds (`max_concurrent_runs`) hold for everyone.

Open runs are a sorted set per tenant of run ids scored by their deadline: a run past its deadline
drops out by itself; at the cap, the runs that ended are found (`ended`) and removed before the
call is refused (a run whose record is not written yet is being submitted: it stays), and a run
whose submit failed after it was admitted is removed (`release`). The check and the add are one
script, so concurrent submits never pass the cap together. The per-second counter is one hash per
tenant (the second it counts, the count), kept 2 s. Both read the time from Redis."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from redis.asyncio import Redis

from colony import metrics
from colony.blackboard.access_keys import AccessProtocol
from colony.blackboard.redis_lock import redis_lock
from colony.config import ApiSettings
from colony.errors import TenantQuotaExceeded
from colony.system.registry import AgentRegistry
from colony.wire.tenants import NOBODY, tenant_of

# Both scripts read the time from Redis (TIME): every API process counts the same seconds and
# deadlines, whatever its own clock says.
# KEYS[1] the open runs; ARGV: cap, run id, its timeout (s). 1: added (or held already), 0: full
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
local keep = math.floor(tonumber(ARGV[3]) * 1000) + 60000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return 1
"""
# KEYS[1] the tenant's rate counter (a hash: the second it counts, its count). Returns the count
# so far this second and the microseconds left of it
_RATE = """
local t = redis.call('TIME')
if redis.call('HGET', KEYS[1], 's') ~= t[1] then redis.call('HSET', KEYS[1], 's', t[1], 'n', 0) end
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('EXPIRE', KEYS[1], 2)
return {n, 1000000 - tonumber(t[2])}
"""
PRUNE_AT_ONCE = 256  # open runs whose end is checked at once when a tenant is at its cap
# the calls that submit runs: refused at the door (the API's guard, `spent`) for the rest of a
# second in which their tenant spent its runs per second, with no Redis call and no body read
SUBMITTING = frozenset(
    {
        ("POST", "/v1/runs"),
        ("POST", "/v1/sessions"),
        ("POST", "/v1/sessions/{session_id}/messages"),
        ("POST", "/v1/sessions/{session_id}/turns"),
    }
)
MAX_SPENT = 4096  # tenants remembered as having spent this second's runs (the oldest go first)
_spent: dict[str, float] = {}  # tenant -> time.monotonic() until which this process refuses its submits
# a refused submit is answered when its tenant's second turns (held at most HOLD_SECONDS): a client
# that retries at once (ignoring Retry-After) waits instead of spinning the API's CPU, as a rate
# limiter that delays excess requests does. Bounded: beyond these many held, answered at once
MAX_HELD_PER_TENANT = 16
MAX_HELD = 32  # of every tenant together, per API process (an eighth of the 256 calls its replica takes)
HOLD_SECONDS = 1.0
_held: dict[str, int] = {}


def spent(tenant: str) -> float | None:
    """When `tenant` spent this second's runs per second (as this process last saw): the monotonic
    time its second ends, and its next submit is refused in the guard (`refused_at_the_door`),
    not audited (it changes nothing); None when it has not."""
    until = _spent.get(tenant)
    if until is None:
        return None
    if time.monotonic() < until:
        return until
    _spent.pop(tenant, None)
    return None


def refused_at_the_door(tenant: str) -> None:
    """Count a submit the guard refused because its tenant spent its second."""
    metrics.TENANT_REFUSALS.labels(tenant, "runs_per_second").inc()


async def hold_refused(tenant: str, until: float) -> bool:
    """Hold a refused submit of `tenant` until `until` (its second's end; at most HOLD_SECONDS),
    unless MAX_HELD_PER_TENANT of its submits, or MAX_HELD of all, are held already; whether it
    was held."""
    held = _held.get(tenant, 0)
    if held >= MAX_HELD_PER_TENANT or sum(_held.values()) >= MAX_HELD:
        return False
    _held[tenant] = held + 1
    try:
        await asyncio.sleep(min(HOLD_SECONDS, max(0.0, until - time.monotonic())))
    finally:
        left = _held.get(tenant, 1) - 1
        if left > 0:
            _held[tenant] = left
        else:
            _held.pop(tenant, None)
    return True


def _spend(tenant: str, seconds_left: float) -> None:
    _spent.pop(tenant, None)
    while len(_spent) >= MAX_SPENT:
        _spent.pop(next(iter(_spent)))
    _spent[tenant] = time.monotonic() + min(1.0, max(0.0, seconds_left))


class TenantQuota:
    def __init__(self, redis: Redis, *, colony_id: str, api: ApiSettings) -> None:
        self.redis, self.colony_id, self.api = redis, colony_id, api
        self._admit = redis.register_script(_ADMIT)
        self._rate = redis.register_script(_RATE)

    def _key(self, tenant: str, what: str) -> str:
        return AccessProtocol.quota_key(tenant, self.colony_id, what)

    async def admit_run(
        self, tenant: str, run_id: str, timeout: float, ended: Callable[[str], Awaitable[bool]]
    ) -> None:
        """Count a run of `tenant` against its quotas, or TenantQuotaExceeded (429). `ended`:
        whether a run held open has ended (a run with no record yet is being submitted: open)."""
        rate = self.api.tenant_runs_per_second
        if rate is not None:
            count, micros_left = await self._rate(keys=[self._key(tenant, "rate")])
            if int(count) > rate:
                _spend(tenant, int(micros_left) / 1e6)
                metrics.TENANT_REFUSALS.labels(tenant, "runs_per_second").inc()
                raise TenantQuotaExceeded(
                    f"tenant {tenant!r} submits at most {rate} runs a second (api.tenant_runs_per_second); "
                    "retry after the Retry-After header's seconds",
                    retry_after_seconds=1.0,
                )
        cap = self.api.tenant_max_open_runs
        if cap is None:
            return
        key = self._key(tenant, "open")
        if int(await self._admit(keys=[key], args=[cap, run_id, timeout])):
            return
        held = [
            m.decode() if isinstance(m, bytes) else str(m)
            for m in await self.redis.zrange(key, 0, PRUNE_AT_ONCE - 1)
        ]
        done = await asyncio.gather(*(ended(run) for run in held))
        gone = [run for run, over in zip(held, done, strict=True) if over]
        if gone:
            await self.redis.zrem(key, *gone)
            if int(await self._admit(keys=[key], args=[cap, run_id, timeout])):
                return
        metrics.TENANT_REFUSALS.labels(tenant, "open_runs").inc()
        raise TenantQuotaExceeded(
            f"tenant {tenant!r} has {cap} runs submitted and not ended (api.tenant_max_open_runs); "
            "wait for some to end, or cancel some, and retry",
            retry_after_seconds=2.0,
        )

    async def release(self, tenant: str, run_id: str) -> None:
        """A run admitted whose submit then failed (404, 422, ...) holds no place any more."""
        await self.redis.zrem(self._key(tenant, "open"), run_id)


MAKING_HOLD_SECONDS = 30.0  # the most one making holds the tenant's lock (a crashed holder's ends)
MAKING_WAIT_SECONDS = 10.0  # waiting for another making of the tenant's agents, then 429


@contextlib.asynccontextmanager
async def making_an_agent(
    redis: Redis, colony_id: str, api: ApiSettings, registry: AgentRegistry, tenant: str, home: str
) -> AsyncIterator[None]:
    """Check `api.tenant_max_agents` (check_agents) and make the agent inside the block, one
    making at a time per tenant (a lock in Redis, across API processes and replicas): found by
    review, six first runs sent together each counted the registry before any was made, and a
    tenant capped at one agent held six. Nothing for the colony's own tenant or without a cap."""
    if api.tenant_max_agents is None or tenant in (home, NOBODY):
        yield
        return
    key = AccessProtocol.quota_key(tenant, colony_id, "making")
    async with redis_lock(
        redis, key, hold_seconds=MAKING_HOLD_SECONDS, wait_seconds=MAKING_WAIT_SECONDS
    ) as held:
        if not held:
            raise TenantQuotaExceeded(
                f"tenant {tenant!r} is making other agents; retry after the Retry-After header's seconds",
                retry_after_seconds=2.0,
            )
        await check_agents(api, registry, tenant, home)
        yield


async def check_agents(api: ApiSettings, registry: AgentRegistry, tenant: str, home: str) -> None:
    """TenantQuotaExceeded (429) when `tenant` (another than the colony's own, `home`) holds
    `api.tenant_max_agents` agents already and may not have one more. Counted from the registry
    (every record, read when a tenant's agent is about to be made: a session, a catalog instance,
    a child, an import)."""
    cap = api.tenant_max_agents
    if cap is None or tenant in (home, NOBODY):
        return
    count = sum(1 for r in await registry.list() if tenant_of(r.agent_id, home) == tenant)
    if count >= cap:
        metrics.TENANT_REFUSALS.labels(tenant, "agents").inc()
        raise TenantQuotaExceeded(
            f"tenant {tenant!r} has {count} agents, its most (api.tenant_max_agents); "
            "delete sessions it no longer needs (DELETE /v1/sessions/{id}) and retry",
            retry_after_seconds=5.0,
        )
