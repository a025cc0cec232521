"""Built-in agents `echo` (returns its input), `ask` (answers a question with the replica's
engine, streaming its tokens as run events) and `session` (starts chat sessions: one session agent
per session, docs/sessions.md). `colony.system.catalog` lists every built-in.

`echo` and `ask` are stateless services, so they are pools (docs/scaling.md): their runs are
served by up to `max_size` identical members at once instead of one agent's loop; the catalog
sizes them from `runs.echo_pool` / `runs.ask_pool`."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ResourceRequirements,
    ScriptedActionPolicy,
    action_executor,
)
from colony.agents.models import RunServing
from colony.agents.reply_stream import stream_reply
from colony.agents.state.action_log import current_idempotency_key
from colony.agents.state.log_records import effect_id
from colony.blackboard import Blackboard
from colony.config import ContextSettings
from colony.context.session_agent import MIN_PROMPT_ROOM, SessionCapability, prompt_budget
from colony.context.sessions import SESSION_ROLE, SessionStore, new_session_id, session_scope
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine, render_page_prefix
from colony.inference.tokens import TokenCounter
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.session import SessionMemoryCapability, session_memory_hierarchy
from colony.planning.functions import bounded_schema, choice_schema, read_choice, tool_prompt, tool_specs
from colony.wire.tenants import prefix_of

Spawner = Callable[[AgentBlueprint], Awaitable[Any]]
# what the session agents count against a replica's `serve.replica_memory_mb`: they hold a few
# messages at a time (the tree is in Redis, the model is the replica's), not the 256 MB default
SESSION_MEMORY_MB = 16
MAX_SESSION_PAGES = 8  # pages one session may be bound to (each takes an engine page slot)
PAGE_ID = re.compile(r"pg-[0-9a-f]{16}")  # colony.vcm.PageSource's page ids

RUNS_NAMESPACE = "runs"  # the namespace HTTP runs are served in
ECHO_POOL = RunServing(mode="pool", min_size=1, max_size=4)  # defaults of runs.echo_pool
ASK_POOL = RunServing(mode="pool", min_size=1, max_size=2)  # of runs.ask_pool (engine slots are few)


class EchoCapability(AgentCapability):
    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def echo(self, value: Any = None) -> Any:
        """Return the value unchanged."""
        return value


class AskCapability(AgentCapability):
    """Answers questions with the engine of the replica hosting the agent."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        engine: InferenceEngine | None = None,
        max_tokens: int = 256,
        system_prompt: str = "You are a helpful assistant. Answer briefly and accurately.",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.engine = engine
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt

    @action_executor(action_type=ActionType.ANALYZE)
    async def ask(
        self,
        question: str | None = None,
        messages: list[Any] | None = None,
        response_format: Any = None,
        max_tokens: int | None = None,
        tools: Any = None,
        tool_choice: Any = None,
    ) -> str | dict[str, Any]:
        """Answer a question; the answer's tokens stream to the requester as `token` events. The
        chat form (`messages`, OpenAI's {role, content}, as `POST /openai/v1/chat/completions`
        sends them; `response_format`: a JSON Schema the reply follows; `max_tokens`) answers
        {"content", "finish_reason", "usage"} (the engine's token counts) instead of the text."""
        if self.engine is None:
            raise AgentUsageError("the ask agent runs on an engine replica (no engine was injected)")
        if messages is None:
            if not isinstance(question, str):
                raise AgentUsageError("ask needs a `question` (text) or `messages` (a chat)")
            request = InferenceRequest(
                messages=[
                    ChatMessage(role="system", content=self.system_prompt),
                    ChatMessage(role="user", content=question),
                ],
                max_tokens=self.max_tokens,
            )
            return await stream_reply(self.agent, self.engine, request)
        if tools is not None and tool_choice != "none":  # the model answers or calls one of them
            return await self._call(messages, tools, tool_choice, max_tokens)
        return await self._chat(messages, response_format, max_tokens)

    def _request(
        self, messages: Any, max_tokens: Any, response_format: Any, note: str = ""
    ) -> InferenceRequest:
        chat = chat_of(messages)
        if chat[0].role != "system":
            chat.insert(0, ChatMessage(role="system", content=self.system_prompt))
        if note:
            chat[0] = ChatMessage(role="system", content=f"{chat[0].content}\n\n{note}")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_CHAT_TOKENS
        ):
            raise AgentUsageError(f"max_tokens must be 1 to {MAX_CHAT_TOKENS}")
        return InferenceRequest(
            messages=chat, max_tokens=max_tokens or self.max_tokens, response_format=response_format
        )

    async def _chat(self, messages: Any, response_format: Any, max_tokens: Any) -> dict[str, Any]:
        assert self.engine is not None
        report: dict[str, Any] = {}
        if response_format is not None:  # (bounded as the door bounds it: a run may come from anywhere)
            bounded_schema(response_format, "response_format")
        request = self._request(messages, max_tokens, response_format)
        text = await stream_reply(self.agent, self.engine, request, report)
        return {
            "content": text,
            "finish_reason": report.get("finish_reason") or "stop",
            **_usage(report.get("usage")),
        }

    async def _call(self, messages: Any, tools: Any, tool_choice: Any, max_tokens: Any) -> dict[str, Any]:
        """The chat form with functions offered: the model's choice, held to `choice_schema` (not
        streamed: its JSON is no reply until it is read)."""
        assert self.engine is not None
        if tool_choice not in (None, "auto", "required") and not isinstance(tool_choice, dict):
            raise AgentUsageError("tool_choice must be none, auto, required or {function: {name}}")
        specs = tool_specs(tools)
        note = tool_prompt(specs, required=tool_choice not in (None, "auto"))
        request = self._request(
            messages, max_tokens or MAX_CHAT_TOKENS // 8, choice_schema(specs, tool_choice), note
        )
        answer = await self.engine.generate(request)
        finish = "length" if answer.finish_reason == "length" else "stop"  # (cut: no choice it made)
        return {"finish_reason": finish, **read_choice(answer.text, specs), **_usage(answer.usage)}


