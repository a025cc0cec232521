"""Errors to HTTP answers, in one table: a Colony error is answered with the status and code of
the nearest class of its MRO found in `ERRORS`, the same on every route (so a refused argument is
a 422 wherever it is raised). Every answer is the `ErrorBody` of colony.api.schemas.

The other handlers here cover what is not a Colony error: Starlette's HTTP errors (401, 404, 405,
413, a body that does not parse), request validation (422) and a bug (500, logged).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from colony.errors import (
    AccessDenied,
    AgentNotFound,
    AgentStateConflict,
    BlackboardUnavailable,
    BlockAccessDenied,
    BlockExists,
    BlockNotFound,
    BlockVersionConflict,
    CheckpointNotFound,
    ColonyError,
    ContextError,
    InvalidArgument,
    MemoryAccessDenied,
    MessageNotFound,
    NoActiveBranch,
    NothingToUndo,
    PathNotAllowed,
    ReplicaUnavailable,
    ResourceExhausted,
    RunNotFound,
    RunQueueFull,
    RunRetired,
    SessionNotFound,
    SharedMemoryNotFound,
    SourceTooLarge,
    TenantQuotaExceeded,
    TokenNotFound,
)

log = logging.getLogger(__name__)


class MemoryScopeNotFound(ColonyError):
    """The agent has no memory scope of that name or type (404)."""


class SessionStartFailed(ContextError):
    """The `session` agent's run did not place a session agent (no replica could take it, it
    timed out): 503, retry."""


class AgentNotResumed(ColonyError):
    """The agent a request is for is suspended and was not resumed within the bound (no room
    could be made: every other agent busy or more important; or the resume took too long): 503
    with Retry-After, rather than a request that waits for ever."""

    def __init__(self, message: str, retry_after_seconds: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class InvalidLastEventId(InvalidArgument):
    """A `Last-Event-ID` header that is no event id of the run's stream: a malformed request (400)
    rather than a refused field, answered before the stream starts."""


@dataclass(frozen=True)
class HttpError:
    """How one error class is answered: status, code, and what more its answer carries."""

    status: int
    code: str
    fields: Callable[[Any], dict[str, Any]] | None = None  # more members of the `error` object
    headers: Callable[[Any], dict[str, str]] | None = None


NOT_FOUND = HttpError(404, "not_found")
CONFLICT = HttpError(409, "conflict")
FORBIDDEN = HttpError(403, "forbidden")
UNAVAILABLE = HttpError(503, "unavailable")

# A class not listed answers as its nearest listed ancestor: BlockEditRejected, ImportRejected and
# AgentUsageError as InvalidArgument (422). BlockError and ContextError stay unlisted: they come
# before InvalidArgument in those classes' MROs, and would take their status from it.
ERRORS: dict[type[ColonyError], HttpError] = {
    ColonyError: HttpError(400, "bad_request"),
    InvalidArgument: HttpError(422, "invalid_request"),
    InvalidLastEventId: HttpError(400, "bad_request"),
    AgentNotFound: NOT_FOUND,
    RunNotFound: NOT_FOUND,
    RunRetired: HttpError(410, "retired"),
    MemoryScopeNotFound: NOT_FOUND,
    SharedMemoryNotFound: NOT_FOUND,
    BlockNotFound: NOT_FOUND,
    CheckpointNotFound: NOT_FOUND,
    SessionNotFound: NOT_FOUND,
    MessageNotFound: NOT_FOUND,
    TokenNotFound: NOT_FOUND,
    AccessDenied: FORBIDDEN,
    BlockAccessDenied: FORBIDDEN,
    MemoryAccessDenied: FORBIDDEN,
    PathNotAllowed: FORBIDDEN,
    AgentStateConflict: CONFLICT,
    BlockExists: CONFLICT,
    NothingToUndo: CONFLICT,
    NoActiveBranch: CONFLICT,
    # the head the client should read and redo from
    BlockVersionConflict: HttpError(
        409, "version_conflict", fields=lambda exc: {"current_version": exc.current_version}
    ),
    SourceTooLarge: HttpError(413, "too_large"),
    RunQueueFull: HttpError(
        429,
        "too_many_runs",
        headers=lambda exc: {"Retry-After": str(max(1, round(exc.retry_after_seconds)))},
    ),
    TenantQuotaExceeded: HttpError(
        429,
        "quota_exceeded",
        headers=lambda exc: {"Retry-After": str(max(1, round(exc.retry_after_seconds)))},
    ),
    BlackboardUnavailable: UNAVAILABLE,
    ReplicaUnavailable: UNAVAILABLE,
    ResourceExhausted: UNAVAILABLE,
    SessionStartFailed: UNAVAILABLE,
    AgentNotResumed: HttpError(
        503, "unavailable", headers=lambda exc: {"Retry-After": str(max(1, round(exc.retry_after_seconds)))}
    ),
}

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


def http_error_of(exc: ColonyError) -> HttpError:
    """The answer of the nearest class of `exc`'s MRO in ERRORS (ColonyError's at the least)."""
    for cls in type(exc).__mro__:
        found = ERRORS.get(cls)
        if found is not None:
            return found
    return ERRORS[ColonyError]


class AsciiJSON(JSONResponse):
    """JSON escaped to ASCII: an error message quoting hostile input (a lone surrogate) still encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, **fields: Any
) -> JSONResponse:
    error = {"code": code, "message": message, **fields}
    return AsciiJSON(status_code=status, content={"error": error}, headers=headers)


