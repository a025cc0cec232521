"""The HTTP API in-process (ASGI) on a real Redis, with agents hosted by a ReplicaHost."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard
from colony.config import ColonySettings, VcmSettings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import ask_blueprint, echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.runs import RunService

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def api(
    bb: Blackboard, redis_url: str, tmp_path
) -> AsyncIterator[tuple[httpx.AsyncClient, ReplicaHost]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"api{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-a", engine=ScriptedEngine(["The answer is forty two."]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    await host.ensure_agent(ask_blueprint())
    assert host.registry is not None
    runs = RunService(bb, host.registry, settings=settings)
    from colony.vcm import PageTable

    pages = PageTable(bb, settings=settings)
    vcm = VcmSettings(allowed_roots=[tmp_path])  # the folders tests map
    app = create_app(ApiServices(runs=runs, registry=host.registry, token=TOKEN, pages=pages, vcm=vcm))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://colony") as client:
        yield client, host
    await host.close()


async def wait_done(client: httpx.AsyncClient, run_id: str, timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            body = (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).json()
            if body["status"] in ("succeeded", "failed", "cancelled"):
                return body
            await asyncio.sleep(0.05)


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append({"id": fields["id"], "event": fields["event"], "data": json.loads(fields["data"])})
    return events


async def test_echo_run_over_http_with_events(api) -> None:
    client, _ = api
    submitted = await client.post(
        "/v1/runs", json={"agent": "echo", "input": {"hello": [1, 2]}}, headers=AUTH
    )
    assert submitted.status_code == 202
    body = submitted.json()
    assert body["status"] == "queued" and body["events_url"] == f"/v1/runs/{body['run_id']}/events"
    stream = await client.get(body["events_url"], headers=AUTH)
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(stream.text)
    assert [e["event"] for e in events] == ["started", "step", "completed"]
    assert events[-1]["data"]["data"]["output"] == {"hello": [1, 2]}
    done = await wait_done(client, body["run_id"])
    assert done["status"] == "succeeded" and done["output"] == {"hello": [1, 2]} and done["agent"] == "echo"


async def test_a_submit_with_stream_true_answers_with_the_runs_events(api) -> None:
    """One request per run: the submit's answer is the event stream itself, the run's id in a
    header; the events URL it names resumes after any event with Last-Event-ID."""
    client, _ = api
    answer = await client.post(
        "/v1/runs", json={"agent": "echo", "input": {"one": "request"}, "stream": True}, headers=AUTH
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    run_id = answer.headers["colony-run-id"]
    assert answer.headers["content-location"] == f"/v1/runs/{run_id}/events"
    events = parse_sse(answer.text)
    assert [e["event"] for e in events] == ["started", "step", "completed"]
    assert events[-1]["data"]["data"]["output"] == {"one": "request"}
    assert all(e["data"]["request_id"] == run_id for e in events)
    again = await client.get(
        answer.headers["content-location"], headers={**AUTH, "Last-Event-ID": events[0]["id"]}
    )
    assert [e["id"] for e in parse_sse(again.text)] == [e["id"] for e in events[1:]]
    assert (await wait_done(client, run_id))["status"] == "succeeded"
    # refused before anything streams: the same errors as a plain submit, as JSON
    missing = await client.post("/v1/runs", json={"agent": "nobody", "stream": True}, headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    for wrong in ("yes please", 0, 1):  # true or false only (JSON booleans), as the schema says
        bad = await client.post("/v1/runs", json={"agent": "echo", "stream": wrong}, headers=AUTH)
        assert bad.status_code == 422 and "stream" in bad.text, wrong


async def test_run_events_come_whole_whether_the_stream_carries_them_or_not(
    api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent writes each run event's value into the stream too (so the event stream reads
    nothing per event), except a large one, which the stream reads: both arrive whole."""
    client, _ = api
    reads: list[str] = []
    real_read = Blackboard.read

    async def read(self: Blackboard, key: str) -> Any:
        reads.append(key)
        return await real_read(self, key)

    monkeypatch.setattr(Blackboard, "read", read)
    big = {"text": "y" * 20_000}  # each of its events carries it: too large for the stream
    answer = await client.post("/v1/runs", json={"agent": "echo", "input": big, "stream": True}, headers=AUTH)
    events = parse_sse(answer.text)
    assert [e["event"] for e in events] == ["started", "step", "completed"]
    assert events[0]["data"]["data"]["input"] == big and events[-1]["data"]["data"]["output"] == big
    run_id = answer.headers["colony-run-id"]
    assert len([k for k in reads if k.startswith(f"event:run:{run_id}:")]) == 3  # each too large
    reads.clear()
    small = await client.post("/v1/runs", json={"agent": "echo", "input": 5, "stream": True}, headers=AUTH)
    assert parse_sse(small.text)[-1]["data"]["data"]["output"] == 5
    assert [k for k in reads if k.startswith("event:")] == []  # every event came with its value


