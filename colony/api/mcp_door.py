"""A Model Context Protocol server over Colony (the official `mcp` SDK): tools `list_agents`,
`recall`, `remember`, `block_read`, `block_append`, `run_agent` (its progress as notifications),
`start_session` and `chat` (a session's turn, the reply's pieces as notifications), and resources
for an agent's memory map and blocks. docs/clients.md.

Two ways in, one set of tools: mounted by the API at `/mcp/` (streamable HTTP, the same token), or
`colony mcp --stdio` for local clients (it calls a colony's API with a token). Every tool is a call
of Colony's own REST API made with the caller's token (`Backend`), so the same verbs, tenants,
agents, quotas, limits and audit trail hold as on HTTP, and a refusal is the API's message.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from colony.api.limits import send_error
from colony.system.runs import RunService
from colony.wire.ids import ID_PATTERN, ID_RULE
from colony.wire.run_events import is_terminal

_ID = re.compile(ID_PATTERN)
RUN_WAIT_SECONDS = 600.0  # run_agent waits this long at most for the run's end
TEXT_CHARS = 100_000  # a tool's text answer is cut here (with a note)
MAX_PAGES = 64  # page ids start_session takes (the API refuses more than an engine holds)


class Backend(Protocol):
    """Colony's API as a tool calls it: with the caller's token."""

    async def call(self, method: str, path: str, **kwargs: Any) -> Any: ...

    def events(self, run_id: str) -> AsyncIterator[dict[str, Any]]: ...


async def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise ToolError(f"{response.status_code}: {message}")
    return response.json() if response.content else None


class HttpBackend:
    """A colony's API through `client` (over HTTP for `colony mcp --stdio`; in the API's own
    process, one client on its ASGI app for every call), as `authorization` (the caller's
    `Bearer ...`)."""

    def __init__(
        self, client: httpx.AsyncClient, authorization: str, *, runs: RunService | None = None
    ) -> None:
        self.client, self.auth = client, {"Authorization": authorization}
        self.runs = runs  # in the API's process: a run's events read where they are (streamed)

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self.client.request(method, path, headers=self.auth, **kwargs)
        except httpx.HTTPError as exc:  # (stdio: the colony is away) said, not a bare failure
            raise ToolError(f"Colony's API at {self.client.base_url} did not answer: {exc!r}") from None
        return await _answer(response)

    async def events(self, run_id: str) -> AsyncIterator[dict[str, Any]]:
        await self.call("GET", f"/v1/runs/{run_id}")  # (the token sees the run, or this is a 404)
        if self.runs is not None:
            async for _, event in self.runs.events(run_id):
                yield event
            return
        path = f"/v1/runs/{run_id}/events"
        async with self.client.stream("GET", path, headers=self.auth, timeout=RUN_WAIT_SECONDS) as stream:
            if stream.status_code >= 400:
                await stream.aread()
                await _answer(stream)
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: ") :])
                    if isinstance(event, dict):
                        yield event

    async def close(self) -> None:
        await self.client.aclose()


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, indent=1)
    return text if len(text) <= TEXT_CHARS else f"{text[:TEXT_CHARS]}\n[cut at {TEXT_CHARS} characters]"


def build_server(backend_of: Callable[[Context], Awaitable[Backend]]) -> MCPServer:
    """The MCP server; `backend_of(ctx)`: Colony's API for the request `ctx` belongs to."""
    server = MCPServer(
        name="colony",
        instructions=(
            "Colony's agents, their memory and memory blocks. list_agents names the agents you may use; "
            "recall and remember read and write an agent's memory; block_read and block_append its "
            "memory blocks; run_agent runs an agent on an input and reports its progress; "
            "start_session and chat hold a conversation that the session remembers."
        ),
    )

    @server.tool()
    async def list_agents(ctx: Context) -> str:
        """The agents this token may use: id, role and state of each."""
        agents = await (await backend_of(ctx)).call("GET", "/v1/agents")
        return _text([{k: a.get(k) for k in ("agent_id", "role", "state")} for a in agents])

    @server.tool()
    async def recall(agent: str, query: str, ctx: Context, limit: int = 5) -> str:
        """The entries of an agent's memory most relevant to `query`, most relevant first."""
        body = {"query": query, "max_results": max(1, min(limit, 50))}
        found = await (await backend_of(ctx)).call("POST", f"/v1/agents/{_id(agent)}/memory/query", json=body)
        return _text(found)

    @server.tool()
    async def remember(agent: str, content: str, ctx: Context, scope: str = "working") -> str:
        """Store `content` in one of an agent's memory scopes (default: working memory)."""
        body = {"scope": scope, "content": content}
        return _text(await (await backend_of(ctx)).call("POST", f"/v1/agents/{_id(agent)}/memory", json=body))

    @server.tool()
    async def block_read(agent: str, label: str, ctx: Context) -> str:
        """One of an agent's memory blocks (its own, one shared with it, or a colony block)."""
        return _text(
            await (await backend_of(ctx)).call("GET", f"/v1/agents/{_id(agent)}/blocks/{_id(label)}")
        )

    @server.tool()
    async def block_append(agent: str, label: str, text: str, ctx: Context) -> str:
        """Add `text` at the end of one of an agent's memory blocks."""
        path = f"/v1/agents/{_id(agent)}/blocks/{_id(label)}/append"
        return _text(await (await backend_of(ctx)).call("POST", path, json={"text": text}))

    @server.tool()
    async def run_agent(agent: str, ctx: Context, input: Any = None) -> str:
        """Run an agent on `input` (any JSON) and answer its output; its progress (steps, the
        reply's pieces) comes as progress notifications while it runs."""
        backend = await backend_of(ctx)
        submitted = await backend.call("POST", "/v1/runs", json={"agent": _id(agent), "input": input})
        return _text((await _followed(backend, ctx, str(submitted["run_id"]))).get("output"))

    @server.resource("colony://agents/{agent}/memory", mime_type="application/json")
    async def memory_map(agent: str, ctx: Context) -> str:
        """An agent's memory: its scopes, what each holds, and where entries go next."""
        return _text(await (await backend_of(ctx)).call("GET", f"/v1/agents/{_id(agent)}/memory"))

    @server.resource("colony://agents/{agent}/blocks", mime_type="application/json")
    async def blocks(agent: str, ctx: Context) -> str:
        """The memory blocks an agent sees, with their sizes and its access."""
        return _text(await (await backend_of(ctx)).call("GET", f"/v1/agents/{_id(agent)}/blocks"))

    _add_session_tools(server, backend_of)
    return server


