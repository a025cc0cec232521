"""HTTP routes of context management: sessions and their conversation trees (docs/sessions.md).

A session is an agent (its id `session-<16 hex>`, role `session`) that the catalog's `session`
agent places (`POST /v1/sessions` runs it); its AGENT scope holds the conversation tree
(colony.context.sessions). A turn (`POST /v1/sessions/{id}/messages`) is a run of the session's
agent whose events come back as server-sent events: `turn` (the run id), `user_chat_message` (the
stored user message), `token` (each piece of the reply as the model writes it), then `message` (the
stored reply and the ids of the messages its prompt held) or `error`. Revert, fork and switch change
the tree here, in the API process, under the same optimistic concurrency the agent uses.

Errors (colony.api.errors): SessionNotFound and MessageNotFound 404, NoActiveBranch 409 (a session
without messages has no branch to revert), SessionStartFailed 503, any other refused argument
(bounds, a taken branch name) 422 naming it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from colony.api.deps import GUARDED, ApiContext, Context, settings_of
from colony.api.errors import SessionStartFailed
from colony.api.params import SessionId
from colony.api.schemas import ErrorBody
from colony.context.sessions import SESSION_ROLE, SessionStore, is_session_id
from colony.context.tree import BRANCH_PATTERN, MESSAGE_ID_PATTERN, Message, TreeHead, linearize
from colony.errors import InvalidArgument, SessionNotFound

STARTER = "session"  # the catalog agent that places session agents
START_TIMEOUT_S = 60.0  # placing a session agent: a replica may be starting
TERMINAL = frozenset({"completed", "failed", "cancelled"})
PASSED_ON = frozenset({"user_chat_message", "token", "restarted"})
DEFAULT_PAGE = 1000  # messages a listing returns unless `limit` says otherwise
MAX_PAGE = 10_000  # the most `limit` may ask for (a message is up to session_max_message_chars)
router = APIRouter(dependencies=GUARDED)


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "the body is not JSON",
        401: "missing or wrong bearer token",
        404: (
            "no such session (or message in it, or, for a revert, on its active branch); "
            "or no `session` agent in the colony"
        ),
        409: "the session has no active branch (it has no messages yet)",
        422: "a parameter or body field is invalid; the message names it",
        503: "Redis or a replica is unavailable; retry later",
    }
    return {status: {"model": ErrorBody, "description": what[status]} for status in statuses}


SESSION_READ = _errors(401, 404, 422, 503)
SESSION_SEND = _errors(400, 401, 404, 422, 503)  # a route with a body: one that is not JSON is a 400
SESSION_CHANGE = _errors(400, 401, 404, 409, 422, 503)


class SessionStart(BaseModel):
    """`POST /v1/sessions` (no fields yet: an empty object or no body)."""

    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422, as on every route


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
    branches = [
        BranchView(
            name=b.name, leaf_id=b.leaf_id, forked_from=b.forked_from, length=len(linearize(head, b.leaf_id))
        )
        for b in head.branches.values()
    ]
    return SessionView(
        session_id=session_id, active=head.active, branches=branches, messages=len(head.parents)
    )


def _sse(event_id: str | None, kind: str, data: Any, run_id: str) -> str:
    body = json.dumps({"event_type": kind, "data": data, "request_id": run_id})
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {body}\n\n"


async def store_of(ctx: ApiContext, session_id: str) -> SessionStore:
    """The session's tree; SessionNotFound unless `session_id` is a registered session agent."""
    services = await ctx.services()
    record = await services.registry.get(session_id) if is_session_id(session_id) else None
    if record is None or record.role != SESSION_ROLE:
        raise SessionNotFound(f"no session {session_id[:80]!r} in this colony; POST /v1/sessions starts one")
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
async def start_session(ctx: Context, body: SessionStart | None = None) -> SessionView:
    """Start a session: the catalog's `session` agent places a session agent (its id is the
    session id) with an empty conversation tree."""
    runs = (await ctx.services()).runs
    record = await runs.submit(STARTER, {}, timeout_s=START_TIMEOUT_S)
    deadline = time.monotonic() + START_TIMEOUT_S
    view = await runs.get(record.run_id)
    while view.status not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        view = await runs.get(record.run_id)
    output = view.output if isinstance(view.output, dict) else {}
    session_id = output.get("session_id")
    if view.status != "succeeded" or not isinstance(session_id, str):
        raise SessionStartFailed(
            f"the session could not start (run {record.run_id} {view.status}: "
            f"{view.error or 'no session id'}); GET /v1/runs/{record.run_id} for details, and retry"
        )
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.head())


@router.get("/v1/sessions/{session_id}", response_model=SessionView, responses=SESSION_READ)
async def get_session(session_id: SessionId, ctx: Context) -> SessionView:
    """The session's branches (each with its leaf and length), the active one, its size."""
    store = await store_of(ctx, session_id)
    return session_view(session_id, await store.head())


@router.post(
    "/v1/sessions/{session_id}/messages",
    response_class=TurnStream,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}, **SESSION_SEND},
)
async def send_message(session_id: SessionId, body: SendMessage, ctx: Context) -> StreamingResponse:
    """One turn: the message goes on the active branch and the reply streams back (SSE:
    `turn`, `user_chat_message`, `token`..., then `message` or `error`). A broken stream can be
    followed at /v1/runs/{run_id}/events (the `turn` event's run id) with Last-Event-ID."""
    store = await store_of(ctx, session_id)
    limit = store.settings.session_max_message_chars
    if len(body.message) > limit:
        raise InvalidArgument(
            f"message: {len(body.message)} characters; at most {limit} (context.session_max_message_chars)"
        )
    runs = (await ctx.services()).runs
    record = await runs.submit(session_id, {"message": body.message})

    async def stream() -> AsyncIterator[str]:
        yield _sse(None, "turn", {"run_id": record.run_id, "session_id": session_id}, record.run_id)
        async for event_id, event in runs.events(record.run_id):
            kind = event.get("event_type")
            data = event.get("data")
            if kind in PASSED_ON:
                yield _sse(event_id, str(kind), data, record.run_id)
            elif kind == "completed":
                output = data.get("output") if isinstance(data, dict) else None
                yield _sse(event_id, "message", output, record.run_id)
            elif kind in TERMINAL:
                error = data.get("error") if isinstance(data, dict) else None
                yield _sse(event_id, "error", {"status": kind, "error": error}, record.run_id)

    return TurnStream(stream(), headers={"Cache-Control": "no-cache"})


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
