"""Trace-driven simulation of page-affinity placement.

Agents bound to page groups issue requests; each replica caches a fixed number of pages (LRU for
the baselines, as in their engines; Colony's engines' policy for Colony);
a request's pages that are not in the chosen replica's cache are prefilled (a miss costs the page's
tokens). Policies compared side by side on one trace:

  random, round-robin, least-loaded     - no notion of pages
  prefix-tree                           - an SGLang / Ray-style approximate router: per replica a tree
                                          of the page sequences routed there, LRU-trimmed, no view of
                                          what the cache really holds
  colony                                - colony.vcm.placement.choose_replica over views built from
                                          what each cache really holds (the page table), and the
                                          engines' eviction policy (colony.vcm.eviction, LFU-DA by
                                          default): the same code the cluster runs
  static top-k                          - one pooled cache holding the most requested pages, known in
                                          advance: the ceiling of online policies on independent
                                          requests
  belady (bound)                        - one pooled cache of all replicas' capacity with offline
                                          optimal eviction: no routing policy can beat it

Oracle variants, bounds and not Colony: they read the next --lookahead requests of the trace,
requests no production queue holds before they are submitted (issue 35). What needed-soon eviction
gains from what Colony really knows is measured end to end by benchmarks/affinity_e2e.py:

  oracle+soon                           - colony, and eviction passes over pages a queued agent
                                          needs soon (`EvictionPolicy.unpinned_victim(needed_soon=)`,
                                          what the engines do with `engine.pages_needed_soon`)
  oracle+soon+prefetch                  - and the request --prefetch places ahead has its pages loaded
                                          on the replica placement picks (`engine.prefetch`):
                                          its own step then finds them, so "hit rate" (on the
                                          request's path) rises; "prefill tokens" counts the
                                          prefetch loads too (a page prefetched and evicted before
                                          its use is paid twice)

Usage:
  python benchmarks/affinity_sim.py [--seed 7] [--replicas 4] [--capacity 16] [--agents 48]
                                    [--pages 120] [--group 3] [--requests 6000] [--trace FILE.jsonl]
                                    [--lookahead 8] [--prefetch 1] [--workload zipf|turns]
A trace file has one JSON object a line: {"agent": "a1", "pages": ["p1", "p2"], "tokens": {"p1": 900}}
("tokens" optional; pages default to --page-tokens).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from colony.vcm.eviction import EvictionPolicy, eviction_policy
from colony.vcm.placement import ReplicaView, choose_replica

Request = tuple[str, list[str]]


@dataclass
class Result:
    policy: str
    hits: int
    accesses: int
    prefill_tokens: int
    total_tokens: int
    prefetched: int = 0  # pages loaded ahead of their request (their tokens are in prefill_tokens)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def saved_tokens(self) -> int:
        return self.total_tokens - self.prefill_tokens


def make_trace(seed: int, agents: int, pages: int, group: int, requests: int, zipf: float) -> list[Request]:
    """Agents bound to page groups (neighbouring groups share a page), agent popularity Zipf-like."""
    rng = random.Random(seed)
    groups = {}
    for a in range(agents):
        start = (a * (group - 1)) % pages
        groups[f"agent-{a}"] = [f"page-{(start + i) % pages}" for i in range(group)]
    names = list(groups)
    weights = [1.0 / (rank + 1) ** zipf for rank in range(len(names))]
    rng.shuffle(names)
    return [(agent, groups[agent]) for agent in rng.choices(names, weights=weights, k=requests)]


def make_turns_trace(agents: int, pages: int, group: int, requests: int) -> list[Request]:
    """Agents taking turns in a fixed order (a pipeline, a round of a group conversation), agent a
    bound to `group` consecutive pages from a * group: the pages come back in a cycle, which LRU
    and LFU caches smaller than the cycle lose every page of; knowing who runs next keeps some."""
    return [
        (f"agent-{n % agents}", [f"page-{((n % agents) * group + i) % pages}" for i in range(group)])
        for n in range(requests)
    ]


def load_trace(path: Path) -> tuple[list[Request], dict[str, int]]:
    trace, tokens = [], {}
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            trace.append((str(item["agent"]), [str(p) for p in item["pages"]]))
            tokens.update({str(k): int(v) for k, v in (item.get("tokens") or {}).items()})
    return trace, tokens


class Cluster:
    """Replicas with page caches (evicting with `colony.vcm.eviction` policies, the engines' code)
    and a sliding-window load."""

    def __init__(self, replicas: int, capacity: int, window: int, eviction: str = "lru") -> None:
        self.ids = [f"r{i}" for i in range(replicas)]
        self.caches: dict[str, set[str]] = {r: set() for r in self.ids}
        self.policies: dict[str, EvictionPolicy] = {r: eviction_policy(eviction) for r in self.ids}
        self.capacity = capacity
        self.recent: deque[str] = deque(maxlen=window)

    def load(self, replica: str) -> int:
        return sum(1 for r in self.recent if r == replica)

    def serve(self, replica: str, pages: list[str], needed_soon: Collection[str] = ()) -> list[bool]:
        """Serve one request (its pages pinned while it runs); which pages were hits."""
        hits = [self.bring_in(replica, page, pages, needed_soon) for page in pages]
        self.recent.append(replica)
        return hits

    def room_without(self, replica: str, pages: list[str], keep: set[str]) -> bool:
        """Whether the missing ones of `pages` fit without evicting a page in `keep`."""
        cache = self.caches[replica]
        missing = sum(1 for p in pages if p not in cache)
        evictable = sum(1 for p in cache if p not in keep and p not in pages)
        return missing <= self.capacity - len(cache) + evictable

    def bring_in(self, replica: str, page: str, pinned: list[str], needed_soon: Collection[str] = ()) -> bool:
        """Make the page resident (evicting as the engines do: never a pinned page, pages needed
        soon only when nothing else can go) and count a use; whether it was resident already."""
        cache, policy = self.caches[replica], self.policies[replica]
        hit = page in cache
        if not hit:
            while len(cache) >= self.capacity:
                victim = policy.unpinned_victim(cache, pinned, needed_soon)
                assert victim is not None, "a request names more pages than a replica holds"
                cache.discard(victim)
                policy.evicted(victim)
            cache.add(page)
        policy.touch(page)
        return hit


Router = Callable[[Cluster, str, list[str]], str]


def random_router(seed: int) -> Router:
    rng = random.Random(seed)
    return lambda cluster, agent, pages: rng.choice(cluster.ids)


def round_robin_router() -> Router:
    state = {"n": 0}

    def route(cluster: Cluster, agent: str, pages: list[str]) -> str:
        state["n"] += 1
        return cluster.ids[state["n"] % len(cluster.ids)]

    return route


def least_loaded_router() -> Router:
    return lambda cluster, agent, pages: min(cluster.ids, key=lambda r: (cluster.load(r), r))


def prefix_tree_router(match_threshold: float = 0.5, entries_per_page: int = 1) -> Router:
    """Approximate prefix trees per replica (what was routed there), LRU-trimmed to the cache size."""
    trees: dict[str, OrderedDict[tuple[str, ...], None]] = defaultdict(OrderedDict)

    def route(cluster: Cluster, agent: str, pages: list[str]) -> str:
        def matched(replica: str) -> int:
            tree = trees[replica]
            return max((i for i in range(1, len(pages) + 1) if tuple(pages[:i]) in tree), default=0)

        best = max(cluster.ids, key=lambda r: (matched(r), -cluster.load(r)))
        if matched(best) / len(pages) < match_threshold:
            best = min(cluster.ids, key=lambda r: (cluster.load(r), r))
        tree = trees[best]
        for i in range(1, len(pages) + 1):
            tree[tuple(pages[:i])] = None
            tree.move_to_end(tuple(pages[:i]))
        while len(tree) > cluster.capacity * entries_per_page:
            tree.popitem(last=False)
        return best

    return route


def colony_router() -> Router:
    """colony.vcm.placement.choose_replica over the caches' true contents (the page table)."""

    def route(cluster: Cluster, agent: str, pages: list[str]) -> str:
        views = [ReplicaView(r, resident=set(cluster.caches[r]), load=cluster.load(r)) for r in cluster.ids]
        return choose_replica(views, pages).replica_id

    return route


def simulate(
    name: str,
    router: Router,
    trace: list[Request],
    tokens: Callable[[str], int],
    replicas: int,
    capacity: int,
    eviction: str = "lru",
    *,
    lookahead: int = 0,
    prefetch: int = 0,
    served: list[tuple[str, list[bool]]] | None = None,
) -> Result:
    """Replay the trace. `lookahead` > 0: the next `lookahead` requests are the queued agents, and
    eviction passes over their pages; `prefetch` > 0: the request that many places ahead in the
    queue has its missing pages loaded on the replica Colony's placement picks for it then.
    `served`, if given, gets each request's replica and which of its pages were hits."""
    cluster = Cluster(replicas, capacity, window=replicas * 4, eviction=eviction)
    hits = accesses = prefill = total = prefetched = 0
    for i, (agent, pages) in enumerate(trace):
        # the queued requests' pages, soonest first (the order tells eviction which to give up last)
        soon = list(dict.fromkeys(p for _, queued in trace[i + 1 : i + 1 + lookahead] for p in queued))
        if prefetch and i + prefetch < len(trace):
            _, ahead = trace[i + prefetch]  # runs `prefetch` requests from now
            views = [
                ReplicaView(r, resident=set(cluster.caches[r]), load=cluster.load(r)) for r in cluster.ids
            ]
            target = choose_replica(views, ahead).replica_id
            keep = set(soon) | set(pages)
            if cluster.room_without(target, ahead, keep):  # as the engines: a prefetch never evicts
                for page in ahead:  # a page needed soon; without room it brings in nothing
                    if not cluster.bring_in(target, page, ahead, keep):
                        prefetched += 1
                        prefill += tokens(page)
        replica = router(cluster, agent, pages)
        hits_here = cluster.serve(replica, pages, soon)
        if served is not None:
            served.append((replica, hits_here))
        for page, hit in zip(pages, hits_here, strict=True):
            accesses += 1
            total += tokens(page)
            if hit:
                hits += 1
            else:
                prefill += tokens(page)
    return Result(name, hits, accesses, prefill, total, prefetched)


def belady(
    trace: list[Request],
    tokens: Callable[[str], int],
    capacity: int,
    served: list[tuple[str, list[bool]]] | None = None,
) -> Result:
    """Offline optimal eviction in one pooled cache: evict the page used farthest in the future,
    never one of the request being served (its pages are pinned while it runs, as on the
    replicas). `served`, if given, gets each request's hits (its replica named "pool")."""
    accesses = [page for _, pages in trace for page in pages]
    next_use: list[int] = [0] * len(accesses)
    last_seen: dict[str, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = last_seen.get(accesses[i], len(accesses))
        last_seen[accesses[i]] = i
    cache: dict[str, int] = {}
    hits = prefill = total = 0
    i = 0
    for _, pages in trace:
        pinned, outcomes = set(pages), []
        for page in pages:
            total += tokens(page)
            outcomes.append(page in cache)
            if page in cache:
                hits += 1
            else:
                prefill += tokens(page)
                if len(cache) >= capacity:
                    victim = max((p for p in cache if p not in pinned), key=lambda p: cache[p])
                    del cache[victim]
            cache[page] = next_use[i]
            i += 1
        if served is not None:
            served.append(("pool", outcomes))
    return Result("belady (bound)", hits, len(accesses), prefill, total)


def static_optimum(trace: list[Request], tokens: Callable[[str], int], capacity: int) -> Result:
    """The best fixed cache: the `capacity` most requested pages, known in advance and preloaded.
    Under independent requests it is what the best online policy approaches (Belady also knows
    the order of the requests, which no online policy does)."""
    counts: dict[str, int] = defaultdict(int)
    for _, pages in trace:
        for page in pages:
            counts[page] += 1
    kept = set(sorted(counts, key=lambda p: (-counts[p], p))[:capacity])
    hits = sum(counts[p] for p in kept)
    total = sum(tokens(p) * n for p, n in counts.items())
    prefill = sum(tokens(p) * n for p, n in counts.items() if p not in kept)
    return Result("static top-k", hits, sum(counts.values()), prefill, total)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=16, help="pages each replica caches")
    parser.add_argument("--agents", type=int, default=48)
    parser.add_argument("--pages", type=int, default=120)
    parser.add_argument("--group", type=int, default=3, help="pages per agent")
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--page-tokens", type=int, default=1000)
    parser.add_argument("--trace", type=Path, help="JSON-lines trace instead of a generated one")
    parser.add_argument(
        "--workload",
        choices=["zipf", "turns"],
        default="zipf",
        help="zipf: popular agents; turns: agents in turn",
    )
    parser.add_argument(
        "--lookahead", type=int, default=8, help="queued requests whose pages count as needed soon"
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=1,
        help="how many requests ahead of its turn a request's pages are loaded",
    )
    parser.add_argument(
        "--colony-eviction", default="lfu-da", help="eviction policy of Colony's engines (lfu-da, lru)"
    )
    args = parser.parse_args()
    if args.trace:
        trace, known = load_trace(args.trace)
    elif args.workload == "turns":
        trace, known = make_turns_trace(args.agents, args.pages, args.group, args.requests), {}
    else:
        trace, known = (
            make_trace(args.seed, args.agents, args.pages, args.group, args.requests, args.zipf),
            {},
        )

    def tokens(page: str) -> int:
        return known.get(page, args.page_tokens)

    policies: list[tuple[str, Router, str]] = [
        ("random", random_router(args.seed), "lru"),
        ("round-robin", round_robin_router(), "lru"),
        ("least-loaded", least_loaded_router(), "lru"),
        ("prefix-tree", prefix_tree_router(), "lru"),
        ("colony", colony_router(), args.colony_eviction),
    ]
    results = [
        simulate(name, router, trace, tokens, args.replicas, args.capacity, eviction)
        for name, router, eviction in policies
    ]
    aware = [
        simulate(
            name,
            colony_router(),
            trace,
            tokens,
            args.replicas,
            args.capacity,
            args.colony_eviction,
            lookahead=args.lookahead,
            prefetch=prefetch,
        )
        for name, prefetch in (("oracle+soon", 0), ("oracle+soon+prefetch", args.prefetch))
    ]
    bound = belady(trace, tokens, args.replicas * args.capacity)
    static = static_optimum(trace, tokens, args.replicas * args.capacity)
    print(f"{len(trace)} requests, {args.replicas} replicas x {args.capacity} pages, seed {args.seed}")
    print(f"{'policy':<22} {'hit rate':>9} {'prefill tokens':>15} {'tokens saved':>13} {'prefetched':>10}")
    for r in [*results, *aware, static, bound]:
        print(
            f"{r.policy:<22} {r.hit_rate:>9.1%} {r.prefill_tokens:>15,} "
            f"{r.saved_tokens:>13,} {r.prefetched:>10,}"
        )
    colony = next(r for r in results if r.policy == "colony")
    tree = next(r for r in results if r.policy == "prefix-tree")
    print(f"colony / belady hit rate: {colony.hit_rate / bound.hit_rate:.1%} (goal >= 95%)")
    print(f"colony / static top-k hit rate: {colony.hit_rate / static.hit_rate:.1%}")
    saved_ratio = colony.saved_tokens / max(1, tree.saved_tokens)
    bound_ratio = bound.saved_tokens / max(1, tree.saved_tokens)
    print(
        f"colony / prefix-tree tokens saved: {saved_ratio:.2f}x (the belady bound allows {bound_ratio:.2f}x)"
    )
    prefill_ratio = tree.prefill_tokens / max(1, colony.prefill_tokens)
    print(f"prefix-tree / colony prefill tokens: {prefill_ratio:.2f}x fewer prefilled (goal >= 1.5x)")
    soon, fetched = aware
    print(
        f"needed-soon eviction (lookahead {args.lookahead}): request-path faults "
        f"{colony.accesses - colony.hits:,} -> {soon.accesses - soon.hits:,} "
        f"({(colony.accesses - colony.hits) / max(1, soon.accesses - soon.hits):.2f}x fewer), prefill tokens "
        f"{colony.prefill_tokens:,} -> {soon.prefill_tokens:,}"
    )
    path_faults = fetched.accesses - fetched.hits
    print(
        f"  + prefetch {args.prefetch} ahead: request-path faults {path_faults:,} "
        f"({(colony.accesses - colony.hits) / max(1, path_faults):.2f}x fewer than colony), "
        f"prefill tokens {fetched.prefill_tokens:,} (prefetch loads included)"
    )
    print(
        json.dumps(
            {
                r.policy: {"hit_rate": r.hit_rate, "prefill_tokens": r.prefill_tokens}
                for r in [*results, *aware, bound]
            }
        )
    )


if __name__ == "__main__":
    main()
