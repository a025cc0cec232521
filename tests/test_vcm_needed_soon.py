"""Agent-aware eviction and prefetch: a page a queued or suspended agent needs soon
(`engine.pages_needed_soon`) is passed over by eviction while another page can go, and `prefetch`
brings pages in before their agent runs, on the real policy classes and the real embedded engine."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from colony.config import EngineSettings
from colony.inference import InferenceRequest, Page
from colony.inference.embedded import EmbeddedEngine
from colony.vcm.eviction import FrequencyEviction, LRUEviction, NeededSoon
from colony.vcm.placement import ReplicaView, choose_replica

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import affinity_sim as sim


def test_eviction_passes_over_pages_needed_soon() -> None:
    for policy in (LRUEviction(), FrequencyEviction()):
        for page in ("cold", "warm", "hot", "hot", "hot", "warm"):
            policy.touch(page)
        cache = ["cold", "warm", "hot"]
        assert policy.unpinned_victim(cache) == "cold"  # the policy's own choice ...
        # ... is kept when a queued agent needs it soon; the next one by the policy's order goes
        assert policy.unpinned_victim(cache, needed_soon={"cold"}) == policy.victim(["warm", "hot"])
        assert policy.unpinned_victim(cache, needed_soon={"cold", "warm"}) == "hot"
        # every evictable page needed soon: a preference, not a pin; the policy chooses among them
        assert policy.unpinned_victim(cache, needed_soon=set(cache)) == "cold"
        assert policy.unpinned_victim(cache, {"cold"}, needed_soon={"warm", "hot"}) == policy.victim(
            ["warm", "hot"]
        )
        # a pin still wins over everything: never evicted, even if it is the only page not needed soon
        assert policy.unpinned_victim(cache, {"cold"}, needed_soon={"warm"}) == "hot"
        assert policy.unpinned_victim(cache, set(cache), needed_soon=()) is None


def test_every_page_needed_soon_gives_up_the_one_needed_last() -> None:
    """An ordered needed-soon list (soonest first) decides among pages that are all needed soon:
    the page whose next use is farthest goes, whatever the policy's own order; a set has no order
    and leaves it to the policy."""
    for policy in (LRUEviction(), FrequencyEviction()):
        for page_id in ("cold", "warm", "hot", "hot", "hot", "warm"):
            policy.touch(page_id)
        cache = ["cold", "warm", "hot"]
        assert policy.unpinned_victim(cache, needed_soon=["cold", "warm", "hot"]) == "hot"
        assert policy.unpinned_victim(cache, needed_soon=["hot", "warm", "cold"]) == "cold"
        assert policy.unpinned_victim(cache, needed_soon=("warm", "cold", "hot", "warm")) == "hot"
        assert policy.unpinned_victim(cache, needed_soon=set(cache)) == "cold"  # the policy's choice
        # a page not needed soon still goes first, and pins still win
        assert policy.unpinned_victim(cache, needed_soon=["cold", "warm"]) == "hot"
        assert policy.unpinned_victim(cache, {"hot"}, needed_soon=["cold", "warm", "hot"]) == "warm"
        assert policy.unpinned_victim(cache, set(cache), needed_soon=["cold"]) is None


def test_needed_soon_tiers_say_what_is_known_of_the_order() -> None:
    """`NeededSoon.of`: a sequence of ids is one tier a page (their order known), a set or a
    set-like view one tier (no order), a page counts in its first tier. Within a tier whose order
    is unknown the policy chooses: a hot page of an idle agent is not given up for its id."""
    assert NeededSoon.of(["b", "a", "b", "c"]).tiers == (frozenset("b"), frozenset("a"), frozenset("c"))
    assert NeededSoon.of({"a": 1, "b": 2}.keys()).tiers == (frozenset("ab"),)
    assert NeededSoon.of("page-1").tiers == (frozenset({"page-1"}),)
    soon = NeededSoon([{"x"}, {"a", "z"}, ["x", "s"], []])
    assert soon.tiers == (frozenset("x"), frozenset("az"), frozenset("s")) and len(soon) == 4
    assert NeededSoon(["p1", "p2"]).tiers == (frozenset({"p1"}), frozenset({"p2"}))  # ids, not letters
    assert NeededSoon.of(("p1", {"p2", "p3"})).tiers == (frozenset({"p1"}), frozenset({"p2", "p3"}))
    assert soon.tier_of("z") == 1 and soon.tier_of("q") == 3
    assert (NeededSoon(["a"]) == ["a"]) is False and NeededSoon(["a"]) == NeededSoon.of(["a"])
    assert list(soon) == ["x", "a", "z", "s"] and "z" in soon and "q" not in soon
    for policy in (LRUEviction(), FrequencyEviction()):
        for page_id in ["a", *["z"] * 20]:  # z: hot, used last
            policy.touch(page_id)
        assert policy.unpinned_victim(["a", "z"], needed_soon=[{"a", "z"}]) == "a"  # the policy's
        assert policy.unpinned_victim(["a", "z", "x"], needed_soon=[{"x"}, {"a", "z"}]) == "a"
        assert policy.unpinned_victim(["a", "z", "s"], needed_soon=soon) == "s"  # the last tier first


def test_a_replica_hosts_tiers_runs_prefetching_resuming_history_then_suspended() -> None:
    """What a replica host tells its engine, soonest first: a run claimed but not begun, pages
    being prefetched, suspended agents whose resumption is close (the monitor's order), the idle
    hosted page-bound agents by their pages' own history (never by id; pages never used here last,
    together), then suspended agents that wait to be asked for."""
    from types import SimpleNamespace

    from colony.agents.models import AgentState, AgentType
    from colony.system.host_pages import ReplicaPages
    from colony.system.registry import SoonSuspended

    def agent(state: AgentState, pages: list[str], runs: int = 0) -> SimpleNamespace:
        return SimpleNamespace(
            state=state,
            runs=runs,
            metadata=SimpleNamespace(agent_type=AgentType.VCM_BOUND, bound_pages=pages),
        )

    agents = {
        "alpha": agent(AgentState.IDLE, ["pA"]),
        "mid": agent(AgentState.WAITING, ["pW"]),
        "run": agent(AgentState.RUNNING, ["pR"]),  # in use: pinned, not needed soon
        "queued": agent(AgentState.IDLE, ["pQ"], runs=1),  # a run claimed here, not begun
        "zeta": agent(AgentState.IDLE, ["pZ", "pS2"]),
    }
    clock = [100.0]
    pages = ReplicaPages("r0")
    pages.demand.clock = lambda: clock[0]
    pages.runtime = SimpleNamespace(  # type: ignore[assignment]
        agent_ids=sorted(agents), get=agents.__getitem__, runs_waiting=lambda a: agents[a].runs
    )
    pages._prefetching = {"new": ["pN"]}
    pages._soon_suspended = (
        SoonSuspended("pS1", 0.75, "children 3/4 done"),
        SoonSuspended("pS2", 0.5, "waits for room"),
        SoonSuspended("pS3", 0.0, "waits to be asked for"),
    )
    for at, page_id in [(10.0, "pZ"), (20.0, "pW"), (30.0, "pZ"), (40.0, "pW")]:  # every 20 s each
        pages.demand.record(page_id, at)
        pages.demand.release(page_id, at)
    clock[0] = 45.0  # pZ: last at 30, next at 50; pW: last at 40, next at 60
    soon = pages.needed_soon()
    assert soon.tiers == (
        frozenset({"pQ"}),
        frozenset({"pN"}),
        frozenset({"pS1"}),
        frozenset({"pS2"}),
        frozenset({"pZ"}),
        frozenset({"pW"}),
        frozenset({"pA"}),  # never used here: last of the hosted, order unknown
        frozenset({"pS3"}),
    )
    reasons = [(e.page_id, e.reason) for e in pages.soon_entries()]
    assert reasons == [
        ("pQ", "run_waiting"),
        ("pN", "prefetching"),
        ("pS1", "resuming"),
        ("pS2", "resuming"),
        ("pZ", "history"),
        ("pW", "history"),
        ("pA", "history"),
        ("pS3", "suspended"),
    ]
    lru = LRUEviction()
    for page_id in ["pZ", "pW", "pA"]:
        lru.touch(page_id)
    # LRU alone would evict pZ (used longest ago); pA is needed last of the three
    assert lru.victim(["pA", "pZ", "pW"]) == "pZ"
    assert lru.unpinned_victim(["pA", "pZ", "pW"], needed_soon=soon) == "pA"
    assert lru.unpinned_victim(["pA", "pZ", "pS3", "pN"], needed_soon=soon) == "pS3"


def test_ordered_needed_soon_keeps_a_cycle_longer_than_the_cache() -> None:
    """Agents taking turns over more pages than the caches hold (`--workload turns`): a set of
    the pages needed soon, once it spans the cycle, tells them apart no more and LFU/LRU evicts
    the page needed next; the ordered list gives up the page just used (needed last), which is
    what Belady does: far fewer faults, close to the bound."""
    trace = sim.make_turns_trace(agents=24, pages=72, group=3, requests=1200)

    def run(lookahead: int) -> sim.Result:
        return sim.simulate(
            "colony", sim.colony_router(), trace, lambda p: 100, 4, 16, "lfu-da", lookahead=lookahead
        )

    plain, ordered = run(0), run(24)
    bound = sim.belady(trace, lambda p: 100, 4 * 16)
    assert ordered.hit_rate > 2 * plain.hit_rate
    assert ordered.hit_rate > 0.9 * bound.hit_rate


def test_simulated_needed_soon_eviction_and_prefetch_cut_faults() -> None:
    """The simulator's agent-aware variants run the policies' needed-soon path: fewer pages
    prefilled than plain Colony on the same trace, and prefetch takes faults off requests' paths."""
    trace = sim.make_trace(seed=3, agents=24, pages=60, group=3, requests=1500, zipf=0.8)

    def run(**aware: int) -> sim.Result:
        return sim.simulate("colony", sim.colony_router(), trace, lambda p: 100, 3, 8, "lfu-da", **aware)

    plain, soon, fetched = run(), run(lookahead=8), run(lookahead=8, prefetch=1)
    assert run(lookahead=0) == plain and plain.prefetched == 0
    assert soon.prefill_tokens < plain.prefill_tokens and soon.hit_rate > plain.hit_rate
    assert fetched.prefetched > 0
    assert (fetched.accesses - fetched.hits) * 5 < plain.accesses - plain.hits  # faults off the path
    # prefetch loads are counted: few are wasted (evicted before their request)
    assert fetched.prefill_tokens < 1.1 * plain.prefill_tokens


