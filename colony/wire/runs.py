"""A run as it crosses the API: the submit body (`SubmitRun`) and its 202 answer (`SubmittedRun`).
The API validates with them and documents them in its OpenAPI; the client builds the same body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from colony.wire.ids import ID_PATTERN, ID_RULE, Identifier

MAX_WAIT_SECONDS = 600.0  # a submit with wait_s holds its request open at most this long


class SubmitRun(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"agent": "echo", "input": {"hello": ["world", 1]}, "timeout_s": 9}],
            # stream and wait_s exclude each other (the validator below says so with a 422)
            "not": {
                "required": ["stream", "wait_s"],
                "properties": {"stream": {"const": True}, "wait_s": {"type": "number"}},
            },
        },
    )

    agent: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN, description=f"agent id; {ID_RULE}")
    input: Any = Field(
        None,
        description="any JSON value, at most api.max_input_depth levels deep; no NaN/Infinity; valid Unicode",
    )
    namespace: str | None = Field(None, min_length=1, max_length=100, pattern=ID_PATTERN)
    timeout_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False)
    pages: list[Identifier] | None = Field(None, max_length=1024, description="page ids the run needs")
    stream: bool = Field(
        False,
        strict=True,  # true or false only: 0 or "yes" is a 422, as the schema says
        description="true: the answer is the run's event stream (200, text/event-stream, the events "
        "GET /v1/runs/{run_id}/events sends), with the run id in the Colony-Run-Id header and that "
        "events URL in Content-Location (resume there with Last-Event-ID); one request per run. "
        "false: 202 with the run id",
    )
    wait_s: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description="wait up to this many seconds for the run to end: the answer is then the "
        "ended run (200, as GET /v1/runs/{run_id} shows it: status, output, error), one request "
        "per run; a run still going at the end of the wait is answered as without it (202 with the "
        f"run id; it goes on). At most {MAX_WAIT_SECONDS:.0f}; not with `stream`",
    )

    @model_validator(mode="after")
    def _one_way_to_answer(self) -> SubmitRun:
        if self.stream and self.wait_s is not None:
            raise ValueError("stream and wait_s exclude each other: stream the events, or wait for the end")
        return self


class SubmittedRun(BaseModel):
    run_id: str
    status: str
    events_url: str
