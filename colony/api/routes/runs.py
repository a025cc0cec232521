"""Runs: submit (and optionally stream or wait in the same request), read, cancel, and follow a
run's events as server-sent events (colony.api.event_stream)."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse

from colony.api.access import principal_of
from colony.api.deps import GUARDED, Context
from colony.api.errors import InvalidLastEventId
from colony.api.event_stream import EventStreamResponse, event_stream, wait_for_end
from colony.api.idempotency import keyed_run_id
from colony.api.params import RunId
from colony.api.schemas import EVENTS, LISTING, RUN_ONE, SSE_EVENT, SUBMIT, SUBMIT_STREAM
from colony.api.tenancy import admitted, named_agent, tenant_agent
from colony.api.tenant_pages import check_pages
from colony.api.wake import wake_agent
from colony.errors import BlackboardUnavailable, InvalidArgument, RunNotFound
from colony.system.run_listing import MAX_LIMIT, RunList, runs_of
from colony.system.run_tree import RunTree, hide_others
from colony.system.runs import RunView
from colony.wire.ids import ID_PATTERN
from colony.wire.input_check import check_input
from colony.wire.runs import SubmitRun, SubmittedRun

log = logging.getLogger(__name__)
EVENT_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
router = APIRouter(dependencies=GUARDED)


def _event_id_schema(schema: dict[str, Any]) -> None:
    """A header is absent or a string: the document says so (not `null`, which a header cannot be)."""
    schema.pop("anyOf", None)
    schema.update({"type": "string", "pattern": EVENT_ID.pattern})


LastEventId = Annotated[
    str | None,
    Header(
        description="resume after this event id (`<ms>-<seq>`, from an `id:` line); else 400",
        json_schema_extra=_event_id_schema,  # checked in the route: a 400, not a 422
    ),
]


@router.post(
    "/v1/runs", status_code=202, response_model=SubmittedRun, responses={**SUBMIT, 200: SUBMIT_STREAM}
)
async def submit(
    body: SubmitRun, ctx: Context, request: Request
) -> SubmittedRun | StreamingResponse | Response:
    """Submit a run. Sent with an Idempotency-Key, its run id derives from the key (`effect_key`):
    a retry whose first try submitted the run and then answered 5xx gets that run, not a second."""
    try:
        check_input(body.input, ctx.api.max_input_depth)
    except ValueError as exc:  # too deep, NaN/Infinity, invalid Unicode: not stored (422)
        raise InvalidArgument(str(exc)) from None
    kwargs: dict[str, Any] = {"timeout_s": body.timeout_s, "pages": body.pages}
    if body.namespace:
        kwargs["namespace"] = body.namespace
    runs = (await ctx.services()).runs
    # another tenant's token: counted against its quotas first, before anything is read (429)
    async with admitted(ctx, request, keyed_run_id(request), body.timeout_s) as run_id:
        if run_id is not None:
            kwargs["run_id"] = run_id
        # another tenant's, or an agent a token is not given: 404, as for no such agent; a catalog
        # name from another tenant's token: that tenant's own instance (placed on first use)
        agent = await tenant_agent(ctx, request, body.agent)
        await check_pages(ctx, request, body.pages)  # another tenant's token: its own folders' pages
        await wake_agent(ctx, agent)  # suspended to make room: resumed first (bounded; else 503)
        record = await runs.submit(agent, body.input, **kwargs)
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


async def visible_run(run_id: RunId, ctx: Context, request: Request) -> None:
    """A run of an agent the request's token does not see (another tenant's, or not given it) is no
    run it can see (404)."""
    principal = principal_of(request)
    if principal is not None:
        record = await (await ctx.services()).runs.record(run_id)
        if not principal.sees(record.agent):
            raise RunNotFound(f"no run {run_id!r}")


VISIBLE_RUN = [Depends(visible_run)]


@router.get("/v1/runs", response_model=RunList, responses=LISTING)
async def list_runs(
    request: Request,
    ctx: Context,
    agent: Annotated[
        str, Query(min_length=1, max_length=128, pattern=ID_PATTERN, description="the agent whose runs")
    ],
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="runs listed, newest first")] = 50,
) -> RunList:
    """The runs submitted over HTTP to `agent` that are still kept (`runs.retention_seconds`),
    newest first, with their state (no output: `GET /v1/runs/{id}` has it)."""
    agent = named_agent(request, agent)  # another tenant's token: `echo` is its own instance
    return await runs_of((await ctx.services()).runs, agent, limit)


@router.get("/v1/runs/{run_id}", response_model=RunView, responses=RUN_ONE, dependencies=VISIBLE_RUN)
async def get_run(run_id: RunId, ctx: Context) -> RunView:
    return await (await ctx.services()).runs.get(run_id)


@router.get("/v1/runs/{run_id}/tree", response_model=RunTree, responses=RUN_ONE, dependencies=VISIBLE_RUN)
async def run_tree(run_id: RunId, ctx: Context, request: Request) -> RunTree:
    """The run and every request made while it was served (children, their children, ...), each
    with its agent, state and times: the runs of one job seen together. A token given some agents
    sees the runs of others in it as `(another agent)`, with their state only."""
    tree = await (await ctx.services()).runs.tree(run_id)
    principal = principal_of(request)
    if principal is not None:
        hide_others(tree.root, principal.sees)
    return tree


@router.post("/v1/runs/{run_id}/cancel", response_model=RunView, responses=RUN_ONE, dependencies=VISIBLE_RUN)
async def cancel_run(run_id: RunId, ctx: Context) -> RunView:
    return await (await ctx.services()).runs.cancel(run_id)


@router.get(
    "/v1/runs/{run_id}/events",
    dependencies=VISIBLE_RUN,
    response_class=EventStreamResponse,
    responses={200: {"content": {"text/event-stream": {"schema": SSE_EVENT}}}, **EVENTS},
)
async def run_events(run_id: RunId, ctx: Context, last_event_id: LastEventId = None) -> StreamingResponse:
    runs = (await ctx.services()).runs
    if last_event_id is not None and not EVENT_ID.match(last_event_id):
        raise InvalidLastEventId(
            f"Last-Event-ID {last_event_id[:40]!r} is not an event id: send the `id:` of an event "
            "this stream sent (<ms>-<seq>), or no Last-Event-ID to start from the beginning"
        )
    # 404 (no run), 410 (retired) and 400 (an id past the run's newest event) before the stream starts
    try:
        record = await runs.check_event_id(run_id, last_event_id)
    except InvalidArgument as exc:  # an id the run's stream never handed out: as a malformed one
        raise InvalidLastEventId(str(exc)) from None
    return event_stream(runs, run_id, last_event_id, record, {})