async def test_last_event_id_resumes_without_repeats(api) -> None:
    client, _ = api
    run_id = (await client.post("/v1/runs", json={"agent": "echo", "input": 7}, headers=AUTH)).json()[
        "run_id"
    ]
    everything = parse_sse((await client.get(f"/v1/runs/{run_id}/events", headers=AUTH)).text)
    resumed = parse_sse(
        (
            await client.get(
                f"/v1/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": everything[0]["id"]}
            )
        ).text
    )
    assert [e["id"] for e in resumed] == [e["id"] for e in everything[1:]]


async def test_async_client_runs_and_cancels(api) -> None:
    from colony.client import ApiError, AsyncColonyClient

    client, host = api
    transport = client._transport
    async with AsyncColonyClient("http://colony", TOKEN, transport=transport) as colony:
        view = await colony.run("echo", {"n": 3})
        assert view["status"] == "succeeded" and view["output"] == {"n": 3}
        kinds = [e["event_type"] async for e in colony.events(view["run_id"])]
        assert kinds == ["started", "step", "completed"]
        await host.registry.put(AgentRecord(agent_id="mute", state="idle"))
        pending = await colony.submit("mute", None)
        assert (await colony.cancel(pending["run_id"]))["status"] == "cancelled"
        with pytest.raises(ApiError) as missing:
            await colony.get("run-nope")
        assert missing.value.status == 404 and missing.value.code == "not_found"


async def test_ask_streams_tokens(api) -> None:
    client, _ = api
    run_id = (
        await client.post(
            "/v1/runs", json={"agent": "ask", "input": {"question": "What is six times seven?"}}, headers=AUTH
        )
    ).json()["run_id"]
    events = parse_sse((await client.get(f"/v1/runs/{run_id}/events", headers=AUTH)).text)
    tokens = [e["data"]["data"]["text"] for e in events if e["event"] == "token"]
    assert "".join(tokens).strip() == "The answer is forty two."
    assert events[-1]["event"] == "completed"
    assert (await wait_done(client, run_id))["output"] == "The answer is forty two."


