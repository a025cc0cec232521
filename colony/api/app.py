"""The HTTP API: submit runs, stream their events (SSE), read results, list agents, health, metrics.

Stateless: every fact is read from Redis through the RunService and the AgentRegistry, so any
API replica answers for any run, and a restarted one has lost nothing. Guarded before any route
runs (colony.api.limits: the bearer token, read at run time by colony.wire.token, then the body
limit; then colony.api.idempotency: a write's Idempotency-Key); the routes live in
colony.api.routes (one module per resource), what they are given in colony.api.deps, how errors
are answered in colony.api.errors; what each route accepts and answers is declared in
colony.api.schemas and checked against the OpenAPI document by tests/test_api_contract.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi

from colony import __version__
from colony.api.deps import ApiContext, ApiServices, ServicesProvider
from colony.api.errors import install_error_handlers
from colony.api.http_metrics import RequestMetricsMiddleware
from colony.api.idempotency import IdempotencyMiddleware
from colony.api.limits import GuardMiddleware
from colony.api.mcp_door import mounted_app
from colony.api.routes import ROUTERS
from colony.config import ApiSettings
from colony.errors import ConfigError
from colony.wire.token import TokenSource

__all__ = ["ApiServices", "create_app"]


def create_app(
    services: ApiServices | ServicesProvider,
    *,
    token: str | TokenSource | None = None,
    api: ApiSettings | None = None,
    max_import_bytes: int | None = None,
) -> FastAPI:
    """The API over `services` (or an async provider of them, for processes that build them
    lazily, like a Serve replica whose Redis client must be created in its own event loop).

    Every route but `/healthz`, the console's files (`/ui/`) and the docs when `api.public_docs`
    needs the bearer token: `token`,
    else `services.token`. There is no way to build the app without one (ConfigError).
    Body limits (colony.api.limits.body_limit): `POST /v1/agents/{id}/import` takes up to
    `api.max_import_bytes`, and never more than `max_import_bytes` (`context.max_export_bytes`);
    every other body `api.max_body_bytes`."""
    api = api or ApiSettings()
    if token is None and isinstance(services, ApiServices):
        token = services.token
    if token is None or token == "":
        raise ConfigError("the API needs a token: pass token= (a string or a TokenSource)")
    context = ApiContext(
        provider=_provider(services),
        api=api,
        token=token if isinstance(token, TokenSource) else TokenSource.fixed(token),
    )
    app = FastAPI(
        title="Colony",
        version=__version__,
        description="Submit agent runs, stream their events, read results. "
        "Every route but /healthz and the console's files (/ui/) needs `Authorization: Bearer <token>`.",
    )
    app.state.colony = context  # what colony.api.deps.api_context hands the routes
    app.add_middleware(  # inside the guard: a key is looked at once the token and body passed
        IdempotencyMiddleware,  # type: ignore[arg-type]
        services=context.provider,
        ttl_seconds=api.idempotency_ttl_seconds,
    )
    app.add_middleware(
        GuardMiddleware,  # type: ignore[arg-type]
        tokens=context.tokens,
        max_body_bytes=api.max_body_bytes,
        public_docs=api.public_docs,
        import_body_bytes=min(api.max_import_bytes, max_import_bytes or api.max_import_bytes),
        access=context.access,
        routes=app.router.routes,  # (the routers are included below: the list is read per request)
    )
    app.add_middleware(RequestMetricsMiddleware)  # type: ignore[arg-type]  # outermost: sees 401/413 too
    install_error_handlers(app)
    app.openapi = _json_errors_openapi(app)  # type: ignore[method-assign]
    for router in ROUTERS:
        _include(app, router)
    app.mount("/mcp", mounted_app(app, context))  # the MCP server (docs/clients.md), same token
    return app


def _include(app: FastAPI, router: APIRouter) -> None:
    """`app.include_router(router)` as FastAPI did it before 0.137: the router's routes join the
    app's own list. Since 0.137 an included router is matched through on every request, about
    200 more Python calls a request for a run route and 1000 for a session route (the later a
    router, the more); these routers have no prefix and their routes carry the router's
    dependencies already, so nothing else of an inclusion applies. (`app.dependency_overrides`
    does not reach them; nothing here uses it.)"""
    app.router.routes.extend(router.routes)


def _provider(services: ApiServices | ServicesProvider) -> ServicesProvider:
    if not isinstance(services, ApiServices):
        return services

    async def fixed() -> ApiServices:
        return services

    return fixed


def _json_errors_openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI files an error response of a text route (SSE, Prometheus) under the route's media
    type; errors are JSON on every route, so the document says so."""

    def openapi() -> dict[str, Any]:
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

    return openapi
