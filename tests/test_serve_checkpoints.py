"""Checkpoints, undo and restore through the Serve application on a real local Ray cluster (two
engine replicas, the AgentSystem deployment's control plane, the API replica's ServeAgentControl):
the built-in `echo` agent's run is undone over HTTP and re-driven on a replica, and the control
plane's refusals cross the Ray boundary with their statuses."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from colony.client import ColonyClient
from colony.config import ColonySettings, ContextSettings, EngineSettings, ServeSettings
from colony.errors import ApiError

APP = "ckpt"


@pytest.fixture(scope="module")
def client(
    redis_server, serve_instance: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ColonyClient]:
    from ray import serve

    from colony.serve.app import build_app_with_settings

    settings = ColonySettings(
        redis_url=redis_server.url,
        colony_id=f"ckpt{uuid.uuid4().hex[:6]}",
        data_dir=tmp_path_factory.mktemp("ckpt"),
        engine=EngineSettings(kind="scripted"),
        serve=ServeSettings(heartbeat_seconds=0.5, monitor_period_seconds=0.2, placement_retry_seconds=1),
        context=ContextSettings(checkpoints_kept=3),
        api_token="ckpt-token",
    )
    serve.run(
        build_app_with_settings({"replicas": 2, "replica_cpus": 0.25}, settings=settings),
        name=APP,
        route_prefix="/",
    )
    try:
        with ColonyClient(f"http://127.0.0.1:{serve_instance}", "ckpt-token", timeout=60) as made:
            deadline = time.monotonic() + 120
            while "echo" not in {a["agent_id"] for a in made.agents()}:
                assert time.monotonic() < deadline, "the built-in agents did not appear"
                time.sleep(0.2)
            yield made
    finally:
        serve.delete(APP)


def test_undo_and_restore_through_serve(client: ColonyClient) -> None:
    for value in (1, 2):
        run = client.run("echo", {"value": value})
        assert run["status"] == "succeeded"
    listed = client.context.checkpoints("echo")
    # two runs of one step each: (run 1: 0, 1), (run 2: 0, 1); the newest 3 kept
    assert [c["step"] for c in listed] == [1, 0, 1]
    assert listed[0]["run_id"] != listed[-1]["run_id"] and listed[-1]["run_status"] == "succeeded"

    report = client.context.undo("echo")  # back to the beginning of run 2: its step runs again
    assert (report["step"], report["discarded"], report["run_id"]) == (0, [1], listed[-1]["run_id"])
    assert report["record"]["replica"] and report["state"] != "suspended"
    deadline = time.monotonic() + 30
    while [c["step"] for c in client.context.checkpoints("echo")] != [1, 0, 1]:  # step 1 taken again
        assert time.monotonic() < deadline, "the restored run was not driven on"
        time.sleep(0.2)
    assert client.context.checkpoints("echo")[-1]["run_status"] == "succeeded"

    with pytest.raises(ApiError) as missing:
        client.context.restore("echo", 5)
    assert missing.value.status == 404 and "kept steps" in str(missing.value)
    with pytest.raises(ApiError) as unknown:
        client.context.undo("nobody-here")
    assert unknown.value.status == 404
    # the agent still serves runs after all that
    assert client.run("echo", {"value": 3})["status"] == "succeeded"
