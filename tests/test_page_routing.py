"""Page-affinity routing on a real local Ray cluster: two engine replicas (embedded model), the
PageAffinityRouter, page faults and the page table kept equal to what the engines hold."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings, EngineSettings, load_settings


@pytest.fixture(scope="module")
def serve_app(
    redis_server, serve_instance: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ColonySettings, object]]:
    from ray import serve

    from colony.serve.app import build_app_with_settings
    from colony.vcm import PageSource, PageTable

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    settings = ColonySettings(
        redis_url=redis_server.url,
        colony_id=f"route{uuid.uuid4().hex[:6]}",
        data_dir=tmp_path_factory.mktemp("d"),
        engine=EngineSettings(page_slots=2, slot_context_tokens=2048),
    )
    tree = tmp_path_factory.mktemp("tree")
    for name in ("alpha", "beta"):
        (tree / f"{name}.py").write_text(
            "\n".join(f"def {name}_{i}(x):\n    return x * {i} + {len(name)}" for i in range(60))
        )

    async def map_tree() -> list[str]:
        client = create_redis(settings.redis_url)
        try:
            record = await PageTable(
                Blackboard(client, "setup"), colony_id=settings.colony_id, settings=load_settings()
            ).map_source(PageSource(tree, allowed_roots=[tree], page_tokens=1024))
            return record.page_ids
        finally:
            await client.aclose()

    page_ids = asyncio.run(map_tree())
    serve.run(
        build_app_with_settings({"replicas": 2, "replica_cpus": 0.5}, settings=settings),
        name="vcm",
        route_prefix=None,
    )
    try:
        handle = serve.get_deployment_handle("EngineReplica", app_name="vcm")
        yield settings, handle, page_ids
    finally:
        serve.delete("vcm")


def test_page_bound_requests_land_on_the_replica_holding_the_page(serve_app) -> None:
    from colony.vcm import PageTable

    settings, handle, page_ids = serve_app
    first, second = page_ids[0], page_ids[1]
    question = {"prompt": "Which function is defined first?", "max_tokens": 4}
    cold = handle.generate.remote(question, page_ids=[first]).result(timeout_s=300)
    holder = cold["replica_id"]
    assert cold["faulted"] == [first]
    time.sleep(1.5)  # routing stats (what each replica holds) are refreshed every 0.5 s
    other = handle.generate.remote(question, page_ids=[second]).result(timeout_s=300)
    assert other["replica_id"] != holder  # a new page goes to the emptier replica
    time.sleep(1.5)
    for _ in range(4):
        warm = handle.generate.remote(question, page_ids=[first]).result(timeout_s=120)
        assert warm["replica_id"] == holder and warm["faulted"] == []
        assert warm["usage"]["cached_tokens"] >= 0.9 * (warm["usage"]["prompt_tokens"] - 30)
        again = handle.generate.remote(question, page_ids=[second]).result(timeout_s=120)
        assert again["replica_id"] == other["replica_id"]

    async def table_state() -> tuple[list[str], list[str]]:
        client = create_redis(settings.redis_url)
        try:
            table = PageTable(
                Blackboard(client, "check"), colony_id=settings.colony_id, settings=load_settings()
            )
            return (await table.page(first)).resident_on, (await table.page(second)).resident_on
        finally:
            await client.aclose()

    assert asyncio.run(table_state()) == ([holder], [other["replica_id"]])
    assert handle.evict_page.remote(first, target_replica=holder).result(timeout_s=60)  # addressed to B
    assert asyncio.run(table_state()) == ([], [other["replica_id"]])
