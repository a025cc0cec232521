"""HTTP routes of context management: sessions and their conversation trees (docs/sessions.md).

A session is an agent (its id `session-<16 hex>`, role `session`) that the catalog's `session`
agent places (`POST /v1/sessions` runs it); its AGENT scope holds the conversation tree
(colony.context.sessions). A turn (`POST /v1/sessions/{id}/messages`) is a run of the session's
agent whose events come back as server-sent events: `turn` (the run id), `user_chat_message` (the
stored user message), `token` (each piece of the reply as the model writes it), then `message` (the
stored reply and the ids of the messages its prompt held) or `error`. Revert, fork and switch change
the tree here, in the API process, under the same optimistic concurrency the agent uses.

A session agent suspended to make room (room on demand, colony.system.placement) is resumed by
its next message (colony.api.wake: the request waits at most `WAKE_SECONDS`, then 503 with
Retry-After). `DELETE /v1/sessions/{id}` removes the session for good: its agent, its tree and
every key of its state (`ControlPlane.delete`); a second DELETE is a 404.

Errors (colony.api.errors): SessionNotFound and MessageNotFound 404, NoActiveBranch 409 (a session
without messages has no branch to revert), SessionStartFailed and AgentNotResumed 503 (the latter
with Retry-After), any other refused argument (bounds, a taken branch name) 422 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from colony.aio import cancel_and_wait
from colony.api.access import principal_of
from colony.api.deps import GUARDED, ApiContext, ApiServices, Context, settings_of
from colony.api.errors import SessionStartFailed
from colony.api.idempotency import keyed_run_id
from colony.api.params import SessionId
from colony.api.schemas import ErrorBody
from colony.api.tenancy import admitted, check_agent_quota, tenant_agent
from colony.api.tenant_pages import check_pages
from colony.api.wake import wake, wake_agent
from colony.context.sessions import SESSION_ROLE, SessionStore, is_session_id
from colony.context.tree import BRANCH_PATTERN, MESSAGE_ID_PATTERN, Message, TreeHead, path_lengths
from colony.errors import AgentNotFound, ColonyError, InvalidArgument, SessionNotFound, TenantQuotaExceeded
from colony.system.builtin import MAX_SESSION_PAGES, PAGE_ID
from colony.system.registry import AgentRecord
from colony.system.runs import ENDED_STATUSES, RunRecord

STARTER = "session"  # the catalog agent that places session agents
# a start the starter refused for its input (colony.system.builtin.SessionStarterCapability._known):
# the run's error reads "start_session failed: InvalidArgument: <message>"
REFUSED = re.compile(r"^start_session failed: InvalidArgument: (.+)$", re.S)
QUOTA = re.compile(r"^start_session failed: TenantQuotaExceeded: (.+)$", re.S)
START_TIMEOUT_S = 60.0  # placing a session agent: a replica may be starting
TERMINAL = frozenset({"completed", "failed", "cancelled"})
PASSED_ON = frozenset({"user_chat_message", "prompt_context", "token", "restarted"})
DEFAULT_PAGE = 1000  # messages a listing returns unless `limit` says otherwise
MAX_PAGE = 10_000  # the most `limit` may ask for (a message is up to session_max_message_chars)
KEEP_AWAKE_SECONDS = 2.0  # a waiting turn checks this often that its session was not suspended
KEEP_AWAKE_CHECKS = 30  # and this many times at most
log = logging.getLogger(__name__)
router = APIRouter(dependencies=GUARDED)


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "the body is not JSON",
        401: "missing or wrong bearer token",
        404: (
            "no such session (or message in it, or, for a revert, on its active branch); "
            "or no `session` agent in the colony"
        ),
        409: (
            "the session has no active branch (it has no messages yet); for a message: the "
            "session was suspended by request (resume it first)"
        ),
        403: "the token may not do this (a turn needs the `run` verb: docs/api.md, Scoped tokens)",
        413: "the request body is too large (api.max_body_bytes)",
        422: "a parameter or body field is invalid; the message names it",
        429: "its tenant's quota (runs per second, open runs) is spent: retry after Retry-After",
        503: (
            "Redis or a replica is unavailable, or the session's agent is suspended and could not "
            "be resumed in time (Retry-After); retry later"
        ),
    }
    return {status: {"model": ErrorBody, "description": what[status]} for status in statuses}


SESSION_READ = _errors(401, 404, 422, 503)
SESSION_SEND = _errors(400, 401, 404, 422, 503)  # a route with a body: one that is not JSON is a 400
SESSION_TURN = _errors(400, 401, 403, 404, 409, 413, 422, 429, 503)
SESSION_CHANGE = _errors(400, 401, 404, 409, 422, 503)
SESSION_DELETE = _errors(401, 404, 422, 503)


class SessionStart(BaseModel):
    """`POST /v1/sessions` (an empty object or no body: a plain chat)."""

    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route
    pages: list[Annotated[str, Field(max_length=19, pattern=rf"^{PAGE_ID.pattern}$")]] | None = Field(
        None,
        max_length=MAX_SESSION_PAGES,
        description=(
            "page ids of a mapped folder (POST /v1/vcm/sources) the session talks about: its agent is "
            "page-bound (placed on the replica holding them) and every turn's prompt starts with them, "
            "their KV cache reused from the engine's page slots"
        ),
    )


class BranchView(BaseModel):
    name: str
    leaf_id: str | None
    forked_from: str | None
    length: int = Field(description="messages on the branch's path")


class SessionView(BaseModel):
    session_id: str
    active: str | None = Field(description="the active branch (None until the first message)")
    branches: list[BranchView]
    messages: int = Field(description="messages in the whole tree, reverted ones included")


class MessageList(BaseModel):
    session_id: str
    active: str | None
    all: bool = Field(description="true: every message of the tree; false: the active branch's path")
    total: int = Field(description="messages in the whole listing (every page)")
    offset: int = Field(description="messages of the listing skipped before this page")
    next_offset: int | None = Field(description="the `offset` of the next page; null on the last")
    messages: list[Message]


class SendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route
    message: str = Field(min_length=1, max_length=1_000_000, description="the user's message")


class RevertBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route
    message_id: str = Field(pattern=MESSAGE_ID_PATTERN, description="the message to go back to")


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route
    message_id: str = Field(pattern=MESSAGE_ID_PATTERN, description="the message the new branch starts from")
    branch: str | None = Field(None, pattern=BRANCH_PATTERN, description="its name (default fork-N)")


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route
    branch: str = Field(pattern=BRANCH_PATTERN)


class TurnStream(StreamingResponse):
    media_type = "text/event-stream"


def session_view(session_id: str, head: TreeHead) -> SessionView:
    kept = list(head.branches.values())
    lengths = path_lengths(head, [b.leaf_id for b in kept])
    branches = [
        BranchView(name=b.name, leaf_id=b.leaf_id, forked_from=b.forked_from, length=length)
        for b, length in zip(kept, lengths, strict=True)
    ]
    return SessionView(
        session_id=session_id, active=head.active, branches=branches, messages=len(head.parents)
    )


def _sse(event_id: str | None, kind: str, data: Any, run_id: str) -> str:
    body = json.dumps({"event_type": kind, "data": data, "request_id": run_id})
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {body}\n\n"


async def session_record(ctx: ApiContext, session_id: str) -> AgentRecord:
    """The session agent's registry record; SessionNotFound unless `session_id` is a registered
    session agent."""
    services = await ctx.services()
    record = await services.registry.get(session_id) if is_session_id(session_id) else None
    if record is None or record.role != SESSION_ROLE:
        raise SessionNotFound(f"no session {session_id[:80]!r} in this colony; POST /v1/sessions starts one")
    return record


async def store_of(ctx: ApiContext, session_id: str, record: AgentRecord | None = None) -> SessionStore:
    """The session's tree; SessionNotFound unless `session_id` is a registered session agent
    (`record`: its record, read already)."""
    if record is None:
        await session_record(ctx, session_id)
    services = await ctx.services()
    runs = services.runs
    return SessionStore.of(
        runs.api_board,
        session_id,
        tenant_id=runs.tenant_id,
        colony_id=runs.colony_id,
        settings=settings_of(services).context,
    )


@router.post(
    "/v1/sessions",
    status_code=201,
    response_model=SessionView,
    responses=SESSION_SEND,
)
async def start_session(request: Request, ctx: Context, body: SessionStart | None = None) -> SessionView:
    """Start a session: the catalog's `session` agent places a session agent (its id is the
    session id) with an empty conversation tree. Sent with an Idempotency-Key, the starter run's
    id derives from the key: a retry after a 503 (the start took too long) waits for the same
    start, never a second session."""
    services = await ctx.services()
    runs = services.runs
    pages = await _known_pages(ctx, body.pages if body is not None else None, services)
    await check_pages(ctx, request, pages)  # another tenant's token: pages of its own folders
    starter = await tenant_agent(ctx, request, STARTER)  # another tenant's: its own starter
    principal = principal_of(request)
    await check_agent_quota(ctx, principal)  # another tenant's: one more agent within its quota
    await wake_agent(ctx, starter)  # suspended to make room (a higher-priority agent came): back first
    start = {"pages": pages} if pages else {}
    async with admitted(ctx, request, keyed_run_id(request), START_TIMEOUT_S) as run_id:
        record = await runs.submit(starter, start, timeout_s=START_TIMEOUT_S, run_id=run_id)
    deadline = time.monotonic() + START_TIMEOUT_S
    view = await runs.get(record.run_id)
    while view.status not in ENDED_STATUSES and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        view = await runs.get(record.run_id)
    output = view.output if isinstance(view.output, dict) else {}
    session_id = output.get("session_id")
    refused = REFUSED.search(view.error or "")
    if view.status == "failed" and refused:  # the starter's own page checks: retrying cannot help
        raise InvalidArgument(refused.group(1))
    over = QUOTA.search(view.error or "")
    if view.status == "failed" and over:  # found by review: a start that lost a race at the cap was a 503
        raise TenantQuotaExceeded(over.group(1), retry_after_seconds=5.0)
    if view.status != "succeeded" or not isinstance(session_id, str):
        raise SessionStartFailed(
            f"the session could not start (run {record.run_id} {view.status}: "
            f"{view.error or 'no session id'}); GET /v1/runs/{record.run_id} for details, and retry"
        )
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.head())


async def _known_pages(ctx: ApiContext, pages: list[str] | None, services: ApiServices) -> list[str]:
    """The session's page ids, each once, every one in the page table and no more than an engine
    holds at once (`engine.page_slots`, an embedded engine's: other kinds hold no fixed number);
    else InvalidArgument (422) naming the field. Whether their tokens leave room for a chat is
    counted by the starter, with the engine's tokenizer (a refusal there is a 422 too)."""
    if not pages:
        return []
    bound = list(dict.fromkeys(pages))
    engine = settings_of(services).engine
    slots = engine.page_slots
    if engine.kind == "embedded" and len(bound) > slots:
        raise InvalidArgument(
            f"pages: {len(bound)} pages but an engine holds at most {slots} at once (engine.page_slots)"
        )
    table = await ctx.page_table()
    for index, page_id in enumerate(bound):
        if await table.page(page_id) is None:
            raise InvalidArgument(
                f"pages[{index}]: no page {page_id!r} in the page table; map its folder first "
                "(POST /v1/vcm/sources)"
            )
    return bound


@router.get("/v1/sessions/{session_id}", response_model=SessionView, responses=SESSION_READ)
async def get_session(session_id: SessionId, ctx: Context) -> SessionView:
    """The session's branches (each with its leaf and length), the active one, its size."""
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.head())