OPENAI_PREFIX = "/openai/"  # the OpenAI-compatible door: its errors in OpenAI's shape
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
OPENAI_TYPES |= {429: "rate_limit_error", 400: "invalid_request_error", 422: "invalid_request_error"}


def shaped(
    request: Request,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    param: str | None = None,
    **fields: Any,
) -> JSONResponse:
    """An error answer: Colony's `{"error": {"code", "message"}}`, and on the OpenAI door OpenAI's
    (`message`, `type`, `param`, `code`: a superset, which Colony's clients read as well)."""
    if request.url.path.startswith(OPENAI_PREFIX):
        kind = OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        fields = {**fields, "type": kind, "param": param}
    return error_response(status, code, message, headers, **fields)


async def colony_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ColonyError)
    answer = http_error_of(exc)
    fields = answer.fields(exc) if answer.fields else {}
    headers = answer.headers(exc) if answer.headers else None
    return shaped(request, answer.status, answer.code, str(exc), headers, **fields)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = str(exc.detail)
    headers = exc.headers  # kept: a 405 carries `Allow`
    if exc.status_code == 405:  # every method of the path (the router names only one route's)
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request.app, request))}
    if exc.status_code == 400 and message == "There was an error parsing the body":
        message = "the request body is not valid JSON (UTF-8, at most a few hundred levels deep)"
    return shaped(request, exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), message, headers)


def _problem(err: Any) -> str:
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"body: not valid JSON at character {err['loc'][-1]} ({detail})"
    return f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}"


async def bad_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = exc.errors()
    message = "; ".join(_problem(err) for err in problems)
    if request.url.path.startswith(OPENAI_PREFIX) and problems:  # OpenAI's: 400, naming the field
        param = ".".join(str(p) for p in problems[0]["loc"] if p != "body") or None
        return shaped(request, 400, "invalid_request", message, param=param)
    return error_response(422, "invalid_request", message)


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug, not an input problem: logged with its traceback; the client gets the error model."""
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return shaped(
        request, 500, "internal", f"internal error ({type(exc).__name__}); see the API replica's log"
    )


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """The methods of every route whose path matches the request's (a path served by two routes,
    GET and POST /v1/agents/{id}/memory, answers a 405 with both in `Allow`)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(ColonyError, colony_error)
    app.add_exception_handler(Exception, unexpected)