def test_misses_on_full_caches_spread_over_replicas_and_keep_a_home() -> None:
    """Every cache full, none holding the page, equal load: misses of different pages go to
    different replicas (not all to the first by id, which then thrashes while the others idle),
    and a page goes back where it went before."""

    def views() -> list[ReplicaView]:
        return [ReplicaView(r, resident={f"{r}-{i}" for i in range(4)}) for r in ("r0", "r1", "r2")]

    homes = {f"new-{n}": choose_replica(views(), [f"new-{n}"]).replica_id for n in range(30)}
    counts = {r: sum(1 for home in homes.values() if home == r) for r in ("r0", "r1", "r2")}
    assert min(counts.values()) >= 5, counts
    assert all(choose_replica(views(), [p]).replica_id == home for p, home in homes.items())
    assert choose_replica(views(), []).replica_id == "r0"  # page-less work: id order, as before


def page(page_id: str) -> Page:
    text = " ".join(f"Line {i}: {page_id} step {i} adds {i * 7}." for i in range(20))
    return Page(page_id=page_id, text=text)


on_engine_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    eng = EmbeddedEngine(EngineSettings(page_slots=2, threads=1), data_dir=tmp_path_factory.mktemp("soon"))
    await eng.start()
    yield eng
    await eng.close()


