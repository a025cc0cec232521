"""Limits that hold (issue 11, item 8): hostile bodies, ids and headers get 4xx, never a 5xx or a
stored run; a run that fails inside an agent ends `failed` and the agent goes on serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from test_api import AUTH, TOKEN, api, parse_sse, wait_done  # noqa: F401 - `api` is a fixture

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard
from colony.config import ApiSettings, load_settings
from colony.system.host import ReplicaHost


async def stored_runs(host: ReplicaHost, bb: Blackboard) -> int:
    """How many run records the colony holds (each accepted POST /v1/runs writes one)."""
    from colony.system.runs import RunService

    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=host.settings.colony_id, settings=load_settings())
    return len([e async for e in runs.api_board.iter_query("run:*")])


def nested(depth: int, leaf: Any = 1) -> Any:
    """`depth` levels of lists around `leaf`."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


async def test_chunked_body_over_the_limit_is_refused_and_not_stored(api, bb: Blackboard) -> None:  # noqa: F811
    client, host = api
    before = await stored_runs(host, bb)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"agent": "echo", "input": "'
        for _ in range(5 * 16):
            yield b"x" * 65536  # 5 MiB in all, no Content-Length
        yield b'"}'

    response = await client.post(
        "/v1/runs", content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert await stored_runs(host, bb) == before
    # a declared length over the limit is refused before anything is read
    declared = await client.post(
        "/v1/runs", content=b"x" * (1024 * 1024 + 1), headers={**AUTH, "content-type": "application/json"}
    )
    assert declared.status_code == 413
    # just under the limit passes the wall (and is then an ordinary run)
    small = await client.post("/v1/runs", json={"agent": "echo", "input": "y" * 1000}, headers=AUTH)
    assert small.status_code == 202
    assert await stored_runs(host, bb) == before + 1


async def test_body_limit_follows_the_setting(bb: Blackboard, api) -> None:  # noqa: F811
    _, host = api
    from colony.system.runs import RunService

    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=host.settings.colony_id, settings=load_settings())
    app = create_app(
        ApiServices(runs=runs, registry=host.registry, token="t"), api=ApiSettings(max_body_bytes=2048)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:
        headers = {"Authorization": "Bearer t"}
        over = await client.post("/v1/runs", json={"agent": "echo", "input": "z" * 3000}, headers=headers)
        assert over.status_code == 413 and "2048" in over.json()["error"]["message"]
        fits = await client.post("/v1/runs", json={"agent": "echo", "input": "z" * 1000}, headers=headers)
        assert fits.status_code == 202


async def test_deep_input_is_a_422_naming_the_field(api, bb: Blackboard) -> None:  # noqa: F811
    client, host = api
    before = await stored_runs(host, bb)
    for depth in (33, 210, 500):
        response = await client.post("/v1/runs", json={"agent": "echo", "input": nested(depth)}, headers=AUTH)
        assert response.status_code == 422, (depth, response.text)
        message = response.json()["error"]["message"]
        assert message.startswith("input") and "max_input_depth" in message
    deep_dict: Any = 1
    for i in range(40):
        deep_dict = {f"k{i}": deep_dict}
    response = await client.post("/v1/runs", json={"agent": "echo", "input": deep_dict}, headers=AUTH)
    assert response.status_code == 422 and "input.k39" in response.json()["error"]["message"]
    # deeper than Python's JSON parser goes: a 4xx, not a 500
    raw = b'{"agent": "echo", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = await client.post(
        "/v1/runs", content=raw, headers={**AUTH, "content-type": "application/json"}
    )
    assert response.status_code in (400, 422) and response.json()["error"]["code"] in (
        "bad_request",
        "invalid_request",
    )
    assert await stored_runs(host, bb) == before
    ok = await client.post("/v1/runs", json={"agent": "echo", "input": nested(32)}, headers=AUTH)
    assert ok.status_code == 202
    assert (await wait_done(client, ok.json()["run_id"]))["output"] == nested(32)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"agent": "echo", "input": "\\ud800"}', "surrogate"),
        (b'{"agent": "echo", "input": {"\\udfff": 1}}', "surrogate"),
        (b'{"agent": "echo", "input": [1, NaN]}', "NaN"),
        (b'{"agent": "echo", "input": {"x": Infinity}}', "NaN"),
        (b'{"agent": "echo", "input": -Infinity}', "NaN"),
        (b'{"agent": "echo", "timeout_s": NaN}', "timeout_s"),
        (b'{"agent": "echo", "timeout_s": Infinity}', "timeout_s"),
        (b'{"agent": "ec\\ud800ho"}', "agent"),
        (b'{"agent": "../../etc"}', "agent"),
        (b'{"agent": "a:b"}', "agent"),
        (b'{"agent": "a*"}', "agent"),
        (b'{"agent": "' + b"a" * 200 + b'"}', "agent"),
        (b'{"agent": "echo", "namespace": "x:y"}', "namespace"),
        (b'{"agent": "echo", "pages": ["pg-1", "bad page"]}', "pages"),
        (b'{"agent": "echo", "surprise": 1}', "surprise"),
        (b'{"agent": "echo", "input": "\\u0000ok"}', None),  # NUL is valid JSON text: accepted
    ],
)
async def test_hostile_run_bodies_get_422(api, bb: Blackboard, raw: bytes, field: str | None) -> None:  # noqa: F811
    client, host = api
    before = await stored_runs(host, bb)
    response = await client.post(
        "/v1/runs", content=raw, headers={**AUTH, "content-type": "application/json"}
    )
    if field is None:
        assert response.status_code == 202
        return
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]["message"]
    assert await stored_runs(host, bb) == before


