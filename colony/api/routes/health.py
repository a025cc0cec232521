"""Health and metrics: `/healthz` (no token: a load balancer's probe) and the Prometheus
`/metrics`, which sums what every process of the cluster published."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import REGISTRY, generate_latest
from pydantic import Field

from colony import __version__, metrics
from colony.api.deps import GUARDED, ApiServices, Context
from colony.api.errors import AsciiJSON
from colony.api.schemas import NO_PARAMS, Health

HEALTH_PING_SECONDS = 1.0  # /healthz answers within about this long, Redis away or not
router = APIRouter()  # per route: /healthz needs no token


class PrometheusResponse(Response):
    media_type = "text/plain"


class HealthReport(Health):
    """`ok`, or `degraded` (HTTP 503) with the reason while Redis does not answer."""

    status: str = Field(description="`ok`, or `degraded` while Redis does not answer")
    reason: str | None = Field(None, description="why the API is degraded (absent when `ok`)")


@router.get(
    "/healthz",
    response_model=HealthReport,
    response_model_exclude_none=True,
    responses={503: {"model": HealthReport, "description": "degraded: Redis does not answer"}},
)
async def healthz(ctx: Context) -> Any:
    """Liveness and readiness: pings Redis with a short timeout (no token needed)."""
    try:
        async with asyncio.timeout(HEALTH_PING_SECONDS):
            board = (await ctx.services()).runs.api_board
            await board.redis.ping()
    except Exception as exc:  # any failure to reach Redis in time: degraded, with the reason
        # the kind of failure only: this route needs no token, so it names no address
        reason = (
            f"Redis did not answer within {HEALTH_PING_SECONDS}s"
            if isinstance(exc, TimeoutError)
            else f"Redis unavailable ({type(exc).__name__})"
        )
        return AsciiJSON(
            status_code=503, content={"status": "degraded", "version": __version__, "reason": reason}
        )
    return {"status": "ok", "version": __version__}


@router.get(
    "/metrics",
    dependencies=GUARDED,
    response_class=PrometheusResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **NO_PARAMS},
)
async def prometheus(ctx: Context) -> Response:
    services = await ctx.services()
    metrics.REPLICA_STATS.snapshot = await services.registry.replicas()
    metrics.REPLICA_STATS.published = await published_of(services)
    counts: dict[str, int] = {}
    for record in await services.registry.list():
        counts[record.state] = counts.get(record.state, 0) + 1
    for state in ("initialized", "running", "waiting", "idle", "suspended", "stopped", "failed"):
        metrics.AGENTS.labels(state).set(counts.get(state, 0))
    return PrometheusResponse(generate_latest(REGISTRY))


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