async def empty(engine: EmbeddedEngine) -> None:
    engine.pages_needed_soon = None
    for page_id in list(engine.resident_pages()):
        await engine.evict_page(page_id)


@on_engine_loop
async def test_the_embedded_engine_keeps_a_page_needed_soon(engine: EmbeddedEngine) -> None:
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))
    # b used last: a is the policy's victim
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["b"], max_tokens=1))
    asked: list[int] = []

    def needed_soon() -> set[str]:
        asked.append(1)
        return {"a"}

    engine.pages_needed_soon = needed_soon
    load = await engine.load_page(page("c"))
    assert asked, "the engine did not consult pages_needed_soon when it evicted"
    assert load.evicted == ["b"] and set(engine.resident_pages()) == {"a", "c"}

    # the same cache without the hint evicts the policy's own choice: the hint made the difference
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["b"], max_tokens=1))
    assert (await engine.load_page(page("c"))).evicted == ["a"]


@on_engine_loop
async def test_a_failing_hint_does_not_fail_the_load(engine: EmbeddedEngine) -> None:
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))

    def broken() -> set[str]:
        raise RuntimeError("host gone")

    engine.pages_needed_soon = broken
    assert (await engine.load_page(page("c"))).evicted == ["a"]  # the policy alone decides
    await empty(engine)