async def test_ids_and_query_params_are_validated(api) -> None:  # noqa: F811
    client, _ = api
    for path in (
        "/v1/runs/run:1",
        "/v1/runs/run*",
        "/v1/runs/%F0%9F%98%80",
        "/v1/runs/" + "r" * 200,
        "/v1/runs/run%5B1%5D/events",
        "/v1/runs/a%20b/cancel",
        "/v1/agents/ec*ho",
        "/v1/agents/a%3Ab",
        "/v1/agents/" + "a" * 200,
        "/v1/agents?state=sleeping",
        "/v1/vcm/pages?replica=a%2Ab",
        "/v1/vcm/pages?replica=",
    ):
        method = "POST" if path.endswith("/cancel") else "GET"
        response = await client.request(method, path, headers=AUTH)
        assert response.status_code == 422, (path, response.status_code, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    for path in ("/v1/agents/a:b/suspend", "/v1/agents/*/resume"):
        assert (await client.post(path, headers=AUTH)).status_code in (404, 422)
    assert (await client.get("/v1/agents?state=idle", headers=AUTH)).status_code == 200
    assert (await client.get("/v1/runs/run-0123456789ab", headers=AUTH)).status_code == 404


async def test_map_source_refuses_unencodable_paths(api) -> None:  # noqa: F811
    client, _ = api
    for raw in (b'{"path": "/tmp/\\ud800"}', b'{"path": "/tmp/a\\u0000b"}'):
        response = await client.post(
            "/v1/vcm/sources", content=raw, headers={**AUTH, "content-type": "application/json"}
        )
        assert response.status_code == 422 and "path" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "last_event_id", ["garbage", "$", "0", "1-2-3", "-1-0", "1" * 30 + "-0", "1-x", "99999999999999-0"]
)
async def test_garbage_last_event_id_is_a_400(api, last_event_id: str) -> None:  # noqa: F811
    client, _ = api
    run_id = (await client.post("/v1/runs", json={"agent": "echo", "input": 1}, headers=AUTH)).json()[
        "run_id"
    ]
    async with asyncio.timeout(10):
        response = await client.get(
            f"/v1/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": last_event_id}
        )
    assert response.status_code == 400, response.text
    assert "Last-Event-ID" in response.json()["error"]["message"]


async def test_a_bad_run_never_harms_the_next_one(api, bb: Blackboard) -> None:  # noqa: F811
    """An input deep enough to be stored but not deep enough to be refused by Redis makes the echo
    agent's own writes fail: that run must end `failed` with a reason, and echo must go on serving."""
    client, host = api
    from colony.system.runs import RunService

    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=host.settings.colony_id, settings=load_settings())
    # the deepest input the blackboard stores (bypassing the API's cap, as a misbehaving client of
    # Redis or an agent calling another could)
    low, high = 2, 400
    while low < high:
        middle = (low + high + 1) // 2
        try:
            record = await runs.submit("echo", nested(middle))
        except Exception:
            high = middle - 1
        else:
            await runs.cancel(record.run_id)
            low = middle
    bad = await runs.submit("echo", nested(low))
    view = await wait_done(client, bad.run_id, timeout=15)
    if low < 400:  # deeper values were refused: this one is too deep for the agent's own events
        assert view["status"] == "failed" and "could not" in view["error"], view
    for value in ({"after": 1}, "second", [3]):
        good = await client.post("/v1/runs", json={"agent": "echo", "input": value}, headers=AUTH)
        done = await wait_done(client, good.json()["run_id"], timeout=15)
        assert done["status"] == "succeeded" and done["output"] == value


