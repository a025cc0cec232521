"""The control plane on a real local Ray Serve cluster (two engine replicas, scripted engine with a
slow reply): a `ray.kill`ed replica's running agent is re-placed and its run still succeeds;
suspend/resume over HTTP; `analyze` with workers placed through the AgentSystem deployment."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from colony.client import ColonyClient
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings

APP = "ctl"


@pytest.fixture(scope="module")
def client(
    redis_server, serve_instance: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ColonyClient]:
    from ray import serve

    from colony.serve.app import build_app_with_settings

    settings = ColonySettings(
        redis_url=redis_server.url,
        colony_id=f"ctl{uuid.uuid4().hex[:6]}",
        data_dir=tmp_path_factory.mktemp("ctl"),
        engine=EngineSettings(kind="scripted", scripted_delay_seconds=1.5),
        serve=ServeSettings(heartbeat_seconds=0.5, monitor_period_seconds=0.2, placement_retry_seconds=1),
        vcm=VcmSettings(allowed_roots=[tmp_path_factory.getbasetemp()]),  # the folders tests map
        api_token="ctl-token",
    )
    serve.run(
        build_app_with_settings({"replicas": 2, "replica_cpus": 0.25}, settings=settings),
        name=APP,
        route_prefix="/",
    )
    try:
        with ColonyClient(f"http://127.0.0.1:{serve_instance}", "ctl-token", timeout=60) as made:
            deadline = time.monotonic() + 120
            while {"echo", "ask", "analyze"} - {a["agent_id"] for a in made.agents()}:
                assert time.monotonic() < deadline, "the built-in agents did not appear"
                time.sleep(0.2)
            yield made
    finally:
        serve.delete(APP)


def wait_status(client: ColonyClient, run_id: str, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = client.get(run_id)
        if view["status"] in statuses:
            return view
        assert time.monotonic() < deadline, f"run {run_id} stayed {view['status']}"
        time.sleep(0.1)


def replica_actor(replica_id: str) -> Any:
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "EngineReplica" in actor["name"] and actor["name"].endswith(replica_id):
            return ray.get_actor(actor["name"], namespace=actor["namespace"])
    raise AssertionError(f"no actor for replica {replica_id}")


def agent(client: ColonyClient, agent_id: str) -> dict[str, Any]:
    return next(a for a in client.agents() if a["agent_id"] == agent_id)


def test_run_survives_ray_kill_of_the_replica_hosting_its_agent(client: ColonyClient) -> None:
    import ray

    run_id = client.submit("ask", {"question": "still there?"})["run_id"]
    wait_status(client, run_id, {"running"})
    doomed = agent(client, "ask")["replica"]
    ray.kill(replica_actor(doomed), no_restart=True)  # mid-reply (the scripted engine takes 1.5 s)
    view = wait_status(client, run_id, {"succeeded", "failed", "cancelled"}, timeout=90)
    assert view["status"] == "succeeded", view
    moved = agent(client, "ask")
    assert moved["replica"] not in (None, doomed) and moved["state"] != "suspended"
    deadline = time.monotonic() + 10  # its heartbeat lapses (5 periods of 0.5 s)
    while doomed in {r["replica_id"] for r in client.replicas()}:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_suspend_and_resume_over_http(client: ColonyClient) -> None:
    suspended = client.suspend("echo")
    assert suspended["state"] == "suspended" and suspended["replica"] is None
    run_id = client.submit("echo", {"n": 1})["run_id"]
    time.sleep(1.0)  # CUSTOM condition: nothing resumes it but the call below
    assert client.get(run_id)["status"] == "queued" and agent(client, "echo")["state"] == "suspended"
    resumed = client.resume("echo")
    assert resumed["state"] != "suspended" and resumed["replica"]
    view = wait_status(client, run_id, {"succeeded", "failed"})
    assert view["status"] == "succeeded" and view["output"] == {"n": 1}


def test_analyze_places_page_workers_through_the_control_plane(client: ColonyClient, tmp_path: Path) -> None:
    for name in ("one.py", "two.py"):
        (tmp_path / name).write_text("\n".join(f"def {name[:3]}_{i}():\n    return {i}" for i in range(40)))
    source = client.map_source(str(tmp_path), page_tokens=256)
    pages = [p["page_id"] for p in source["pages"]]
    view = client.run("analyze", {"path": str(tmp_path), "pages": pages}, timeout_s=120)
    assert view["status"] == "succeeded", view
    report = view["output"]
    assert report["files"] == ["one.py", "two.py"] and "one.py" in report["report"]
    workers = {a["agent_id"]: a for a in client.agents() if a["agent_id"] in report["workers"]}
    assert len(workers) == len(pages) and all(w["state"] == "stopped" for w in workers.values())
