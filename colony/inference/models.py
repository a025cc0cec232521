"""Requests, responses and pages of the inference layer (engine-independent)."""

from __future__ import annotations

import time
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, Field, model_validator

from colony.errors import InvalidSchema
from colony.metrics import INFERENCE_LATENCY_BUCKETS


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class InferenceRequest(BaseModel):
    """One generation. `page_ids` name resident pages whose text forms the prompt's shared prefix."""

    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)
    stop: list[str] = Field(default_factory=list)
    response_format: Any = Field(None, description="a JSON Schema (dict) the output must follow")
    page_ids: list[str] = Field(default_factory=list)
    seed: int | None = None

    @model_validator(mode="after")
    def _one_input(self) -> InferenceRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages or prompt")
        return self

    def model_post_init(self, __context: Any) -> None:
        # here, not in a field validator, so the typed InvalidSchema reaches the caller unwrapped
        if self.response_format is not None:
            check_schema(self.response_format)

    def chat_messages(self) -> list[ChatMessage]:
        """The request as chat messages (a bare prompt becomes one user message)."""
        return (
            list(self.messages)
            if self.messages is not None
            else [ChatMessage(role="user", content=self.prompt or "")]
        )


def check_schema(schema: Any, what: str = "response_format") -> None:
    """Raise `InvalidSchema` (naming `what`) unless `schema` is a valid JSON Schema (checked when
    the request is built); one nested past the checker's recursion is refused too (found by
    review: a RecursionError, a 500 at the OpenAI door)."""
    if not isinstance(schema, dict):
        raise InvalidSchema(f"{what} must be a JSON Schema object, got {type(schema).__name__}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidSchema(f"{what} is not a valid JSON Schema at {where}: {exc.message}") from None
    except RecursionError:
        raise InvalidSchema(f"{what} is nested too deep to be checked as a JSON Schema") from None


class Usage(BaseModel):
    prompt_tokens: int = 0
    cached_tokens: int = Field(0, description="prompt tokens served from the KV cache, as the engine reports")
    completion_tokens: int = 0

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Timings(BaseModel):
    ttft: float = Field(0.0, description="seconds to the first token (prompt processing)")
    total: float = Field(0.0, description="seconds for the whole request")


class InferenceResponse(BaseModel):
    text: str
    parsed: Any = Field(None, description="the decoded JSON when a response_format was given")
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    finish_reason: str | None = None
    model: str | None = None
    slot: int | None = Field(None, description="engine slot that served it (embedded engine)")


class StreamChunk(BaseModel):
    """A piece of streamed output; the last chunk carries `finish_reason` (and usage when known)."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


class PageLoad(BaseModel):
    """What loading (or swapping in) a page did."""

    page_id: str
    slot: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = Field(0, description="prompt tokens the engine already held (0 = a cold prefill)")
    seconds: float = 0.0
    evicted: list[str] = Field(default_factory=list)
    source: Literal["prefill", "swap_in", "swap_out", "already_resident"] = "prefill"


class EngineStats(BaseModel):
    engine: str
    model: str | None = None
    resident_pages: dict[str, int | None] = Field(default_factory=dict)
    swapped_pages: list[str] = Field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    page_loads: int = Field(0, description="pages prefilled into the engine (not swap-ins)")
    page_load_tokens: int = Field(
        0,
        description="tokens prefilled to load pages (not in prompt_tokens: a request's page prefix "
        "counts there as cached); the tokens the engine computed are page_load_tokens + prompt_tokens "
        "- cached_tokens",
    )
    ttft_seconds_total: float = Field(0.0, description="summed time to first token (mean = / requests)")
    request_seconds_total: float = Field(0.0, description="summed request duration (mean = / requests)")
    ttft_histogram: list[int] = Field(
        default_factory=lambda: [0] * (len(INFERENCE_LATENCY_BUCKETS) + 1),
        description="requests per time-to-first-token bucket (colony.metrics.INFERENCE_LATENCY_BUCKETS, "
        "then +Inf); the heartbeat carries it to the API's colony_replica_inference_ttft_seconds",
    )
    request_histogram: list[int] = Field(
        default_factory=lambda: [0] * (len(INFERENCE_LATENCY_BUCKETS) + 1),
        description="requests per duration bucket (same bounds): colony_replica_inference_request_seconds",
    )
    started_at: float = Field(default_factory=time.time)