@on_engine_loop
async def test_prefetch_brings_pages_in_before_their_first_use(engine: EmbeddedEngine) -> None:
    await empty(engine)
    pages = {p.page_id: p for p in (page("x"), page("y"), page("z"))}

    async def fetch(page_id: str) -> Page:
        return pages[page_id]

    assert await engine.prefetch(["x"], fetch) == ["x"]
    assert "x" in engine.resident_pages() and not engine.pinned_pages()  # resident, not held
    assert await engine.prefetch(["x"], fetch) == []  # already there: nothing to do
    async with engine.using_pages(["x"], fetch) as faulted:
        assert faulted == []  # the agent's first step finds its page: no fault
    # every slot in use: a prefetch does not wait behind the pins, it brings nothing in
    async with engine.using_pages(["x", "y"], fetch):
        assert await asyncio.wait_for(engine.prefetch(["z"], fetch), 10) == []
    assert "z" not in engine.resident_pages()
    # nor does it push out a page a queued agent needs soon: only one nobody is waiting for
    engine.pages_needed_soon = lambda: {"x", "y", "z"}
    assert await engine.prefetch(["z"], fetch) == [] and set(engine.resident_pages()) == {"x", "y"}
    engine.pages_needed_soon = lambda: {"x", "z"}
    assert await engine.prefetch(["z"], fetch) == ["z"] and set(engine.resident_pages()) == {"x", "z"}
    await empty(engine)


@on_engine_loop
async def test_the_embedded_engine_gives_up_the_page_needed_last(engine: EmbeddedEngine) -> None:
    """Both resident pages needed soon, in order: the engine evicts the one needed later, where
    its own policy (LFU-DA, b used more and last) would have evicted a."""
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["b"], max_tokens=1))
    engine.pages_needed_soon = lambda: ["a", "c", "b"]  # a next, then c, then b
    load = await engine.load_page(page("c"))
    assert load.evicted == ["b"] and set(engine.resident_pages()) == {"a", "c"}
    await empty(engine)


@on_engine_loop
async def test_the_embedded_engine_follows_a_replicas_history_in_a_cycle(engine: EmbeddedEngine) -> None:
    """Agents take turns c -> a -> b on a two-slot engine; a and b were just used, c is next. The
    replica's list, from its own history of uses (no future knowledge), names a before b (used
    longest ago: needed next after c), so the engine's eviction (`_free_slot`) gives up b, where
    its own policy would give up a, the page needed right after."""
    from types import SimpleNamespace

    from colony.agents.models import AgentState, AgentType
    from colony.system.host_pages import ReplicaPages

    def bound(page_id: str) -> SimpleNamespace:
        metadata = SimpleNamespace(agent_type=AgentType.VCM_BOUND, bound_pages=[page_id])
        return SimpleNamespace(state=AgentState.IDLE, metadata=metadata)

    agents = {f"agent-{p}": bound(p) for p in ("a", "b", "c")}
    replica = ReplicaPages("r0")
    replica.runtime = SimpleNamespace(  # type: ignore[assignment]
        agent_ids=sorted(agents), get=agents.__getitem__, runs_waiting=lambda _: 0
    )
    now = 0.0
    for _ in range(3):  # three rounds of turns, 2 s apart: ... c, a, b; c's turn is next
        for page_id in ("c", "a", "b"):
            replica.demand.record(page_id, now)
            replica.demand.release(page_id, now + 0.5)
            now += 2.0
    replica.demand.clock = lambda: now
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["a"], max_tokens=1))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["b"], max_tokens=1))
    engine.pages_needed_soon = replica.needed_soon
    assert [next(iter(tier)) for tier in replica.needed_soon().tiers] == ["c", "a", "b"]
    load = await engine.load_page(page("c"))
    assert load.evicted == ["b"] and set(engine.resident_pages()) == {"a", "c"}
    # the same cache without the list: the engine's own policy gives up a, needed right after c
    await empty(engine)
    await engine.load_page(page("a"))
    await engine.load_page(page("b"))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["a"], max_tokens=1))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["b"], max_tokens=1))
    assert (await engine.load_page(page("c"))).evicted == ["a"]
    await empty(engine)


def test_needed_soon_of_4096_single_page_tiers_is_linear() -> None:
    """Built under the engine's lock at every eviction: thousands of one-page tiers (suspended
    agents, idle sessions) must not cost a quadratic walk. Four times the tiers take about four
    times as long (a quadratic walk: sixteen); the best of three tries of each, compared with each
    other (not with a clock budget: the machine may be busy)."""
    import time

    def best(count: int) -> float:
        tiers = [[f"pg-{i:016x}"] for i in range(count)]
        times = []
        for _ in range(3):
            started = time.perf_counter()
            soon = NeededSoon(tiers)
            times.append(time.perf_counter() - started)
        assert len(soon.tiers) == count and soon.tier_of(f"pg-{count - 1:016x}") == count - 1
        return min(times)

    assert best(16_384) / best(4096) < 9