async def test_auth_validation_and_not_found(api) -> None:
    client, _ = api
    assert (await client.get("/healthz")).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = await client.post("/v1/runs", json={"agent": "echo"}, headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
    bad = await client.post("/v1/runs", json={"input": 1}, headers=AUTH)
    assert bad.status_code == 422 and "agent" in bad.json()["error"]["message"]
    bad_timeout = await client.post("/v1/runs", json={"agent": "echo", "timeout_s": -1}, headers=AUTH)
    assert bad_timeout.status_code == 422 and "timeout_s" in bad_timeout.json()["error"]["message"]
    unknown_agent = await client.post("/v1/runs", json={"agent": "nobody"}, headers=AUTH)
    assert unknown_agent.status_code == 404 and "nobody" in unknown_agent.json()["error"]["message"]
    assert (await client.get("/v1/runs/run-missing", headers=AUTH)).status_code == 404
    assert (await client.get("/v1/runs/run-missing/events", headers=AUTH)).status_code == 404
    assert (await client.get("/v1/agents/nobody", headers=AUTH)).status_code == 404
    huge = await client.post(
        "/v1/runs",
        content=b'{"agent": "echo", "input": "' + b"x" * (10 * 1024 * 1024) + b'"}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert huge.status_code == 413


async def test_timeout_and_cancel_end_runs_of_a_silent_agent(api) -> None:
    client, host = api
    await host.registry.put(AgentRecord(agent_id="sleepy", state="idle"))  # registered, nobody serves it
    timed = (await client.post("/v1/runs", json={"agent": "sleepy", "timeout_s": 0.3}, headers=AUTH)).json()
    assert (await client.get(f"/v1/runs/{timed['run_id']}", headers=AUTH)).json()["status"] == "queued"
    await asyncio.sleep(0.5)
    view = (await client.get(f"/v1/runs/{timed['run_id']}", headers=AUTH)).json()
    assert view["status"] == "failed" and "timed out" in view["error"]
    events = parse_sse((await client.get(timed["events_url"], headers=AUTH)).text)
    assert events[-1]["event"] == "failed"
    other = (await client.post("/v1/runs", json={"agent": "sleepy"}, headers=AUTH)).json()
    cancelled = (await client.post(f"/v1/runs/{other['run_id']}/cancel", headers=AUTH)).json()
    assert cancelled["status"] == "cancelled"


async def test_agents_listing_and_metrics(api) -> None:
    client, _ = api
    agents = (await client.get("/v1/agents", headers=AUTH)).json()
    assert {a["agent_id"] for a in agents} >= {"echo", "ask"}
    assert all(a["replica"] == "replica-a" for a in agents)
    echo = (await client.get("/v1/agents/echo", headers=AUTH)).json()
    assert echo["role"] == "echo"
    run_id = (await client.post("/v1/runs", json={"agent": "echo", "input": 1}, headers=AUTH)).json()[
        "run_id"
    ]
    await wait_done(client, run_id)
    text = (await client.get("/metrics", headers=AUTH)).text
    assert 'colony_runs_submitted_total{agent="echo"}' in text
    assert 'colony_runs_completed_total{status="succeeded"}' in text
    assert 'colony_replica_agents{replica="replica-a"}' in text
    assert 'colony_http_requests_total{code="202",method="POST",route="/v1/runs"}' in text


def test_serve_configs_build_the_application() -> None:
    """deployments/*.yaml as `serve deploy` takes them: Ray's own schema parses them, and Serve's
    own builder call (which wants a builder of exactly one parameter) builds the app."""
    from pathlib import Path

    import yaml
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    from colony.serve.app import build_app

    root = Path(__file__).resolve().parents[1]
    local = ServeDeploySchema.model_validate(
        yaml.safe_load((root / "deployments" / "local-cpu.yaml").read_text())
    )
    (app,) = local.applications
    assert app.import_path == "colony.serve.app:build_app"
    app_args = dict(app.args)
    app_args["config"] = str(root / app_args["config"])
    assert isinstance(call_user_app_builder_with_args_if_necessary(build_app, app_args), Application)
    gpu_doc = yaml.safe_load((root / "deployments" / "gpu-vllm.yaml").read_text())
    gpu = ServeDeploySchema.model_validate(gpu_doc).applications[0]
    assert gpu.import_path == "colony.serve.app:build_app"
    assert any(d.ray_actor_options and d.ray_actor_options.num_gpus == 1 for d in gpu.deployments)


async def test_vcm_sources_and_pages_over_http(api, tmp_path) -> None:
    client, _ = api
    (tmp_path / "a.py").write_text("def a():\n    return 1\n")
    (tmp_path / "b.md").write_text("# Notes\n" + "text " * 900)
    mapped = await client.post(
        "/v1/vcm/sources", json={"path": str(tmp_path), "page_tokens": 512}, headers=AUTH
    )
    assert mapped.status_code == 200, mapped.text
    body = mapped.json()
    files = {span["path"] for page in body["pages"] for span in page["files"]}
    assert files == {"a.py", "b.md"} and len(body["pages"]) >= 2
    listed = (await client.get("/v1/vcm/pages", headers=AUTH)).json()
    assert {p["page_id"] for p in listed} == {p["page_id"] for p in body["pages"]}
    assert all(p["resident_on"] == [] for p in listed)
    missing = await client.post("/v1/vcm/sources", json={"path": str(tmp_path / "nope")}, headers=AUTH)
    assert missing.status_code == 422 and "not a directory" in missing.json()["error"]["message"]
    tiny = await client.post("/v1/vcm/sources", json={"path": str(tmp_path), "page_tokens": 5}, headers=AUTH)
    assert tiny.status_code == 422 and "page_tokens" in tiny.json()["error"]["message"]


async def test_http_metrics_count_refusals_streams_and_errors(api) -> None:
    """The pure ASGI metrics middleware (colony.api.http_metrics) counts what the guard refuses, an
    event stream (a submit with `stream: true`) once at its start, and a route that raised as 500."""
    from colony import metrics
    from colony.api.http_metrics import RequestMetricsMiddleware

    client, _ = api

    def count(route: str, method: str, code: str) -> float:
        return metrics.HTTP_REQUESTS.labels(route, method, code)._value.get()

    refused, streamed = count("unmatched", "GET", "401"), count("/v1/runs", "POST", "200")
    assert (await client.get("/v1/agents")).status_code == 401  # no token: the guard answers
    async with client.stream(
        "POST", "/v1/runs", json={"agent": "echo", "input": 1, "stream": True}, headers=AUTH
    ) as response:
        assert response.status_code == 200
        assert "event: completed" in "".join([chunk async for chunk in response.aiter_text()])
    assert count("unmatched", "GET", "401") == refused + 1
    assert count("/v1/runs", "POST", "200") == streamed + 1

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("route failed")

    failed = count("unmatched", "GET", "500")
    with pytest.raises(RuntimeError):
        await RequestMetricsMiddleware(broken)({"type": "http", "method": "GET"}, None, None)  # type: ignore[arg-type]
    assert count("unmatched", "GET", "500") == failed + 1

    async def cancelled(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError  # the client went away before the answer: nothing was sent

    with pytest.raises(asyncio.CancelledError):
        await RequestMetricsMiddleware(cancelled)({"type": "http", "method": "GET"}, None, None)  # type: ignore[arg-type]
    assert count("unmatched", "GET", "500") == failed + 1  # not counted as a server error