def _usage(usage: Any) -> dict[str, Any]:
    return {
        "usage": {
            "prompt_tokens": usage.prompt_tokens if usage is not None else 0,
            "completion_tokens": usage.completion_tokens if usage is not None else 0,
        }
    }


MAX_CHAT_MESSAGES = 256
MAX_CHAT_CHARS = 400_000  # of a chat's messages together
MAX_CHAT_TOKENS = 8192
CHAT_ROLES = ("system", "user", "assistant", "tool")


def chat_of(messages: Any) -> list[ChatMessage]:
    """A chat's messages ({role, content} with a role of CHAT_ROLES and text), checked and bounded
    (they come from a client); AgentUsageError naming the first that is not."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_CHAT_MESSAGES:
        raise AgentUsageError(f"messages must be a list of 1 to {MAX_CHAT_MESSAGES} messages")
    chat, size = [], 0
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in CHAT_ROLES or not isinstance(content, str):
            raise AgentUsageError(
                f"messages[{index}] must be {{role: {'|'.join(CHAT_ROLES)}, content: text}}"
            )
        size += len(content)
        if size > MAX_CHAT_CHARS:
            raise AgentUsageError(f"messages hold more than {MAX_CHAT_CHARS} characters together")
        # a function's result reaches the model as a user turn (not every chat template knows `tool`)
        chat.append(ChatMessage(role="user" if role == "tool" else role, content=content))
    return chat


def echo_blueprint(agent_id: str = "echo", serving: RunServing = ECHO_POOL) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="echo"),
        capabilities=[EchoCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "echo", "parameters": {"value": "$input"}}]
        ),
        serving=serving,
    )


def single_echo_blueprint(agent_id: str = "echo-single") -> AgentBlueprint:
    """`echo` served by one agent's loop (mode `single`, what `echo` was before pools): the baseline
    benchmarks/http_submit.py measures the pool against (an `agents:` entry names this factory)."""
    return echo_blueprint(agent_id, serving=RunServing())


def ask_blueprint(
    agent_id: str = "ask", max_tokens: int = 256, serving: RunServing = ASK_POOL
) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="ask"),
        capabilities=[
            AskCapability.bind(max_tokens=max_tokens),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {
                    "action": "ask",
                    "parameters": {
                        "question": "$input.question",
                        "messages": "$input.messages",
                        "response_format": "$input.response_format",
                        "max_tokens": "$input.max_tokens",
                        "tools": "$input.tools",
                        "tool_choice": "$input.tool_choice",
                    },
                }
            ]
        ),
        serving=serving,
    )


class SessionStarterCapability(AgentCapability):
    """`start_session`: a new session agent (placed through the control plane) with an empty tree."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        spawner: Spawner | None = None,
        pages: Any = None,
        engine: InferenceEngine | None = None,
        replica: Any = None,
        max_tokens: int = 256,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.spawner = spawner
        self.page_table = pages  # the replica's page table (colony.vcm.PageTable), injected
        self.engine = engine
        context = getattr(getattr(replica, "settings", None), "context", None)
        self.context = context if isinstance(context, ContextSettings) else ContextSettings()
        self.max_tokens = max_tokens

    @action_executor(action_type=ActionType.AGENT_SPAWN, effects=("spawn",))
    async def start_session(self, pages: list[str] | None = None) -> dict[str, Any]:
        """Start a session; returns {"session_id"}: the id of its agent, which serves its turns.
        `pages`: page ids (a mapped folder's pages) the session talks about: its agent is bound to
        them (page-bound, placed on the replica holding them) and every turn's prompt starts with
        them, their KV cache reused from the page slots (docs/sessions.md)."""
        if self.spawner is None or self.agent is None:
            raise AgentUsageError("the session agent runs on a replica with a control plane (no spawner)")
        bound = await self._known(session_pages(pages))
        session_id = session_id_for(self.agent)
        # the tree first: the session exists for the API as soon as its agent is registered. Both
        # find what a cut-off call made (the tree is create-only; placing an id placed already
        # finds it where it runs, or resumes it): a redone call makes neither twice
        await SessionStore(self.agent.blackboard.scoped(session_scope_of(self.agent, session_id))).create()
        await self.spawner(
            session_blueprint(
                session_id,
                parent_id=self.agent.agent_id,
                max_tokens=self.max_tokens,
                pages=bound,
                memory=self.context.session_memory,
            )
        )
        return {"session_id": session_id}

    async def _known(self, bound: list[str]) -> list[str]:
        """The pages, each in the page table and no more than the engine holds at once (the API
        checks as much first; a run of `session` submitted directly must not place a session whose
        every turn would fail)."""
        if not bound:
            return bound
        capacity = self.engine.page_capacity() if self.engine is not None else None
        if capacity is not None and len(bound) > capacity:
            raise InvalidArgument(f"pages: {len(bound)} pages but an engine holds at most {capacity} at once")
        if self.page_table is None:
            raise AgentUsageError("a session about pages starts on an engine replica (no page table)")
        for index, page_id in enumerate(bound):
            if await self.page_table.page(page_id) is None:
                raise InvalidArgument(f"pages[{index}]: no page {page_id!r}; map its folder first")
        await self._fits(bound)
        return bound

    async def _fits(self, bound: list[str]) -> None:
        """Refuse pages whose tokens leave no room for a chat in an engine slot's prompt (each
        turn would fail), counted as the session agent counts them (`SessionCapability`)."""
        assert self.page_table is not None
        budget = prompt_budget(self.engine, self.context, self.max_tokens).prompt
        text = render_page_prefix([await self.page_table.content(page_id) for page_id in bound])
        tokens = await TokenCounter(self.engine).count(text)
        if budget - tokens < MIN_PROMPT_ROOM:
            raise InvalidArgument(
                f"pages: they take {tokens} of the {budget} prompt tokens an engine slot leaves, less than "
                f"{MIN_PROMPT_ROOM} for the chat; name fewer or smaller pages (page_tokens when mapping), "
                "or raise engine.slot_context_tokens"
            )