@router.post(
    "/v1/sessions/{session_id}/messages",
    response_class=TurnStream,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}, **SESSION_TURN},
)
async def send_message(
    request: Request, session_id: SessionId, body: SendMessage, ctx: Context
) -> StreamingResponse:
    """One turn: the message goes on the active branch and the reply streams back (SSE:
    `turn`, `user_chat_message`, `token`..., then `message` or `error`). A broken stream can be
    followed at /v1/runs/{run_id}/events (the `turn` event's run id) with Last-Event-ID. A session
    suspended to make room is resumed first (at most `colony.api.wake.WAKE_SECONDS`; then 503 with
    Retry-After)."""
    record = await submit_turn(ctx, request, session_id, body.message)
    runs = (await ctx.services()).runs

    async def stream() -> AsyncIterator[str]:
        yield _sse(None, "turn", {"run_id": record.run_id, "session_id": session_id}, record.run_id)
        watch: asyncio.Task[None] | None = asyncio.create_task(keep_awake(ctx, session_id))
        try:
            async for event_id, event in runs.events(record.run_id):
                if watch is not None:  # its agent took the turn: it is awake
                    await cancel_and_wait([watch])
                    watch = None
                for line in _turn_lines(event_id, event, record.run_id):
                    yield line
        finally:
            if watch is not None:
                await cancel_and_wait([watch])

    return TurnStream(stream(), headers={"Cache-Control": "no-cache", "Colony-Run-Id": record.run_id})