async def test_no_5xx_from_a_batch_of_hostile_requests(api) -> None:  # noqa: F811
    client, _ = api
    bodies: list[bytes] = [
        b"",
        b"null",
        b"[]",
        b"{",
        b"\xff\xfe",
        b'{"agent": null}',
        b'{"agent": 1}',
        b'{"agent": "echo", "timeout_s": "soon"}',
        b'{"agent": "echo", "timeout_s": 1e400}',
        b'{"agent": "echo", "pages": "pg"}',
        b'{"agent": "echo", "pages": [' + b'"p",' * 2000 + b'"p"]}',
        json.dumps({"agent": "echo", "input": {str(i): i for i in range(5000)}}).encode(),
    ]
    for body in bodies:
        for content_type in ("application/json", "text/plain", "application/x-www-form-urlencoded"):
            response = await client.post(
                "/v1/runs", content=body, headers={**AUTH, "content-type": content_type}
            )
            assert response.status_code < 500, (body[:40], content_type, response.text)
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"code", "message"}
    broken = await client.post(
        "/v1/runs", content=b'{"agent": ', headers={**AUTH, "content-type": "application/json"}
    )
    assert broken.status_code == 422 and "not valid JSON at character" in broken.json()["error"]["message"]
    not_utf8 = await client.post(
        "/v1/runs", content=b'{"agent": "e\xe9"}', headers={**AUTH, "content-type": "application/json"}
    )
    assert not_utf8.status_code == 400 and not_utf8.json()["error"]["code"] == "bad_request"
    wrong_method = await client.delete("/v1/runs", headers=AUTH)
    assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["allow"]


async def test_the_import_route_alone_takes_bodies_up_to_its_own_limit(bb: Blackboard, api) -> None:  # noqa: F811
    """`POST /v1/agents/{id}/import` takes bodies up to `max_import_bytes` (an agent export is
    larger than any run), every other route keeps `max_body_bytes`, and a caller without the token
    is refused before any body is read."""
    _, host = api
    from colony.system.runs import RunService

    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=host.settings.colony_id, settings=load_settings())
    app = create_app(
        ApiServices(runs=runs, registry=host.registry, token="t"),
        api=ApiSettings(max_body_bytes=2048),
        max_import_bytes=8192,
    )
    body = {"format": 1, "agent_id": "x", "padding": "z" * 4000}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:
        headers = {"Authorization": "Bearer t"}
        imported = await client.post("/v1/agents/x/import", json=body, headers=headers)
        assert imported.status_code == 422, imported.text  # read whole, refused by the route itself
        run = {"agent": "echo", "input": "z" * 4000}
        elsewhere = await client.post("/v1/runs", json=run, headers=headers)
        assert elsewhere.status_code == 413
        huge = await client.post("/v1/agents/x/import", json={"p": "z" * 9000}, headers=headers)
        assert huge.status_code == 413 and "8192" in huge.json()["error"]["message"]
        anonymous = await client.post("/v1/agents/x/import", json=body)
        assert anonymous.status_code == 401


def test_every_request_body_forbids_unknown_fields() -> None:
    """Each route's body model refuses a field it does not know (a 422 naming it), so an extra field
    is never accepted and ignored: read from the app's own OpenAPI document."""
    spec = create_app(_no_services, token="t").openapi()
    schemas = spec["components"]["schemas"]
    open_bodies = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for media in operation.get("requestBody", {}).get("content", {}).values():
                for candidate in media["schema"].get("anyOf", [media["schema"]]):
                    name = candidate.get("$ref", "").rsplit("/", 1)[-1]
                    schema = schemas.get(name, candidate)
                    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
                        open_bodies.append(f"{method.upper()} {path}: {name or schema}")
    assert not open_bodies, open_bodies


async def _no_services() -> ApiServices:
    raise AssertionError("a body refused by its model never reaches the services")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/sessions", {"session_id": "../evil"}, "session_id"),
        ("/v1/sessions", {"x": json.loads("[" * 300 + "]" * 300)}, "x"),
        ("/v1/sessions/session-0123456789abcdef/messages", {"message": "hi", "role": "system"}, "role"),
        ("/v1/sessions/session-0123456789abcdef/switch", {"branch": "main", "force": True}, "force"),
    ],
)
async def test_session_bodies_with_unknown_fields_are_a_422_naming_them(
    path: str, body: Any, field: str
) -> None:
    app = create_app(_no_services, token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as client:
        json_body = {"Content-Type": "application/json"}
        answer = await client.post(path, content=json.dumps(body), headers=json_body)
    assert answer.status_code == 422, answer.text
    assert field in answer.text