def session_pages(pages: Any) -> list[str]:
    """The page ids a session is bound to, checked (the run input comes from an HTTP body): a list
    of at most MAX_SESSION_PAGES page ids, each once."""
    if pages is None:
        return []
    if not isinstance(pages, list) or not all(isinstance(p, str) and PAGE_ID.fullmatch(p) for p in pages):
        raise InvalidArgument(
            "pages must be a list of page ids ('pg-' and 16 hex digits, from POST /v1/vcm/sources)"
        )
    bound = list(dict.fromkeys(pages))
    if len(bound) > MAX_SESSION_PAGES:
        raise InvalidArgument(f"a session names at most {MAX_SESSION_PAGES} pages (got {len(bound)})")
    return bound


def session_id_for(agent: Agent) -> str:
    """The id of the session the current `start_session` call starts: derived from the call's
    idempotency key (and the starter's colony), so the call redone after a crash between placing
    the session agent and recording its result starts the same session, not a second one; a
    fresh random id outside a run (no key). Started by another tenant's starter, it carries that
    tenant's prefix (colony.wire.tenants)."""
    meta = agent.metadata
    start = prefix_of(agent.agent_id, meta.tenant_id)  # another tenant's starter: its sessions are its
    key = current_idempotency_key()
    if key is None:
        return f"{start}{new_session_id()}"
    return f"{start}session-{effect_id(key, 'session', meta.tenant_id, meta.colony_id, agent.agent_id)}"


