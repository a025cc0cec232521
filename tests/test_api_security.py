"""Auth on by default, read at run time (issue 11, item 2), over a real Redis, in-process (ASGI)."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.config import ApiSettings, ColonySettings, load_settings
from colony.errors import ConfigError
from colony.system.registry import AgentRegistry
from colony.system.runs import RunService
from colony.vcm import PageTable
from colony.wire.token import TOKEN_ENV, TokenSource, ensure_token_file, token_file_path

TOKEN = "matrix-token"


def services(bb: Blackboard, colony_id: str, token: str | TokenSource) -> ApiServices:
    registry = AgentRegistry(
        bb.scoped(scope_id(BlackboardScope.COLONY, colony_id=colony_id)), settings=load_settings()
    )
    runs = RunService(bb, registry, colony_id=colony_id, settings=load_settings())
    return ApiServices(
        runs=runs,
        registry=registry,
        token=token,
        pages=PageTable(bb, colony_id=colony_id, settings=load_settings()),
    )


@pytest.fixture
async def matrix_app(bb: Blackboard) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(services(bb, f"sec{uuid.uuid4().hex[:8]}", TOKEN))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://colony") as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


def concrete(path: str) -> str:
    return path.replace("{run_id}", "run-0123456789ab").replace("{agent_id}", "echo")


async def test_every_route_needs_the_token_but_healthz(matrix_app: httpx.AsyncClient) -> None:
    """Every route but /healthz and the console's static files (reads of /ui/...: no data; their
    own tests are in tests/test_console_files.py)."""
    client = matrix_app
    routes = [
        (method, concrete(route.path))
        for route in client.app.routes  # type: ignore[attr-defined]
        if isinstance(route, APIRoute) or route.path in ("/openapi.json", "/docs")
        for method in sorted(getattr(route, "methods", None) or {"GET"})
        if method != "HEAD" and route.path != "/healthz" and not route.path.startswith("/ui")
    ]
    paths = {path for _, path in routes}
    assert {"/metrics", "/openapi.json", "/docs", "/v1/runs", "/v1/vcm/sources", "/v1/replicas"} <= paths
    refusals = [
        {},
        {"Authorization": "Basic " + TOKEN},  # wrong scheme
        {"Authorization": TOKEN},  # no scheme
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "Bearer " + TOKEN + "x"},
        {"Authorization": "Bearer "},
    ]
    for method, path in routes:
        for headers in refusals:
            response = await client.request(method, path, headers=headers, json={"agent": "echo"})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        accepted = await client.request(
            method, path, headers={"Authorization": f"Bearer {TOKEN}"}, json={"agent": "echo"}
        )
        assert accepted.status_code != 401, (method, path)
    # an unknown path answers 401 too: nothing is revealed without the token
    assert (await client.get("/v1/secret-route")).status_code == 401
    # the scheme is case-insensitive (RFC 7235)
    assert (await client.get("/v1/agents", headers={"Authorization": f"bearer {TOKEN}"})).status_code == 200
    health = await client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"


async def test_public_docs_setting_opens_docs_only(bb: Blackboard) -> None:
    app = create_app(services(bb, "docs", TOKEN), api=ApiSettings(public_docs=True))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:
        assert (await client.get("/openapi.json")).status_code == 200
        assert (await client.get("/docs")).status_code == 200
        assert (await client.get("/v1/agents")).status_code == 401
        assert (await client.get("/metrics")).status_code == 401


def test_the_app_cannot_be_built_without_a_token(bb: Blackboard) -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        create_app(services(bb, "none", ""))
    with pytest.raises(ConfigError, match="needs a token"):
        create_app(lambda: None)  # type: ignore[arg-type,return-value]


async def test_token_read_at_run_time_from_file_and_env(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token_file = tmp_path / "secret" / "token"
    token_file.parent.mkdir()
    token_file.write_text("first-token\n")
    settings = ColonySettings(data_dir=tmp_path, api={"token_file": str(token_file)})
    source = ensure_token_file(settings)
    app = create_app(services(bb, "rt", source), api=settings.api)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:

        async def status(token: str) -> int:
            return (await client.get("/v1/agents", headers={"Authorization": f"Bearer {token}"})).status_code

        assert await status("first-token") == 200
        # the file changes after the app was built: the new token works, the old one no longer does
        token_file.write_text("second-token-longer")
        assert await status("second-token-longer") == 200
        assert await status("first-token") == 401
        # a token in this process's environment takes precedence, read per request
        monkeypatch.setenv(TOKEN_ENV, "env-token")
        assert await status("env-token") == 200
        assert await status("second-token-longer") == 401
        monkeypatch.delenv(TOKEN_ENV)
        assert await status("second-token-longer") == 200
        # the file removed and nothing else configured: every request is refused, none let through
        token_file.unlink()
        assert await status("second-token-longer") == 401
        assert (await client.get("/v1/agents")).status_code == 401


def test_generated_token_file_is_private_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    previous = os.umask(0)  # the most permissive umask: the file must still be 0600
    try:
        settings = ColonySettings(data_dir=tmp_path / "data")
        source = ensure_token_file(settings)
    finally:
        os.umask(previous)
    path = token_file_path(settings)
    assert path == tmp_path / "data" / "api-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = source.current()
    assert token is not None and len(token) >= 32 and path.read_text() == token
    again = ensure_token_file(settings)  # a second start reuses it
    assert again.current() == token and path.read_text() == token
    assert again.accepts(f"Bearer {token}") and not again.accepts(f"Bearer {token[:-1]}")


def test_a_generated_token_never_starts_with_a_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token pasted after `--token` must not read as an option: the generator draws again."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    drawn = iter(
        ["-starts-like-a-flag-0123456789abcdefghijk", "--two-dashes-0123456789abcdefghijklm", "fine-0123"]
    )
    monkeypatch.setattr("colony.wire.token.secrets.token_urlsafe", lambda n: next(drawn))
    source = ensure_token_file(ColonySettings(data_dir=tmp_path))
    assert source.current() == "fine-0123"


def test_an_empty_token_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    (tmp_path / "api-token").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        ensure_token_file(ColonySettings(data_dir=tmp_path))


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_refuses_a_non_loopback_host_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    settings = ColonySettings(data_dir=tmp_path, serve={"host": host})
    with pytest.raises(ConfigError, match="not a loopback address") as refused:
        ensure_token_file(settings)
    assert TOKEN_ENV in str(refused.value) and "api.token_file" in str(refused.value)
    assert not (tmp_path / "api-token").exists()
    # with a token configured the same host is fine
    monkeypatch.setenv(TOKEN_ENV, "operator-token")
    assert ensure_token_file(settings).current() == "operator-token"
    monkeypatch.delenv(TOKEN_ENV)
    (tmp_path / "api-token").write_text("file-token")
    assert ensure_token_file(settings).current() == "file-token"


def test_serve_replica_gets_no_frozen_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token from the driver's environment is not frozen into the replicas' init args."""
    from colony.serve.app import settings_to_dict

    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert settings_to_dict(ColonySettings())["api_token"] is None
    monkeypatch.delenv(TOKEN_ENV)
    assert settings_to_dict(ColonySettings(api_token="from-config"))["api_token"] == "from-config"
    # the metrics-only token likewise: from the environment it is read per request, not frozen
    from colony.wire.token import METRICS_TOKEN_ENV

    monkeypatch.setenv(METRICS_TOKEN_ENV, "scrape-env")
    assert settings_to_dict(ColonySettings())["api"]["metrics_token"] is None
    monkeypatch.delenv(METRICS_TOKEN_ENV)
    frozen = settings_to_dict(ColonySettings(api={"metrics_token": "scrape-config"}))
    assert frozen["api"]["metrics_token"] == "scrape-config"


