"""Page-affinity placement: which replica a request (or an agent) carrying page ids goes to.

Pure functions over `ReplicaView`s (what each replica holds, how loaded it is), so the Serve
request router, the control plane and `benchmarks/affinity_sim.py` run the very same code.
A resident page scores 1, a swapped-out page (restorable from the replica's disk tier in
milliseconds) 0.5, anything else 0.

Ties among replicas equal in affinity, load and cache size (every cache full, none holding the
pages: the usual miss once a cluster has warmed up) go by rendezvous hashing of the pages with the
replica id: misses of different pages spread over the replicas instead of all evicting on the
first one in id order, and a page that left every cache comes back where it was before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from colony.errors import ResourceExhausted

RESIDENT_WEIGHT = 1.0
SWAPPED_WEIGHT = 0.5


@dataclass
class ReplicaView:
    replica_id: str
    resident: set[str] = field(default_factory=set)
    swapped: set[str] = field(default_factory=set)
    load: int = 0  # agents or in-flight requests
    capacity: int | None = None  # max load; None = unbounded
    memory_free_mb: int | None = None  # memory left for agents; None = unbounded

    @property
    def full(self) -> bool:
        return self.capacity is not None and self.load >= self.capacity

    def fits(self, memory_mb: int) -> bool:
        return not self.full and (self.memory_free_mb is None or self.memory_free_mb >= memory_mb)


def affinity(replica: ReplicaView, page_ids: Iterable[str]) -> float:
    return sum(
        RESIDENT_WEIGHT if p in replica.resident else SWAPPED_WEIGHT if p in replica.swapped else 0.0
        for p in page_ids
    )


def choose_replica(
    replicas: Sequence[ReplicaView], page_ids: Sequence[str] = (), *, hard: bool = False, memory_mb: int = 0
) -> ReplicaView:
    """The replica for a request or agent bound to `page_ids` (needing `memory_mb`).

    hard: only replicas holding every page (resident) qualify. soft: best affinity, ties (and
    page-less requests) to the least loaded, then to the emptiest cache. Full replicas (agent count
    or memory) are skipped; `ResourceExhausted` when nothing qualifies.
    """
    open_replicas = [r for r in replicas if r.fits(memory_mb)]
    if not open_replicas:
        raise ResourceExhausted(f"all {len(replicas)} replicas are at capacity (agents or memory)")
    if hard and page_ids:
        holding = [r for r in open_replicas if all(p in r.resident for p in page_ids)]
        if not holding:
            raise ResourceExhausted(f"no replica with free capacity holds all of pages {list(page_ids)[:5]}")
        open_replicas = holding
    return min(open_replicas, key=lambda r: _order(r, page_ids))


def rank_replicas(replicas: Sequence[ReplicaView], page_ids: Sequence[str]) -> list[ReplicaView]:
    """All replicas, best first (affinity, then least loaded): the order to try them in."""
    return sorted(replicas, key=lambda r: (r.full, *_order(r, page_ids)))


def _order(replica: ReplicaView, page_ids: Sequence[str]) -> tuple[float, int, int, int, str]:
    """Best first: most affinity, then least loaded, then the emptiest cache (a new page group
    lands where it evicts least), then the pages' rendezvous hash (page-less work: none), then a
    stable tie-break."""
    spread = _rendezvous(replica.replica_id, page_ids) if page_ids else 0
    return (-affinity(replica, page_ids), replica.load, len(replica.resident), spread, replica.replica_id)


def _rendezvous(replica_id: str, page_ids: Sequence[str]) -> int:
    """The replica's rank for these pages (highest random weight hashing, lowest first): stable
    across processes (not Python's salted hash), different per page group."""
    text = "\0".join([replica_id, *page_ids]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")