def session_scope_of(agent: Agent, session_id: str) -> str:
    metadata = agent.metadata
    return session_scope(session_id, tenant_id=metadata.tenant_id, colony_id=metadata.colony_id)


SESSION_PERSONA = {"name": "Colony", "style": "brief, accurate and friendly"}


def session_memory() -> list[Any]:
    """A session agent's memory (colony.memory.session): its turns in working -> STM -> LTM
    episodic, `persona` and `human` blocks (what the user says about themselves goes to `human`
    word for word), and recall of the turns that left the prompt."""
    return [
        *session_memory_hierarchy(),
        MemoryBlocksCapability.bind(
            templates=[("persona", SESSION_PERSONA), "human"],
            tool_log=False,
            user_blocks=["human"],
            include_recall=False,
        ),
        SessionMemoryCapability.bind(),
    ]


def session_blueprint(
    session_id: str,
    *,
    parent_id: str | None = None,
    max_tokens: int = 256,
    pages: list[str] | None = None,
    memory: bool = True,
) -> AgentBlueprint:
    """One session's agent: a turn (a run with input {"message"}) adds the user's message and the
    streamed reply to its conversation tree (colony.context.session_agent). With `pages` it is
    page-bound: placed on the replica holding them, its turns' prompts start with them. With
    `memory` (`context.session_memory`) it keeps memory (`session_memory`)."""
    bound = list(pages or [])
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=session_id,
            agent_type=AgentType.VCM_BOUND if bound else AgentType.SERVICE,
            role=SESSION_ROLE,
            parent_id=parent_id,
            bound_pages=bound,
        ),
        capabilities=[
            SessionCapability.bind(max_tokens=max_tokens, page_ids=bound),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
            *(session_memory() if memory else []),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {"action": "handle_user_message", "parameters": {"message": "$input.message"}},
                {"action": "respond_to_user", "parameters": {}},
            ]
        ),
        resources=ResourceRequirements(memory_mb=SESSION_MEMORY_MB, preferred_pages=bound),
    )


def session_starter_blueprint(agent_id: str = "session", max_tokens: int = 256) -> AgentBlueprint:
    """The catalog's `session` agent: each run starts one session (`POST /v1/sessions`)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="session-starter"),
        capabilities=[
            SessionStarterCapability.bind(max_tokens=max_tokens),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "start_session", "parameters": {"pages": "$input.pages"}}]
        ),
        resources=ResourceRequirements(memory_mb=SESSION_MEMORY_MB),
    )
