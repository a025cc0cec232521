"""VCM: page sources, placement, and the page table reconciled with a real engine's residency."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import uuid
from pathlib import Path

import pytest

from colony.blackboard import Blackboard
from colony.config import EngineSettings, load_settings
from colony.errors import InvalidArgument, ResourceExhausted
from colony.inference.embedded import EmbeddedEngine
from colony.vcm import PageSource, PageTable, ReplicaView, choose_replica, rank_replicas


def make_tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "auth.py").write_text("def login(user):\n    return check(user)\n")
    (root / "src" / "util.py").write_text("def check(user):\n    return bool(user)\n")
    (root / "big.txt").write_text("\n".join(f"line {i}: " + "lorem ipsum " * 8 for i in range(400)))
    (root / "logo.png").write_bytes(b"\x89PNG\x00\x00binary")
    (root / "blob.dat").write_bytes(b"abc\x00def")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "dep.js").write_text("ignored()")
    return root


def test_folder_becomes_pages_on_file_boundaries(tmp_path: Path) -> None:
    source = PageSource(make_tree(tmp_path / "tree"), allowed_roots=[tmp_path], page_tokens=512)
    files = [str(p.relative_to(source.root)) for p in source.files()]
    assert files == ["big.txt", "src/auth.py", "src/util.py"]  # binary and ignored files skipped
    pages = list(source.pages())
    assert all(info.tokens <= 512 for info, _ in pages)
    big_spans = [span for info, _ in pages for span in info.files if span.path == "big.txt"]
    assert len(big_spans) > 1 and big_spans[0].start_line == 1 and big_spans[-1].end_line == 400
    assert all(a.end_line + 1 == b.start_line for a, b in itertools.pairwise(big_spans))  # no gap
    small = next(info for info, _ in pages if any(s.path == "src/auth.py" for s in info.files))
    assert {s.path for s in small.files} >= {"src/auth.py", "src/util.py"}  # small files share a page
    again = [
        info.page_id
        for info, _ in PageSource(tmp_path / "tree", allowed_roots=[tmp_path], page_tokens=512).pages()
    ]
    assert again == [info.page_id for info, _ in pages]  # content-hash ids are stable
    with pytest.raises(InvalidArgument):
        PageSource(tmp_path / "missing", allowed_roots=[tmp_path])


def test_git_checkout_maps_tracked_files_only(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "repo")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "src/auth.py"], check=True)
    source = PageSource(root, allowed_roots=[tmp_path])
    assert [str(p.relative_to(root)) for p in source.files()] == ["src/auth.py"]


def test_placement_hard_soft_swapped_and_capacity() -> None:
    a = ReplicaView("a", resident={"p1"}, load=1)
    b = ReplicaView("b", resident={"p1", "p2"}, load=5)
    c = ReplicaView("c", swapped={"p1", "p2"}, load=0)
    assert choose_replica([a, b, c], ["p1", "p2"]).replica_id == "b"
    assert choose_replica([a, b, c], ["p1", "p2"], hard=True).replica_id == "b"
    assert choose_replica([a, c], ["p1", "p2"]).replica_id == "c"  # 1 resident = 2 swapped; tie: less loaded
    assert choose_replica([a, b, c], []).replica_id == "c"  # no pages: least loaded
    assert (
        choose_replica([ReplicaView("x", load=2), ReplicaView("y", swapped={"p"}, load=9)], ["p"]).replica_id
        == "y"
    )
    b.capacity = 5
    assert choose_replica([a, b, c], ["p1", "p2"]).replica_id == "c"  # b is full
    with pytest.raises(ResourceExhausted, match="holds all"):
        choose_replica([a, b, c], ["p1", "p2"], hard=True)
    with pytest.raises(ResourceExhausted, match="capacity"):
        choose_replica([ReplicaView("z", load=1, capacity=1)], [])
    assert [r.replica_id for r in rank_replicas([a, b, c], ["p2"])] == ["c", "a", "b"]  # full b goes last
    b.capacity = None
    assert [r.replica_id for r in rank_replicas([a, b, c], ["p2"])] == ["b", "c", "a"]
    empty, busy = ReplicaView("e", load=0), ReplicaView("f", resident={"x", "y"}, load=0)
    assert choose_replica([busy, empty], ["new"]).replica_id == "e"  # a new group goes to the emptiest cache


async def test_page_table_follows_real_engine_residency(bb: Blackboard, tmp_path: Path) -> None:
    table = PageTable(bb, colony_id="vcm-test", settings=load_settings())
    mapped = await table.map_source(
        PageSource(make_tree(tmp_path / "tree"), allowed_roots=[tmp_path], page_tokens=256)
    )
    assert len(mapped.page_ids) >= 3 and len(await table.pages()) == len(mapped.page_ids)
    first, second = mapped.page_ids[:2]
    engine = EmbeddedEngine(EngineSettings(page_slots=2, slot_context_tokens=1024), data_dir=tmp_path / "eng")
    try:
        await engine.load_page(await table.content(first))
        await engine.load_page(await table.content(second))
        await table.reconcile("replica-b", engine.resident_pages(), engine.swapped_pages())
        assert {r.page_id for r in await table.pages(replica="replica-b")} == {first, second}
        assert (await table.page(first)).resident_on == ["replica-b"]
        views = await table.views({"replica-a": 0, "replica-b": 3})
        assert choose_replica(views, [first]).replica_id == "replica-b"
        await engine.swap_out_page(second)
        await engine.evict_page(first)
        await table.reconcile("replica-b", engine.resident_pages(), engine.swapped_pages())
        assert await table.pages(replica="replica-b") == []
        assert [r.page_id for r in await table.pages(replica="replica-b", swapped=True)] == [second]
        await table.drop_replica("replica-b")
        assert (await table.page(second)).swapped_on == [] and (await table.page(first)).resident_on == []
    finally:
        await engine.close()


def test_eviction_policies_lru_and_lfu_with_aging() -> None:
    from colony.vcm.eviction import FrequencyEviction, LRUEviction, eviction_policy

    def run(policy, accesses: list[str], capacity: int = 2) -> set[str]:
        cache: set[str] = set()
        for page in accesses:
            if page not in cache and len(cache) >= capacity:
                victim = policy.victim(cache)
                cache.discard(victim)
                policy.evicted(victim)
            cache.add(page)
            policy.touch(page)
        return cache

    burst = ["hot", "hot", "hot", "x1", "x2", "x3"]  # a popular page, then one-off pages
    assert "hot" not in run(LRUEviction(), burst)  # LRU lets the burst flush it
    assert "hot" in run(FrequencyEviction(), burst)  # LFU-DA keeps it
    # aging: once its demand stops, a formerly popular page is evicted after enough newcomers
    # have been used about as often
    fading = ["old", "old", *(f"n{i}" for i in range(3) for _ in range(2)), "n9", "n9", "n9"]
    assert "old" not in run(FrequencyEviction(), fading)
    assert isinstance(eviction_policy("lru"), LRUEviction)
    with pytest.raises(InvalidArgument, match="lfu-da"):
        eviction_policy("fifo")


async def test_concurrent_reconciles_of_one_page_all_land(bb: Blackboard, tmp_path: Path) -> None:
    """Replicas reconcile (and touch) the same page record at once; none of their updates is lost."""
    (tmp_path / "shared.py").write_text("shared = True\n")
    table = PageTable(bb, colony_id=f"rc{uuid.uuid4().hex[:8]}", settings=load_settings())
    (page_id,) = (await table.map_source(PageSource(tmp_path, allowed_roots=[tmp_path]))).page_ids
    replicas = [f"r{i}" for i in range(8)]
    await asyncio.gather(*(table.reconcile(r, [page_id]) for r in replicas), table.touch([page_id]))
    record = await table.page(page_id)
    assert record.resident_on == replicas and record.last_access > 0
    await asyncio.gather(*(table.drop_replica(r) for r in replicas[:4]))
    assert (await table.page(page_id)).resident_on == replicas[4:]
