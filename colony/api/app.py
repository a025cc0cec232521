"""The HTTP API: submit runs, stream their events (SSE), read results, list agents, health, metrics.

Stateless: every fact is read from Redis through the RunService and the AgentRegistry, so any
API replica answers for any run, and a restarted one has lost nothing. Guarded before any route
runs (colony.api.limits: the bearer token, read at run time by colony.wire.token, then the body
limit); what each route accepts and answers is declared in colony.api.schemas and checked against
the OpenAPI document by tests/test_api_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from prometheus_client import REGISTRY, generate_latest
from pydantic import Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from colony import __version__, metrics
from colony.api.block_routes import InvalidBlockInput, add_block_routes
from colony.api.context_routes import add_context_routes
from colony.api.event_stream import EventStreamResponse, event_stream, wait_for_end
from colony.api.http_metrics import RequestMetricsMiddleware
from colony.api.limits import GuardMiddleware
from colony.api.memory_routes import InvalidMemoryInput, MemoryScopeNotFound, add_memory_routes
from colony.api.schemas import (
    CONTROL,
    EVENTS,
    LISTING,
    MAP_SOURCE,
    NO_PARAMS,
    PAGES,
    READ_ONE,
    SSE_EVENT,
    SUBMIT,
    SUBMIT_STREAM,
    AgentStateName,
    CatalogAgent,
    Health,
    MappedSource,
    MapSource,
)
from colony.api.session_routes import add_session_routes
from colony.api.transfer_routes import add_transfer_routes
from colony.config import ApiSettings, ColonySettings, VcmSettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlackboardUnavailable,
    BlockAccessDenied,
    BlockEditRejected,
    BlockExists,
    BlockNotFound,
    BlockVersionConflict,
    CheckpointNotFound,
    ColonyError,
    ConfigError,
    ImportRejected,
    InvalidArgument,
    MessageNotFound,
    NoActiveBranch,
    NothingToUndo,
    PathNotAllowed,
    ReplicaUnavailable,
    ResourceExhausted,
    RunNotFound,
    RunQueueFull,
    SessionNotFound,
    SourceTooLarge,
)
from colony.system.catalog import BUILTIN_AGENTS
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService, RunView
from colony.vcm import PageSource, PageTable
from colony.wire.ids import ID_PATTERN
from colony.wire.input_check import check_input
from colony.wire.runs import SubmitRun, SubmittedRun
from colony.wire.token import TokenSource

log = logging.getLogger(__name__)
EVENT_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="run id")]
AgentId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="agent id")]
bearer = HTTPBearer(auto_error=False, description="the API token (`colony status` prints it)")


def _event_id_schema(schema: dict[str, Any]) -> None:
    """A header is absent or a string: the document says so (not `null`, which a header cannot be)."""
    schema.pop("anyOf", None)
    schema.update({"type": "string", "pattern": EVENT_ID.pattern})


class PrometheusResponse(Response):
    media_type = "text/plain"


class AgentControl(Protocol):
    """Suspend/resume agents (the control plane, in-process or a Serve deployment)."""

    async def suspend(self, agent_id: str) -> Any: ...

    async def resume(self, agent_id: str) -> Any: ...

    async def undo(self, agent_id: str) -> Any: ...

    async def restore(self, agent_id: str, step: int, mode: str, run_id: str | None = None) -> Any: ...


@dataclass
class ApiServices:
    runs: RunService
    registry: AgentRegistry
    token: str | TokenSource | None
    pages: PageTable | None = None
    control: AgentControl | None = None
    vcm: VcmSettings | None = None  # which folders `POST /v1/vcm/sources` may read
    # the process's settings: the user agents of the catalog, memory bounds, the Chroma server;
    # None (library use, tests): defaults for the run service's colony (colony.api.memory_routes)
    settings: ColonySettings | None = None


class _AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: an error message quoting hostile input (a lone surrogate) still encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return _AsciiJSON(
        status_code=status, content={"error": {"code": code, "message": message}}, headers=headers
    )


ServicesProvider = Callable[[], Awaitable[ApiServices]]

HEALTH_PING_SECONDS = 1.0  # /healthz answers within about this long, Redis away or not


class HealthReport(Health):
    """`ok`, or `degraded` (HTTP 503) with the reason while Redis does not answer."""

    status: str = Field(description="`ok`, or `degraded` while Redis does not answer")
    reason: str | None = Field(None, description="why the API is degraded (absent when `ok`)")


def create_app(
    services: ApiServices | ServicesProvider,
    *,
    token: str | TokenSource | None = None,
    api: ApiSettings | None = None,
    max_import_bytes: int | None = None,
) -> FastAPI:
    """The API over `services` (or an async provider of them, for processes that build them
    lazily, like a Serve replica whose Redis client must be created in its own event loop).

    Every route but `/healthz` (and the docs when `api.public_docs`) needs the bearer token: `token`,
    else `services.token`. There is no way to build the app without one (ConfigError).
    `max_import_bytes`: the body limit of `POST /v1/agents/{id}/import` (`context.max_export_bytes`;
    every other body: `api.max_body_bytes`)."""
    api = api or ApiSettings()
    if token is None and isinstance(services, ApiServices):
        token = services.token
    if token is None or token == "":
        raise ConfigError("the API needs a token: pass token= (a string or a TokenSource)")
    tokens = token if isinstance(token, TokenSource) else TokenSource.fixed(token)

    async def svc() -> ApiServices:
        return services if isinstance(services, ApiServices) else await services()

    async def token_source() -> TokenSource:
        return tokens

    app = FastAPI(
        title="Colony",
        version=__version__,
        description="Submit agent runs, stream their events, read results. "
        "Every route but /healthz needs `Authorization: Bearer <token>`.",
    )
    app.add_middleware(
        GuardMiddleware,  # type: ignore[arg-type]
        tokens=token_source,
        max_body_bytes=api.max_body_bytes,
        public_docs=api.public_docs,
        import_body_bytes=max_import_bytes,
    )
    authorized = bearer  # enforced by GuardMiddleware; declared per route for the OpenAPI document

    app.add_middleware(RequestMetricsMiddleware)  # type: ignore[arg-type]  # outermost: sees 401/413 too

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {
            400: "bad_request",
            401: "unauthorized",
            404: "not_found",
            405: "method_not_allowed",
            413: "body_too_large",
        }
        message = str(exc.detail)
        headers = exc.headers
        if exc.status_code == 405:  # every method of the path (the router names only one route's)
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(app, request))}
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body is not valid JSON (UTF-8, at most a few hundred levels deep)"
        # headers kept: a 405 carries `Allow`
        return _error(exc.status_code, codes.get(exc.status_code, "http_error"), message, headers)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        def problem(err: Any) -> str:
            if err.get("type") == "json_invalid":
                detail = (err.get("ctx") or {}).get("error", "")
                return f"body: not valid JSON at character {err['loc'][-1]} ({detail})"
            return f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}"

        return _error(422, "invalid_request", "; ".join(problem(err) for err in exc.errors()))

    @app.exception_handler(InvalidRunInput)
    async def bad_input(request: Request, exc: InvalidRunInput) -> JSONResponse:
        return _error(422, "invalid_request", str(exc))

    @app.exception_handler(InvalidMemoryInput)
    async def bad_memory_input(request: Request, exc: InvalidMemoryInput) -> JSONResponse:
        return _error(422, "invalid_request", str(exc))

    @app.exception_handler(ColonyError)
    async def colony_error(request: Request, exc: ColonyError) -> JSONResponse:
        if isinstance(exc, BlockVersionConflict):  # the head the client should read and redo from
            error = {"code": "version_conflict", "message": str(exc), "current_version": exc.current_version}
            return _AsciiJSON(status_code=409, content={"error": error})
        if isinstance(exc, BlockNotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, BlockAccessDenied):
            return _error(403, "forbidden", str(exc))
        if isinstance(exc, BlockExists):
            return _error(409, "conflict", str(exc))
        if isinstance(exc, BlockEditRejected | InvalidBlockInput):
            return _error(422, "invalid_request", str(exc))
        if isinstance(exc, ImportRejected):
            return _error(422, "invalid_request", str(exc))
        if isinstance(exc, CheckpointNotFound | SessionNotFound | MessageNotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, NothingToUndo | NoActiveBranch):
            return _error(409, "conflict", str(exc))
        if isinstance(exc, AgentNotFound | RunNotFound | MemoryScopeNotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, AgentStateConflict):
            return _error(409, "conflict", str(exc))
        if isinstance(exc, RunQueueFull):
            retry_after = str(max(1, round(exc.retry_after_seconds)))
            return _error(429, "too_many_runs", str(exc), {"Retry-After": retry_after})
        if isinstance(exc, PathNotAllowed):
            return _error(403, "forbidden", str(exc))
        if isinstance(exc, SourceTooLarge):
            return _error(413, "too_large", str(exc))
        if isinstance(exc, BlackboardUnavailable | ReplicaUnavailable | ResourceExhausted):
            return _error(503, "unavailable", str(exc))
        return _error(400, "bad_request", str(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        """A bug, not an input problem: logged with its traceback; the client gets the error model."""
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal", f"internal error ({type(exc).__name__}); see the API replica's log")

    def openapi() -> dict[str, Any]:
        """FastAPI files an error response of a text route (SSE, Prometheus) under the route's media
        type; errors are JSON on every route, so the document says so."""
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for status, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        if status[0] in "45" and "application/json" not in content and content:
                            response["content"] = {"application/json": next(iter(content.values()))}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get(
        "/healthz",
        response_model=HealthReport,
        response_model_exclude_none=True,
        responses={503: {"model": HealthReport, "description": "degraded: Redis does not answer"}},
    )
    async def healthz() -> Any:
        """Liveness and readiness: pings Redis with a short timeout (no token needed)."""
        try:
            async with asyncio.timeout(HEALTH_PING_SECONDS):
                board = (await svc()).runs.api_board
                await board.redis.ping()
        except Exception as exc:  # any failure to reach Redis in time: degraded, with the reason
            # the kind of failure only: this route needs no token, so it names no address
            reason = (
                f"Redis did not answer within {HEALTH_PING_SECONDS}s"
                if isinstance(exc, TimeoutError)
                else f"Redis unavailable ({type(exc).__name__})"
            )
            return _AsciiJSON(
                status_code=503, content={"status": "degraded", "version": __version__, "reason": reason}
            )
        return {"status": "ok", "version": __version__}

    @app.get(
        "/metrics",
        dependencies=[Depends(authorized)],
        response_class=PrometheusResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **NO_PARAMS},
    )
    async def prometheus() -> Response:
        services = await svc()
        metrics.REPLICA_STATS.snapshot = await replicas_of(services)
        metrics.REPLICA_STATS.published = await published_of(services)
        counts: dict[str, int] = {}
        for record in await services.registry.list():
            counts[record.state] = counts.get(record.state, 0) + 1
        for state in ("initialized", "running", "waiting", "idle", "suspended", "stopped", "failed"):
            metrics.AGENTS.labels(state).set(counts.get(state, 0))
        return PrometheusResponse(generate_latest(REGISTRY))

    @app.post(
        "/v1/runs",
        status_code=202,
        response_model=SubmittedRun,
        dependencies=[Depends(authorized)],
        responses={**SUBMIT, 200: SUBMIT_STREAM},
    )
    async def submit(body: SubmitRun) -> SubmittedRun | StreamingResponse | Response:
        try:
            check_input(body.input, api.max_input_depth)
        except ValueError as exc:
            raise InvalidRunInput(str(exc)) from None
        kwargs: dict[str, Any] = {"timeout_s": body.timeout_s, "pages": body.pages}
        if body.namespace:
            kwargs["namespace"] = body.namespace
        runs = (await svc()).runs
        record = await runs.submit(body.agent, body.input, **kwargs)
        events_url = f"/v1/runs/{record.run_id}/events"
        if body.stream:  # submit and stream in one request: the events from the run's first one
            headers = {"Colony-Run-Id": record.run_id, "Content-Location": events_url}
            return event_stream(runs, record.run_id, None, record, headers)
        if body.wait_s is not None:  # submit and wait for the end in one request
            try:
                ended = await wait_for_end(runs, record, body.wait_s)
            except BlackboardUnavailable as exc:  # the run exists: answered as submitted, not 503
                log.warning("run %s: waiting for its end stopped (%s); answered 202", record.run_id, exc)
                ended = None
            if ended is not None:
                headers = {"Colony-Run-Id": record.run_id, "Content-Location": f"/v1/runs/{record.run_id}"}
                # as FastAPI renders GET /v1/runs/{id} (pydantic: NaN and infinities as null)
                return Response(ended.model_dump_json(), media_type="application/json", headers=headers)
        return SubmittedRun(run_id=record.run_id, status="queued", events_url=events_url)

    @app.get(
        "/v1/runs/{run_id}", response_model=RunView, dependencies=[Depends(authorized)], responses=READ_ONE
    )
    async def get_run(run_id: RunId) -> RunView:
        return await (await svc()).runs.get(run_id)

    @app.post(
        "/v1/runs/{run_id}/cancel",
        response_model=RunView,
        dependencies=[Depends(authorized)],
        responses=READ_ONE,
    )
    async def cancel_run(run_id: RunId) -> RunView:
        return await (await svc()).runs.cancel(run_id)

    @app.get(
        "/v1/runs/{run_id}/events",
        dependencies=[Depends(authorized)],
        response_class=EventStreamResponse,
        responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}}}, **EVENTS},
    )
    async def run_events(
        run_id: RunId,
        last_event_id: Annotated[
            str | None,
            Header(
                description="resume after this event id (`<ms>-<seq>`, from an `id:` line); else 400",
                json_schema_extra=_event_id_schema,  # checked below: a 400, not a 422
            ),
        ] = None,
    ) -> StreamingResponse:
        runs = (await svc()).runs
        if last_event_id is not None and not EVENT_ID.match(last_event_id):
            raise InvalidArgument(
                f"Last-Event-ID {last_event_id[:40]!r} is not an event id: send the `id:` of an event "
                "this stream sent (<ms>-<seq>), or no Last-Event-ID to start from the beginning"
            )
        # 404 (no run) and 400 (an id past the run's newest event) before the stream starts
        record = await runs.check_event_id(run_id, last_event_id)
        return event_stream(runs, run_id, last_event_id, record, {})

    @app.get(
        "/v1/agents", response_model=list[AgentRecord], dependencies=[Depends(authorized)], responses=LISTING
    )
    async def list_agents(state: AgentStateName | None = None) -> list[AgentRecord]:
        return await (await svc()).registry.list(state=state)

    # before /v1/agents/{agent_id}: routes match in order, so this path is the catalog even if an
    # agent were named "catalog" (that agent's record: GET /v1/agents; its memory and control
    # routes are unaffected)
    @app.get(
        "/v1/agents/catalog",
        response_model=list[CatalogAgent],
        response_model_exclude_none=True,
        dependencies=[Depends(authorized)],
        responses=NO_PARAMS,
    )
    async def agent_catalog() -> list[CatalogAgent]:
        """Every agent the colony starts with: the built-ins, then the user agents of the `agents:`
        settings, with role, type, state and replica once placed (read from the registry: the API
        never imports a user agent's package)."""
        services = await svc()
        users = services.settings.agents if services.settings is not None else {}
        listed = [(name, "builtin", None) for name in BUILTIN_AGENTS]
        listed += [(name, "user", path) for name, path in users.items() if name not in BUILTIN_AGENTS]
        catalog = []
        for name, kind, factory in listed:
            record = await services.registry.get(name)
            catalog.append(
                CatalogAgent(
                    name=name,
                    kind=kind,
                    factory=factory,
                    role=record.role if record else None,
                    agent_type=record.agent_type if record else None,
                    state=record.state if record else None,
                    replica=record.replica if record else None,
                )
            )
        return catalog

    @app.get(
        "/v1/agents/{agent_id}",
        response_model=AgentRecord,
        dependencies=[Depends(authorized)],
        responses=READ_ONE,
    )
    async def get_agent(agent_id: AgentId) -> AgentRecord:
        record = await (await svc()).registry.get(agent_id)
        if record is None:
            raise AgentNotFound(f"no agent named {agent_id!r}")
        return record

    @app.post(
        "/v1/agents/{agent_id}/suspend",
        response_model=AgentRecord,
        dependencies=[Depends(authorized)],
        responses=CONTROL,
    )
    async def suspend_agent(agent_id: AgentId) -> AgentRecord:
        """Suspend an agent (state kept in Redis) until `POST /v1/agents/{id}/resume`."""
        return AgentRecord.model_validate(await (await control()).suspend(agent_id))

    @app.post(
        "/v1/agents/{agent_id}/resume",
        response_model=AgentRecord,
        dependencies=[Depends(authorized)],
        responses=CONTROL,
    )
    async def resume_agent(agent_id: AgentId) -> AgentRecord:
        """Resume a suspended agent now: same id, state restored, on the best replica for its pages."""
        return AgentRecord.model_validate(await (await control()).resume(agent_id))

    async def control() -> AgentControl:
        services = await svc()
        if services.control is None:
            raise StarletteHTTPException(404, "this deployment has no control plane")
        return services.control

    @app.post(
        "/v1/vcm/sources",
        response_model=MappedSource,
        dependencies=[Depends(authorized)],
        responses=MAP_SOURCE,
    )
    async def map_source(body: MapSource) -> dict[str, Any]:
        """Cut a folder into pages and record them in the page table: only under `vcm.allowed_roots`
        (PathNotAllowed: 403), within the caps (SourceTooLarge: 413), walked in a worker thread."""
        table = await page_table()
        vcm = (await svc()).vcm or VcmSettings()  # no settings: no roots, nothing may be mapped
        source = await PageSource.open(body.path, vcm, page_tokens=body.page_tokens)
        record = await table.map_source(source)
        pages = [await table.page(page_id) for page_id in record.page_ids]
        return {
            "source_id": record.source_id,
            "path": record.path,
            "pages": [p.model_dump() for p in pages if p],
        }

    @app.get("/v1/vcm/pages", dependencies=[Depends(authorized)], responses=PAGES)
    async def list_pages(
        replica: Annotated[str | None, Query(min_length=1, max_length=128, pattern=ID_PATTERN)] = None,
    ) -> list[dict[str, Any]]:
        table = await page_table()
        return [p.model_dump() for p in await table.pages(replica=replica)]

    async def page_table() -> PageTable:
        services = await svc()
        if services.pages is None:
            raise StarletteHTTPException(404, "this deployment has no virtual context memory")
        return services.pages

    @app.get("/v1/replicas", dependencies=[Depends(authorized)], responses=NO_PARAMS)
    async def list_replicas() -> list[dict[str, Any]]:
        return await replicas_of(await svc())

    add_memory_routes(app, svc, authorized, api)
    add_block_routes(app, svc, authorized, api)
    add_context_routes(app, svc, authorized, api)
    add_transfer_routes(app, svc, authorized, api)
    add_session_routes(app, svc, authorized, api)
    return app


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """The methods of every route whose path matches the request's (a path served by two routes,
    GET and POST /v1/agents/{id}/memory, answers a 405 with both in `Allow`)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)


class InvalidRunInput(InvalidArgument):
    """A run input the API does not store (too deep, NaN/Infinity, invalid Unicode): 422."""


async def replicas_of(services: ApiServices) -> list[dict[str, Any]]:
    """Live replicas (their heartbeats carry engine stats and agent counts)."""
    return await services.registry.replicas()


async def published_of(services: ApiServices) -> list[Any]:
    """What every process published (colony.metrics validates it), this process's own counted
    from memory: fresh, and once. What this process counts here it also publishes, every time, so
    another API replica answering the next scrape counts at least as much: the sums never go back
    between scrapes (Prometheus would read that as a counter reset), whichever replica answers."""
    own = metrics.published_counters()
    await services.registry.publish(own, "api", force=True)
    found: dict[str, Any] = {}
    for publication in await services.registry.publications(limit=metrics.MAX_PUBLICATIONS):
        process = publication.get("process") if isinstance(publication, dict) else None
        if isinstance(process, str) and process != own["process"]:
            found[process] = publication
    return [own, *found.values()]
