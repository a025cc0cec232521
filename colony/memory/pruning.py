"""Which entries a scope over its cap loses first, answered in O(log n): a sorted set per scope.

Decayed relevance is importance x (1 - decay_rate) ** age_minutes. Its logarithm is
ln(importance) + k * created_at - k * now with k = -ln(1 - decay_rate) / 60: the last term is the
same for every entry, so the order never changes with time and each entry's score is fixed when it
is written. The set is derived (Redis' sorted set `...:r:mem-order` in the scope's hash slot):
members whose entry is gone are dropped as pruning meets them, and a set that misses members or has
gathered many stale ones is rebuilt from the entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from colony.blackboard import Blackboard
from colony.memory.types import MaintenanceConfig, MemoryEntry

ORDER_RING = "mem-order"
STALE_FACTOR = 2  # a set holding more than twice the live entries (+ slack) is rebuilt
STALE_SLACK = 64


def score(entry: MemoryEntry, maintenance: MaintenanceConfig) -> float:
    """The entry's place in pruning order (lower goes first); see the module docstring."""
    k = -math.log1p(-maintenance.decay_rate) / 60.0 if maintenance.decay_rate > 0 else 0.0
    return math.log(max(entry.importance, 1e-9)) + k * entry.created_at


class PruneOrder:
    """The pruning order of one scope."""

    def __init__(self, board: Blackboard) -> None:
        self.board = board
        self.key = board.keyspace.ring_key(ORDER_RING)

    async def add(self, entries: Iterable[MemoryEntry], maintenance: MaintenanceConfig) -> None:
        mapping = {e.entry_id: score(e, maintenance) for e in entries}
        if mapping:
            await self.board.redis.zadd(self.key, mapping)

    async def remove(self, entry_ids: Iterable[str]) -> None:
        ids = list(entry_ids)
        if ids:
            await self.board.redis.zrem(self.key, *ids)

    async def size(self) -> int:
        return int(await self.board.redis.zcard(self.key))

    async def lowest(self, count: int) -> list[str]:
        return [str(m) for m in await self.board.redis.zrange(self.key, 0, max(0, count - 1))]

    async def rebuild(self, entries: Iterable[MemoryEntry], maintenance: MaintenanceConfig) -> None:
        """Replace the set by the scores of `entries` (all live entries of the scope)."""
        mapping = {e.entry_id: score(e, maintenance) for e in entries}
        async with self.board.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            if mapping:
                pipe.zadd(self.key, mapping)
            await pipe.execute()

    def needs_rebuild(self, size: int, live: int) -> bool:
        return size < live or size > STALE_FACTOR * live + STALE_SLACK