def _add_session_tools(server: MCPServer, backend_of: Callable[[Context], Awaitable[Backend]]) -> None:
    """`start_session` and `chat`: a conversation the session agent keeps."""

    @server.tool()
    async def start_session(ctx: Context, pages: list[str] | None = None) -> str:
        """Start a chat session (optionally bound to mapped pages, which start every prompt); answers
        its id for `chat`. The session keeps the conversation, its memory and its blocks."""
        if pages is not None and (not isinstance(pages, list) or len(pages) > MAX_PAGES):
            raise ToolError(f"pages: a list of at most {MAX_PAGES} page ids")
        body = {"pages": [_id(p) for p in pages]} if pages else {}
        return _text(await (await backend_of(ctx)).call("POST", "/v1/sessions", json=body))

    @server.tool()
    async def chat(session: str, message: str, ctx: Context) -> str:
        """Say `message` in a session (from start_session) and answer the reply; the reply's pieces
        come as progress notifications while the model writes it."""
        backend = await backend_of(ctx)
        submitted = await backend.call(
            "POST", f"/v1/sessions/{_id(session)}/turns", json={"message": message}
        )
        output = (await _followed(backend, ctx, str(submitted["run_id"]))).get("output")
        reply = output.get("message") if isinstance(output, dict) else None
        return _text(reply.get("content") if isinstance(reply, dict) else output)


async def _followed(backend: Backend, ctx: Context, run_id: str) -> dict[str, Any]:
    """The run's view once it ended, each of its events reported as progress meanwhile (a token's
    text, else the event's kind); ToolError for a run that did not succeed."""
    seen = 0
    async for event in backend.events(run_id):
        seen += 1
        kind = str(event.get("event_type", "event"))
        data = event.get("data")
        piece = data.get("text") if kind == "token" and isinstance(data, dict) else None
        await ctx.report_progress(seen, None, piece if isinstance(piece, str) else kind)
        if is_terminal(event):
            break
    view = await backend.call("GET", f"/v1/runs/{run_id}")
    if not isinstance(view, dict) or view.get("status") != "succeeded":
        status, error = (view.get("status"), view.get("error")) if isinstance(view, dict) else (None, None)
        raise ToolError(f"run {run_id} {status}: {error}")
    return view


def _id(text: str) -> str:
    """A path segment from a tool's argument, only if it reads as an id (an agent id, a block
    label): anything else (`/`, `%2F`, `?`, `#`) could name another route."""
    if not isinstance(text, str) or not _ID.match(text):
        raise ToolError(f"{str(text)[:40]!r} is no agent id or label ({ID_RULE})")
    return text


class StartedOnFirstCall:
    """The MCP app's own lifespan (its session manager's task group), entered on the first call in
    a task of its own and kept for the process's life: mounted in the API, no server runs a
    mounted app's lifespan (Serve's replica and the tests' servers run none)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._ready: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "GET":  # stateless: no stream to hold
            await send_error(
                send, 405, "method_not_allowed", "POST MCP messages to /mcp/", [(b"allow", b"POST, DELETE")]
            )
            return
        if self._ready is None:
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="mcp-lifespan")
        await self._ready.wait()
        if self._failed is not None:
            failed, self._ready, self._failed = self._failed, None, None  # (the next call tries again)
            raise RuntimeError(f"the MCP server did not start: {failed!r}")
        await self.app(scope, receive, send)

    async def _run(self) -> None:
        assert self._ready is not None
        try:
            async with self.app.router.lifespan_context(self.app):
                self._ready.set()
                await asyncio.Event().wait()  # (until the process ends)
        except BaseException as exc:
            self._failed = exc
            self._ready.set()
            raise


def mounted_app(api_app: Any, ctx: Any) -> StartedOnFirstCall:
    """The MCP server as the API mounts it at /mcp/: its tools call the API's own ASGI app with the
    token of the MCP request they serve."""
    client = httpx.AsyncClient(
        base_url="http://colony", transport=httpx.ASGITransport(app=api_app), timeout=120
    )

    async def backend_of(context: Context) -> Backend:
        request = context.request_context.request
        authorization = request.headers.get("authorization", "") if request is not None else ""
        return HttpBackend(client, authorization, runs=(await ctx.services()).runs)

    server = build_server(backend_of)
    # any Host: a colony is reached by its name, its address or a proxy, and every call needs the
    # bearer token, which a page a browser was led to cannot send (no DNS-rebinding use)
    anywhere = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(
        streamable_http_path="/", stateless_http=True, transport_security=anywhere
    )
    return StartedOnFirstCall(app)
