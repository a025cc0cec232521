"""The HTTP API: submit runs, stream their events (SSE), read results, list agents, health, metrics.

Stateless: every fact is read from Redis through the RunService and the AgentRegistry, so any
API replica answers for any run, and a restarted one has lost nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from colony import __version__, metrics
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlackboardUnavailable,
    ColonyError,
    PathNotAllowed,
    ReplicaUnavailable,
    ResourceExhausted,
    RunNotFound,
    SourceTooLarge,
)
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService, RunView
from colony.vcm import PageSource, PageTable

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 1024 * 1024


class SubmitRun(BaseModel):
    agent: str = Field(min_length=1, max_length=200)
    input: Any = None
    namespace: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    timeout_s: float | None = Field(None, gt=0, le=86_400)
    pages: list[str] | None = None


class MapSource(BaseModel):
    path: str = Field(min_length=1, description="a folder (or git checkout) readable by the API replica")
    page_tokens: int = Field(2048, ge=64, le=1_000_000)


class SubmittedRun(BaseModel):
    run_id: str
    status: str
    events_url: str


class AgentControl(Protocol):
    """Suspend/resume agents (the control plane, in-process or a Serve deployment)."""

    async def suspend(self, agent_id: str) -> Any: ...

    async def resume(self, agent_id: str) -> Any: ...


@dataclass
class ApiServices:
    runs: RunService
    registry: AgentRegistry
    token: str | None
    pages: PageTable | None = None
    control: AgentControl | None = None


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message}})


ServicesProvider = Callable[[], Awaitable[ApiServices]]


def create_app(services: ApiServices | ServicesProvider) -> FastAPI:
    """The API over `services` (or an async provider of them, for processes that build them
    lazily, like a Serve replica whose Redis client must be created in its own event loop)."""

    async def svc() -> ApiServices:
        return services if isinstance(services, ApiServices) else await services()

    app = FastAPI(
        title="Colony",
        version=__version__,
        description="Submit agent runs, stream their events, read results.",
    )

    async def authorized(authorization: str | None = Header(None)) -> None:
        token = (await svc()).token
        if token is None:
            return
        expected = f"Bearer {token}"
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected.encode()):
            raise StarletteHTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)")

    @app.middleware("http")
    async def limits_and_metrics(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            response: Response = _error(413, "body_too_large", f"request body over {MAX_BODY_BYTES} bytes")
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        metrics.HTTP_REQUESTS.labels(template, request.method, str(response.status_code)).inc()
        metrics.HTTP_REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        return _error(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}"
            for err in exc.errors()
        )
        return _error(422, "invalid_request", problems)

    @app.exception_handler(ColonyError)
    async def colony_error(request: Request, exc: ColonyError) -> JSONResponse:
        if isinstance(exc, AgentNotFound | RunNotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, AgentStateConflict):
            return _error(409, "conflict", str(exc))
        if isinstance(exc, PathNotAllowed):
            return _error(403, "forbidden", str(exc))
        if isinstance(exc, SourceTooLarge):
            return _error(413, "too_large", str(exc))
        if isinstance(exc, BlackboardUnavailable | ReplicaUnavailable | ResourceExhausted):
            return _error(503, "unavailable", str(exc))
        return _error(400, "bad_request", str(exc))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def prometheus() -> Response:
        services = await svc()
        metrics.REPLICA_STATS.snapshot = await replicas_of(services)
        metrics.REPLICA_STATS.published = await published_of(services)
        counts: dict[str, int] = {}
        for record in await services.registry.list():
            counts[record.state] = counts.get(record.state, 0) + 1
        for state in ("initialized", "running", "waiting", "idle", "suspended", "stopped", "failed"):
            metrics.AGENTS.labels(state).set(counts.get(state, 0))
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/runs", status_code=202, response_model=SubmittedRun, dependencies=[Depends(authorized)])
    async def submit(body: SubmitRun) -> SubmittedRun:
        kwargs: dict[str, Any] = {"timeout_s": body.timeout_s, "pages": body.pages}
        if body.namespace:
            kwargs["namespace"] = body.namespace
        record = await (await svc()).runs.submit(body.agent, body.input, **kwargs)
        return SubmittedRun(
            run_id=record.run_id, status="queued", events_url=f"/v1/runs/{record.run_id}/events"
        )

    @app.get("/v1/runs/{run_id}", response_model=RunView, dependencies=[Depends(authorized)])
    async def get_run(run_id: str) -> RunView:
        return await (await svc()).runs.get(run_id)

    @app.post("/v1/runs/{run_id}/cancel", response_model=RunView, dependencies=[Depends(authorized)])
    async def cancel_run(run_id: str) -> RunView:
        return await (await svc()).runs.cancel(run_id)

    @app.get("/v1/runs/{run_id}/events", dependencies=[Depends(authorized)])
    async def run_events(run_id: str, last_event_id: str | None = Header(None)) -> StreamingResponse:
        runs = (await svc()).runs
        await runs.record(run_id)  # 404 before the stream starts

        async def stream() -> AsyncIterator[str]:
            async for event_id, event in runs.events(run_id, last_event_id):
                kind = event.get("event_type", "message")
                yield f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.get("/v1/agents", response_model=list[AgentRecord], dependencies=[Depends(authorized)])
    async def list_agents(state: str | None = None) -> list[AgentRecord]:
        return await (await svc()).registry.list(state=state)

    @app.get("/v1/agents/{agent_id}", response_model=AgentRecord, dependencies=[Depends(authorized)])
    async def get_agent(agent_id: str) -> AgentRecord:
        record = await (await svc()).registry.get(agent_id)
        if record is None:
            raise AgentNotFound(f"no agent named {agent_id!r}")
        return record

    @app.post("/v1/agents/{agent_id}/suspend", response_model=AgentRecord, dependencies=[Depends(authorized)])
    async def suspend_agent(agent_id: str) -> AgentRecord:
        """Suspend an agent (state kept in Redis) until `POST /v1/agents/{id}/resume`."""
        return AgentRecord.model_validate(await (await control()).suspend(agent_id))

    @app.post("/v1/agents/{agent_id}/resume", response_model=AgentRecord, dependencies=[Depends(authorized)])
    async def resume_agent(agent_id: str) -> AgentRecord:
        """Resume a suspended agent now: same id, state restored, on the best replica for its pages."""
        return AgentRecord.model_validate(await (await control()).resume(agent_id))

    async def control() -> AgentControl:
        services = await svc()
        if services.control is None:
            raise StarletteHTTPException(404, "this deployment has no control plane")
        return services.control

    @app.post("/v1/vcm/sources", dependencies=[Depends(authorized)])
    async def map_source(body: MapSource) -> dict[str, Any]:
        """Cut a folder into pages and record them in the page table."""
        table = await page_table()
        source = PageSource(body.path, page_tokens=body.page_tokens)
        record = await table.map_source(source)
        pages = [await table.page(page_id) for page_id in record.page_ids]
        return {
            "source_id": record.source_id,
            "path": record.path,
            "pages": [p.model_dump() for p in pages if p],
        }

    @app.get("/v1/vcm/pages", dependencies=[Depends(authorized)])
    async def list_pages(replica: str | None = None) -> list[dict[str, Any]]:
        table = await page_table()
        return [p.model_dump() for p in await table.pages(replica=replica)]

    async def page_table() -> PageTable:
        services = await svc()
        if services.pages is None:
            raise StarletteHTTPException(404, "this deployment has no virtual context memory")
        return services.pages

    @app.get("/v1/replicas", dependencies=[Depends(authorized)])
    async def list_replicas() -> list[dict[str, Any]]:
        return await replicas_of(await svc())

    return app


async def replicas_of(services: ApiServices) -> list[dict[str, Any]]:
    """Live replicas (their heartbeats carry engine stats and agent counts)."""
    return await services.registry.replicas()


async def published_of(services: ApiServices) -> list[dict[str, Any]]:
    """The counters each live process published, plus this process's own (latest wins)."""
    found = {p["process"]: p for p in await services.registry.publications()}
    own = metrics.published_counters()
    found[str(own["process"])] = own
    return list(found.values())