class TurnStarted(BaseModel):
    run_id: str = Field(
        description="the turn's run: GET /v1/runs/{run_id}, or follow /v1/runs/{run_id}/events"
    )
    session_id: str


@router.post(
    "/v1/sessions/{session_id}/turns", status_code=202, response_model=TurnStarted, responses=SESSION_TURN
)
async def start_turn(request: Request, session_id: SessionId, body: SendMessage, ctx: Context) -> TurnStarted:
    """One turn without holding a stream open (as the MCP server's `chat` takes it): the message is
    taken as `POST .../messages` takes it (the same checks, 409 for a session suspended by request,
    an Idempotency-Key makes a retry the same turn) and the turn's run id is answered at once; its
    reply is the run's output (`message`), its pieces the run's `token` events."""
    record = await submit_turn(ctx, request, session_id, body.message)
    _watch_turn(ctx, session_id, record.run_id)
    return TurnStarted(run_id=record.run_id, session_id=session_id)


_watches: set[asyncio.Task[None]] = set()
MAX_WATCHES = 1024  # turns watched at once by this process (beyond: the monitor resumes sessions)


def _watch_turn(ctx: ApiContext, session_id: str, run_id: str) -> None:
    """Keep a turn's session awake (`keep_awake`) until its agent takes the turn, in the background."""
    if len(_watches) >= MAX_WATCHES:
        return
    runs_of = ctx.services

    async def watch() -> None:
        waker = asyncio.create_task(keep_awake(ctx, session_id))
        try:
            async with asyncio.timeout(KEEP_AWAKE_SECONDS * KEEP_AWAKE_CHECKS):
                async for _ in (await runs_of()).runs.events(run_id):
                    break  # (its agent took it: awake)
        except Exception as exc:  # (Redis away, a timeout: the monitor resumes sessions as ever)
            log.info("turn %s of session %s: not watched to its start (%r)", run_id, session_id, exc)
        finally:
            await cancel_and_wait([waker])

    task = asyncio.create_task(watch(), name=f"turn-watch-{run_id}")
    _watches.add(task)
    task.add_done_callback(_watches.discard)