async def test_client_reads_the_token_the_way_the_api_does(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from colony.client import AsyncColonyClient
    from colony.errors import ApiError

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLONY_CONFIG", str(tmp_path / "colony.yaml"))
    (tmp_path / "colony.yaml").write_text("log_level: INFO\n")
    settings = ColonySettings(data_dir=tmp_path)
    source = ensure_token_file(settings)  # generated: <data_dir>/api-token
    app = create_app(services(bb, "cli", source), api=settings.api)
    transport = httpx.ASGITransport(app=app)
    async with AsyncColonyClient("http://127.0.0.1", transport=transport) as client:  # no token: local
        with pytest.raises(ApiError) as missing:
            await client.get("run-0123456789ab")
        assert missing.value.status == 404  # past the token check
    async with AsyncColonyClient("http://c", "not-the-token", transport=transport) as client:
        with pytest.raises(ApiError) as refused:
            await client.get("run-0123456789ab")
        assert refused.value.status == 401 and refused.value.code == "unauthorized"


async def test_an_unreadable_token_file_is_a_503_not_a_way_in(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token_file = tmp_path / "api-token"
    token_file.write_text("good-token")
    source = ensure_token_file(ColonySettings(data_dir=tmp_path))
    app = create_app(services(bb, "unreadable", source))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:
        auth = {"Authorization": "Bearer good-token"}
        assert (await client.get("/v1/agents", headers=auth)).status_code == 200
        token_file.unlink()
        token_file.mkdir()  # now a folder: reading it fails
        broken = await client.get("/v1/agents", headers=auth)
        assert broken.status_code == 503 and str(token_file) in broken.json()["error"]["message"]


async def test_the_metrics_token_opens_metrics_and_nothing_else(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`api.metrics_token` (what a Prometheus ServiceMonitor holds) reads /metrics only: every other
    route refuses it; the API token still reads /metrics; the env variable is re-read per request."""
    from colony.wire.token import METRICS_TOKEN_ENV

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(METRICS_TOKEN_ENV, raising=False)
    settings = ColonySettings(data_dir=tmp_path, api_token="api-T", api={"metrics_token": "scrape-T"})
    source = TokenSource.from_settings(settings)
    app = create_app(services(bb, f"met{uuid.uuid4().hex[:8]}", source), api=settings.api)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as client:

        async def code(method: str, path: str, token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return (await client.request(method, path, headers=headers, json={"agent": "echo"})).status_code

        assert await code("GET", "/metrics", "scrape-T") == 200
        assert await code("GET", "/metrics", "api-T") == 200
        assert await code("GET", "/metrics", "scrape-T-x") == 401
        routes = [
            (method, concrete(route.path))
            for route in app.routes
            if isinstance(route, APIRoute) and route.path not in ("/healthz", "/metrics")
            and not route.path.startswith("/ui")  # the console's files: no data, no token
            for method in sorted(route.methods or {"GET"})
            if method != "HEAD"
        ]
        assert len(routes) > 5
        for method, path in routes:
            assert await code(method, path, "scrape-T") == 401, (method, path)
        monkeypatch.setenv(METRICS_TOKEN_ENV, "rotated-T")  # a Secret as env, rotated: read per request
        assert await code("GET", "/metrics", "rotated-T") == 200
        assert await code("GET", "/metrics", "scrape-T") == 401
    # without a metrics token configured, only the API token reads /metrics
    plain = TokenSource.from_settings(ColonySettings(data_dir=tmp_path, api_token="api-T"))
    monkeypatch.delenv(METRICS_TOKEN_ENV)
    assert plain.accepts_for_metrics("Bearer api-T") and not plain.accepts_for_metrics("Bearer ")


async def test_under_a_route_prefix_the_open_and_metrics_only_routes_stay_what_they_are(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serve mounts the app under its route prefix with `root_path` set and the full path kept: the
    guard matches /healthz and /metrics inside the app, as the router does."""
    from colony.wire.token import METRICS_TOKEN_ENV

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(METRICS_TOKEN_ENV, raising=False)
    settings = ColonySettings(data_dir=tmp_path, api_token="api-T", api={"metrics_token": "scrape-T"})
    app = create_app(services(bb, f"pre{uuid.uuid4().hex[:8]}", TokenSource.from_settings(settings)))
    transport = httpx.ASGITransport(app=app, root_path="/colony")
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        scrape = {"Authorization": "Bearer scrape-T"}
        assert (await client.get("/colony/healthz")).status_code == 200
        assert (await client.get("/colony/metrics", headers=scrape)).status_code == 200
        assert (await client.get("/colony/v1/agents", headers=scrape)).status_code == 401
        assert (await client.get("/colony/v1/agents")).status_code == 401
        api = {"Authorization": "Bearer api-T"}
        assert (await client.get("/colony/v1/agents", headers=api)).status_code == 200
        assert (await client.get("/colonyx/metrics", headers=scrape)).status_code == 401
