"""What the API accepts and answers, as declared in its OpenAPI document.

Every identifier that reaches a Redis key (run ids, agent ids, namespaces, page ids, replica ids)
is checked against `ID_PATTERN` at the edge, so a key is never built from raw input. Every route
declares each status it can answer with, and errors share one body model, `ErrorBody`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
ID_RULE = "1-128 characters: letters, digits, '_', '.', '-' (starting with a letter or digit)"
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]
AgentStateName = Literal["initialized", "running", "waiting", "idle", "suspended", "stopped", "failed"]


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. not_found, invalid_request")
    message: str = Field(description="what went wrong and what to do about it")


class ErrorBody(BaseModel):
    """Every error answer: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


class SubmitRun(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"agent": "echo", "input": {"hello": ["world", 1]}, "timeout_s": 9}]},
    )

    agent: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN, description=f"agent id; {ID_RULE}")
    input: Any = Field(
        None,
        description="any JSON value, at most api.max_input_depth levels deep; no NaN/Infinity; valid Unicode",
    )
    namespace: str | None = Field(None, min_length=1, max_length=100, pattern=ID_PATTERN)
    timeout_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False)
    pages: list[Identifier] | None = Field(None, max_length=1024, description="page ids the run needs")


class SubmittedRun(BaseModel):
    run_id: str
    status: str
    events_url: str


class MapSource(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"path": "/srv/code"}]})

    path: str = Field(
        min_length=1, max_length=4096, description="a folder (or git checkout) under vcm.allowed_roots"
    )
    page_tokens: int = Field(2048, ge=64, le=1_000_000)

    @field_validator("path")
    @classmethod
    def _encodable(cls, value: str) -> str:
        """A path the OS can be asked about: no NUL byte, valid Unicode (else os.* raises, a 500)."""
        if "\x00" in value:
            raise ValueError("a path cannot hold a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a path must be valid Unicode (it holds a lone surrogate)") from None
        return value


class MappedSource(BaseModel):
    source_id: str
    path: str
    pages: list[dict[str, Any]]


class Health(BaseModel):
    status: str
    version: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "the request is malformed (e.g. a body that is not JSON, a bad Last-Event-ID)",
        401: "missing or wrong bearer token",
        403: "the path is outside vcm.allowed_roots",
        404: "no such run, agent or feature",
        409: "the agent is not in a state that allows this",
        413: "the request body (or the source to map) is too large",
        422: "a parameter or body field is invalid; the message names it",
        503: "Redis or a replica is unavailable; retry later",
    }
    return {status: {"model": ErrorBody, "description": what[status]} for status in statuses}


COMMON = (401, 422, 503)
READ_ONE = _errors(*COMMON, 404)
SUBMIT = _errors(*COMMON, 400, 404, 413)
EVENTS = _errors(*COMMON, 400, 404)
CONTROL = _errors(*COMMON, 404, 409)
MAP_SOURCE = _errors(*COMMON, 400, 403, 404, 413)
LISTING = _errors(*COMMON)
NO_PARAMS = _errors(401, 503)
PAGES = _errors(*COMMON, 404)

# one server-sent event: `data` is the run event as JSON text (event_type, data, seq, ...)
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["id", "event", "data"],
}