async def submit_turn(ctx: ApiContext, request: Request, session_id: str, message: str) -> RunRecord:
    """One turn's run (the session's agent woken first; SessionNotFound, 422 for a message over
    `context.session_max_message_chars`): what `POST .../messages` and the OpenAI door's chat
    completions in a session submit."""
    session = await session_record(ctx, session_id)
    store = await store_of(ctx, session_id, session)
    limit = store.settings.session_max_message_chars
    if len(message) > limit:
        raise InvalidArgument(
            f"message: {len(message)} characters; at most {limit} (context.session_max_message_chars)"
        )
    if not message.strip():  # as the tree refuses it (found by review: a 200 stream ending in error)
        raise InvalidArgument("message: only whitespace; a message needs some text")
    runs = (await ctx.services()).runs
    keyed = keyed_run_id(request)
    await _room_for_a_turn(store, runs, keyed)
    await wake(ctx, session, strict=True)
    # keyed: a retry after a 5xx follows the same turn (its run), never stores the message twice
    async with admitted(ctx, request, keyed, None) as run_id:  # another tenant's: quotas
        return await runs.submit(session_id, {"message": message}, run_id=run_id)


async def _room_for_a_turn(store: SessionStore, runs: Any, keyed: str | None) -> None:
    """422 unless the tree holds room for the message and its reply (found by review: the last
    message under `context.session_max_messages` was stored, the model answered, and the reply was
    refused and lost). A keyed retry of a turn already submitted is not asked again; two turns
    sent together may both pass, and the tree refuses what does not fit."""
    if keyed is not None:
        with contextlib.suppress(ColonyError):
            await runs.record(keyed)
            return
    held, most = len((await store.head()).parents), store.settings.session_max_messages
    if held + 2 > most:
        raise InvalidArgument(
            f"message: the session holds {held} of its {most} messages (context.session_max_messages) "
            "and a turn needs room for the message and its reply; start a new session"
        )


