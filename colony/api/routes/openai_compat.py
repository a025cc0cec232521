"""An OpenAI-compatible door (docs/clients.md): `GET /openai/v1/models` and `POST
/openai/v1/chat/completions`, so the `openai` package and what is built on it talk to Colony's
agents with `base_url=<colony>/openai/v1` and a Colony token as the API key.

`model` names an agent the token may run (a catalog name: `ask` answers with the model; for
another tenant's token, its own instance). Without a session the messages are the whole context:
they become the run's input (`{"messages", "max_tokens", "response_format"}`; the `ask` agent's
chat form answers with the engine's text and token counts). With a session (the body's `session`
field, or the `Colony-Session` header) the last message, a user's, is the session's next turn and
the session keeps the conversation. `stream: true` answers OpenAI's SSE chunks from the run's
`token` events, then `data: [DONE]`. Errors are OpenAI's shape (`{"error": {"message", "type",
"param", "code"}}`) on these routes; the guard's refusals (401, 403, 404, 429) keep Colony's,
which has the same `error.message`. The same token, verbs, tenants, quotas and limits hold.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from colony.agents.reply_stream import USAGE_EVENT
from colony.api.access import check_agent, principal_of, visible
from colony.api.deps import GUARDED, ApiContext, Context, settings_of
from colony.api.errors import shaped
from colony.api.event_stream import wait_for_end
from colony.api.idempotency import keyed_run_id
from colony.api.routes.sessions import STARTER, submit_turn
from colony.api.schemas import COMMON, NO_PARAMS, ErrorBody, _errors
from colony.api.tenancy import admitted, tenant_agent
from colony.api.wake import wake_agent
from colony.errors import AgentUsageError, InvalidArgument, InvalidSchema
from colony.inference.models import check_schema
from colony.planning.functions import bounded_schema, tool_specs
from colony.system.builtin import MAX_CHAT_MESSAGES, MAX_CHAT_TOKENS
from colony.system.catalog import catalog_names
from colony.system.runs import RunRecord, RunService
from colony.wire.ids import ID_PATTERN
from colony.wire.input_check import check_input
from colony.wire.run_events import is_terminal
from colony.wire.runs import MAX_WAIT_SECONDS

router = APIRouter(prefix="/openai/v1", dependencies=GUARDED)
SESSION_HEADER = "colony-session"
COMPLETION = _errors(*COMMON, 400, 404, 413, 429)
COMPLETION |= {
    500: {"model": ErrorBody, "description": "the agent's run failed (the message says why)"},
    504: {"model": ErrorBody, "description": "the run did not end within the wait"},
}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=400_000)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=100_000)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=64)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, max_length=2000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


class NamedChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: dict[Literal["name"], Annotated[str, Field(max_length=64)]]


class MessageIn(BaseModel):
    """A message; an assistant's as the door answered it may come back whole (`refusal`, its
    `tool_calls`), and a `tool` message carries a function's result for the call it names."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=400_000)] | list[TextPart] | None = Field(
        None, description="text, or text parts (no images: this door takes text); null for an assistant's"
    )
    name: str | None = Field(None, max_length=64)
    refusal: Annotated[str, Field(max_length=400_000)] | None = None
    annotations: list[Any] | None = Field(None, max_length=0)
    audio: None = None
    function_call: None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=32)
    tool_call_id: str | None = Field(None, max_length=64)

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_agent(self) -> dict[str, str]:
        """The message as the agent reads it: a function's call as text, its result a `tool`
        message of text (memory never takes it for the user's words)."""
        if self.role == "tool":  # (its own role: a function's result is not what the user said)
            return {
                "role": "tool",
                "content": f"Result of the function call {self.tool_call_id}: {self.text()}",
            }
        text = self.text()
        for call in self.tool_calls or ():
            text += f"\nI call {call.function.name} ({call.id}) with {call.function.arguments}."
        return {"role": "system" if self.role == "developer" else self.role, "content": text.strip()}


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = Field(None, max_length=2000)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatCompletion(BaseModel):
    """OpenAI's chat completion request. Accepted and not used: `temperature`, `top_p`, `seed`,
    `user`, `metadata`, `store`, the penalties and `logit_bias` (the agent decides how it
    samples); refused (400, naming them): `n` other than 1, `tools`, `logprobs`."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_CHAT_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_CHAT_TOKENS)
    response_format: ResponseFormat | None = None
    session: str | None = Field(None, max_length=128, pattern=ID_PATTERN, description="a Colony session")
    n: int = Field(1, ge=1, le=1, description="one choice only")
    tools: list[ToolIn] | None = Field(None, max_length=32, description="functions the agent may call")
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: int | None = Field(None, le=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=4)]
        | None
    ) = None
    user: str | None = Field(None, max_length=256)
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = (
        Field(None, max_length=16)
    )
    store: bool | None = None
    logit_bias: dict[Annotated[str, Field(max_length=16)], float] | None = Field(None, max_length=300)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    service_tier: Annotated[str, Field(max_length=32)] | None = None
    modalities: list[Literal["text"]] | None = Field(None, max_length=1)
    prediction: Any = None
    verbosity: Literal["low", "medium", "high"] | None = None

    def schema_of(self) -> dict[str, Any] | None:
        """The JSON Schema the reply must follow (json_object: any object), checked (400 else)."""
        held = self.response_format
        if held is None or held.type == "text":
            return None
        if held.type == "json_object":
            return {"type": "object"}
        if held.json_schema is None:
            raise InvalidArgument("response_format.json_schema: required with type json_schema")
        bounded_schema(held.json_schema.schema_, "response_format.json_schema.schema")  # depth first
        check_schema(held.json_schema.schema_, "response_format.json_schema.schema")
        return held.json_schema.schema_


def openai_error(request: Request, status: int, message: str, code: str) -> JSONResponse:
    """An error the client must not retry by itself (the run ran: a retry would run it again;
    `x-should-retry` tells the openai package so)."""
    return shaped(request, status, code, message, {"x-should-retry": "false"})


@router.get("/models", responses=NO_PARAMS)
async def list_models(request: Request, ctx: Context) -> dict[str, Any]:
    """The agents a client may talk to: the catalog's (another tenant's token: its own instances,
    by the same names; a token given some agents: those)."""
    services = await ctx.services()
    names = catalog_names(settings_of(services).agents)
    principal = principal_of(request)
    start = principal.prefix if principal is not None else ""
    if not start:  # the colony's own: the catalog's agents that are placed (another tenant's are
        placed = await services.registry.get_many(names)  # placed on first use)
        names = [n for n, record in zip(names, placed, strict=True) if record is not None]
    shown = visible(request, (f"{start}{name}" for name in names))
    names = [n for n in names if shown is None or f"{start}{n}" in shown]
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "colony"} for n in names],
    }


@router.post("/chat/completions", response_model=None, responses=COMPLETION)
async def chat_completions(body: ChatCompletion, request: Request, ctx: Context) -> Response:
    """A chat completion by an agent (the module says how): OpenAI's `chat.completion`, or with
    `stream` its `chat.completion.chunk` events and `data: [DONE]`."""
    runs = (await ctx.services()).runs
    record = await _submit(ctx, request, body)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _chunks(runs, record, body, include_usage)
        headers = {"Colony-Run-Id": record.run_id, "Cache-Control": "no-cache"}
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    ended = await wait_for_end(runs, record, MAX_WAIT_SECONDS)
    if ended is None:
        message = f"run {record.run_id} did not end in {MAX_WAIT_SECONDS:.0f} s; GET /v1/runs/{record.run_id}"
        return openai_error(request, 504, message, "timeout")
    if ended.status != "succeeded":
        return openai_error(request, 500, f"run {record.run_id} {ended.status}: {ended.error}", "run_failed")
    spent = UsageSum()
    async for _, event in runs.events(record.run_id, record=record):
        spent.add(event)
        if is_terminal(event):
            break
    content, finish, usage = _answer(ended.output, spent)
    calls = _calls(ended.output)
    message = {"role": "assistant", "content": None if calls else content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return JSONResponse(
        {
            **_head(record, body, "chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        },
        headers={"Colony-Run-Id": record.run_id},
    )


async def _submit(ctx: ApiContext, request: Request, body: ChatCompletion) -> RunRecord:
    """The run that answers: a session's turn, or the agent's run on the messages."""
    session = body.session or request.headers.get(SESSION_HEADER)
    if session:
        check_agent(request, session)  # another tenant's, or one it is not given: 404
        last = body.messages[-1]
        if last.role != "user":
            raise InvalidArgument("messages: in a session the last message is the user's turn")
        return await submit_turn(ctx, request, session, last.text())
    if body.model == STARTER:  # (its runs start sessions: a chat names the one it continues)
        raise InvalidArgument(
            "session: model `session` continues a session: name it in the body's `session` field or the "
            "Colony-Session header (POST /v1/sessions starts one)"
        )
    schema = body.schema_of()
    messages = [m.for_agent() for m in body.messages]
    run_input: dict[str, Any] = {
        "messages": messages,
        "max_tokens": body.max_completion_tokens or body.max_tokens,
    }
    if schema is not None:
        run_input["response_format"] = schema
    offered = {t.function.name for t in body.tools or ()}
    if isinstance(body.tool_choice, NamedChoice) and body.tool_choice.function.get("name") not in offered:
        raise InvalidArgument("tool_choice: names a function that tools does not offer")
    if body.tool_choice == "required" and not offered:
        raise InvalidArgument("tool_choice: `required` needs tools")
    if body.tools:  # (the `ask` agent answers with a call of one; another agent reads them or not)
        run_input["tools"] = [
            t.function.model_dump(exclude_none=True, exclude={"strict"}) for t in body.tools
        ]
        try:  # checked as the agent will check them: refused here, before a run is charged
            tool_specs(run_input["tools"])
        except (AgentUsageError, InvalidSchema) as exc:
            raise InvalidArgument(str(exc)) from None
        choice = body.tool_choice
        run_input["tool_choice"] = choice.model_dump() if isinstance(choice, NamedChoice) else choice
    try:
        check_input(run_input, ctx.api.max_input_depth)
    except ValueError as exc:  # too deep, NaN/Infinity: not stored (as POST /v1/runs)
        raise InvalidArgument(str(exc)) from None
    runs = (await ctx.services()).runs
    # as POST /v1/runs: quotas first, an Idempotency-Key makes a retry the same run, the agent woken
    async with admitted(ctx, request, keyed_run_id(request), MAX_WAIT_SECONDS) as run_id:
        agent = await tenant_agent(ctx, request, body.model, field="model")
        await wake_agent(ctx, agent)
        return await runs.submit(agent, run_input, timeout_s=MAX_WAIT_SECONDS, run_id=run_id)


def _head(record: RunRecord, body: ChatCompletion, kind: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{record.run_id}",
        "object": kind,
        "created": int(record.created_at),
        "model": body.model,
    }


def _calls(output: Any) -> list[dict[str, Any]] | None:
    """The function calls an agent answered with (the `ask` chat form's, OpenAI's shape), checked."""
    held = output.get("tool_calls") if isinstance(output, dict) else None
    if not isinstance(held, list) or not held:
        return None
    try:
        return [ToolCall.model_validate(call).model_dump() for call in held[:32]]
    except ValueError:
        return None


class UsageSum:
    """The engine's token counts of a run's model calls, from its `usage` events."""

    def __init__(self) -> None:
        self.prompt = self.completion = 0

    def add(self, event: dict[str, Any]) -> None:
        data = event.get("data")
        if event.get("event_type") == USAGE_EVENT and isinstance(data, dict):
            prompt, completion = data.get("prompt_tokens"), data.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int) and prompt >= 0 and completion >= 0:
                self.prompt += prompt
                self.completion += completion


def _answer(output: Any, spent: UsageSum) -> tuple[str, str, dict[str, int]]:
    """The reply's text, finish reason and usage: the agent's own (the `ask` chat form, a session's
    message) where it reports them, else its output as text (JSON if not text) and the sum of its
    run's model calls (`spent`: the planner's and the reply's; none for an agent that calls no
    model)."""
    reported = output.get("usage") if isinstance(output, dict) else None
    if isinstance(output, dict) and isinstance(output.get("message"), dict):  # a session's turn
        output = output["message"]
    content = output.get("content") if isinstance(output, dict) and "content" in output else output
    text = "" if content is None else content if isinstance(content, str) else json.dumps(content)
    finish = output.get("finish_reason") if isinstance(output, dict) else None
    finish = {"length": "length", "tool_calls": "tool_calls"}.get(str(finish), "stop")
    if isinstance(reported, dict) and all(
        isinstance(reported.get(k), int) for k in ("prompt_tokens", "completion_tokens")
    ):
        prompt, completion = reported["prompt_tokens"], reported["completion_tokens"]
    else:
        prompt, completion = spent.prompt, spent.completion
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return text, finish, usage


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _chunks(
    runs: RunService, record: RunRecord, body: ChatCompletion, include_usage: bool
) -> AsyncIterator[str]:
    """OpenAI's chunks of the run's reply: the role, a delta per `token` event, the rest of the
    text where the agent streamed none (its output), the finish reason, the usage if asked, then
    `[DONE]`; a run that failed ends with an error chunk."""
    head = _head(record, body, "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse(
            {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        )

    yield chunk({"role": "assistant", "content": ""})
    streamed: list[str] = []
    held = ""  # whitespace at the end of the pieces so far: sent only when more text follows
    spent = UsageSum()
    async for _, event in runs.events(record.run_id, record=record):
        spent.add(event)
        kind, data = event.get("event_type"), event.get("data")
        if kind == "token" and isinstance(data, dict) and isinstance(data.get("text"), str):
            # the answer is the reply stripped: so are the pieces together (none starts or ends it)
            piece = data["text"] if streamed else data["text"].lstrip()
            kept = piece.rstrip()
            if kept:
                streamed.append(held + kept)
                yield chunk({"content": held + kept})
                held = piece[len(kept) :]
            elif streamed:
                held += piece
        if not is_terminal(event):
            continue
        if kind != "completed":
            error = data.get("error") if isinstance(data, dict) else None
            yield _sse(
                {
                    "error": {
                        "message": f"run {record.run_id} {kind}: {error}",
                        "type": "server_error",
                        "param": None,
                        "code": "run_failed",
                    }
                }
            )
            break
        output = data.get("output") if isinstance(data, dict) else None
        text, finish, usage = _answer(output, spent)
        calls = _calls(output)
        if calls:  # (a call is not streamed: it comes whole)
            yield chunk({"tool_calls": [{"index": n, **call} for n, call in enumerate(calls)]})
            text = ""
        sent = "".join(streamed).strip()
        if not sent and text:  # an agent that streamed nothing: its answer in one piece
            yield chunk({"content": text})
        elif text.startswith(sent) and text[len(sent) :].strip():
            yield chunk({"content": text[len(sent) :]})
        yield chunk({}, finish)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": usage})
        break
    yield "data: [DONE]\n\n"