def _turn_lines(event_id: str, event: dict[str, Any], run_id: str) -> list[str]:
    """The SSE lines a run event of a turn becomes (none for the events not passed on)."""
    kind = event.get("event_type")
    data = event.get("data")
    if kind in PASSED_ON:
        return [_sse(event_id, str(kind), data, run_id)]
    if kind == "completed":
        output = data.get("output") if isinstance(data, dict) else None
        return [_sse(event_id, "message", output, run_id)]
    if kind in TERMINAL:
        error = data.get("error") if isinstance(data, dict) else None
        return [_sse(event_id, "error", {"status": kind, "error": error}, run_id)]
    return []


async def keep_awake(ctx: ApiContext, session_id: str) -> None:
    """While a turn waits for its agent's first event: a session suspended to make room after its
    message was stored (and before its agent took it) is resumed again, every KEEP_AWAKE_SECONDS,
    a bounded number of times; a failure is left to the next check (the run ends at its deadline)."""
    registry = (await ctx.services()).registry
    for _ in range(KEEP_AWAKE_CHECKS):
        await asyncio.sleep(KEEP_AWAKE_SECONDS)
        try:
            await wake(ctx, await registry.get(session_id))
        except ColonyError as exc:
            log.info("session %s not resumed for its waiting turn: %s", session_id, exc)


@router.get(
    "/v1/sessions/{session_id}/messages",
    response_model=MessageList,
    responses=SESSION_READ,
)
async def list_messages(
    session_id: SessionId,
    ctx: Context,
    all: Annotated[bool, Query(description="every message of the tree, not only the active path")] = False,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description=f"at most this many messages (max {MAX_PAGE})")
    ] = DEFAULT_PAGE,
    offset: Annotated[
        int, Query(ge=0, le=2**31, description="skip this many messages of the listing first")
    ] = 0,
) -> MessageList:
    """The active branch's messages, oldest first (what the model sees); with ?all=true every
    message ever added, reverted ones and other branches' included, in the order added. Paged:
    `limit` messages from `offset`; `next_offset` is where the next page starts (null on the
    last). Messages are never removed and are added at the end of the ?all=true order, so its
    pages stay stable; the active path changes with reverts and forks."""
    store = await store_of(ctx, session_id)
    head, total, messages = await store.listing(all=all, offset=offset, limit=limit)
    end = offset + len(messages)
    return MessageList(
        session_id=session_id,
        active=head.active,
        all=all,
        total=total,
        offset=offset,
        next_offset=end if end < total else None,
        messages=messages,
    )


@router.post(
    "/v1/sessions/{session_id}/revert",
    response_model=SessionView,
    responses=SESSION_CHANGE,
)
async def revert(session_id: SessionId, body: RevertBody, ctx: Context) -> SessionView:
    """Move the active branch back to a message on its path (non-destructive: later messages
    stay listed with ?all=true); the next turn continues from it. A message of another branch
    is a 404: switch to its branch first, or fork from it."""
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.revert(body.message_id))


@router.post(
    "/v1/sessions/{session_id}/fork",
    status_code=201,
    response_model=SessionView,
    responses=SESSION_CHANGE,
)
async def fork(session_id: SessionId, body: ForkBody, ctx: Context) -> SessionView:
    """A new branch from a message, made active; the branch it came from keeps its transcript."""
    store = await store_of(ctx, session_id)
    head, _ = await store.fork(body.message_id, body.branch)
    return session_view(session_id, head)


@router.post(
    "/v1/sessions/{session_id}/switch",
    response_model=SessionView,
    responses=SESSION_CHANGE,
)
async def switch(session_id: SessionId, body: SwitchBody, ctx: Context) -> SessionView:
    """Make another branch the active one."""
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.switch(body.branch))


@router.delete(
    "/v1/sessions/{session_id}", status_code=204, response_class=Response, responses=SESSION_DELETE
)
async def delete_session(session_id: SessionId, ctx: Context) -> Response:
    """Delete a session for good: its agent is stopped (a turn in progress ends with it) and every
    key of its state goes (the conversation tree, the agent's state, its runs' requests and
    events). 204 once deleted; a second DELETE (or an unknown id) is a 404."""
    await session_record(ctx, session_id)
    try:
        await (await ctx.control()).delete(session_id)
    except AgentNotFound:  # deleted meanwhile by another DELETE (or the retention sweep)
        raise SessionNotFound(f"no session {session_id[:80]!r} in this colony (deleted)") from None
    return Response(status_code=204)
