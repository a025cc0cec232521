"""The session agent's capability (seed "consciousness streams", Example 1: the session agent).

One agent per session (the catalog's `session` agent spawns them, colony.system.builtin); its id is
the session id and its AGENT scope holds the session's conversation tree (colony.context.sessions).
A run of it is one turn: `handle_user_message` adds the user's message on the active branch and
emits it to the requester as the `user_chat_message` event, then `respond_to_user` writes the reply
with the replica's engine, streaming its tokens as `token` events, and adds it under the user's
message. The prompt is the system prompt and the linearised ACTIVE branch only: messages of other
branches, and messages reverted past, never reach the model. It is built under a token budget
(`prompt_budget`: the engine's window less the reply and a margin), counted with the engine's own
tokenizer (colony.inference.tokens.TokenCounter), so a turn always fits the model's context: older
messages that do not fit are left out, and a message too long to fit on its own is cut in the
middle (colony.context.prompt_fit). With the agent's chat memory the prompt also holds its blocks,
recalled earlier messages and a summary of what left it (colony.context.turn_prompt).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from colony.agents import ActionType, Agent, AgentCapability, action_executor
from colony.agents.capability_set import capability_of
from colony.agents.protocols import ChatMemory
from colony.agents.reply_stream import stream_reply
from colony.agents.state.action_log import current_idempotency_key
from colony.blackboard import Blackboard
from colony.config import ContextSettings
from colony.context.prompt_fit import (
    FALLBACK_WINDOW,
    MIN_CUT_TOKENS,
    MIN_PROMPT_ROOM,
    PROMPT_MARGIN_TOKENS,
    PromptBudget,
    SessionPrompt,
    cut_marker,
    cut_to_fit,
    prompt_budget,
    prompt_messages,
)
from colony.context.sessions import SessionStore
from colony.context.tree import TurnUsage, message_id_for
from colony.context.turn_prompt import TurnPromptBuilder
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine, render_page_prefix
from colony.inference.tokens import TokenCounter

__all__ = [  # the prompt's fitting lives in colony.context.prompt_fit; its names are used from here too
    "FALLBACK_WINDOW",
    "MIN_CUT_TOKENS",
    "MIN_PROMPT_ROOM",
    "PROMPT_MARGIN_TOKENS",
    "PromptBudget",
    "SessionCapability",
    "SessionPrompt",
    "cut_marker",
    "cut_to_fit",
    "prompt_budget",
    "prompt_messages",
]
log = logging.getLogger(__name__)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly and accurately."


class SessionCapability(AgentCapability):
    """The user's messages in, the model's replies out, both kept in the session's tree."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        engine: InferenceEngine | None = None,
        replica: Any = None,
        max_tokens: int = 256,
        max_prompt_tokens: int | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        page_ids: list[str] | None = None,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.engine = engine
        self.replica = replica
        # a page-bound session's pages, the head of every prompt (not `pages`: the replica injects
        # its page table under that name)
        self.page_ids = list(page_ids or [])
        self._page_tokens: int | None = None
        settings = getattr(getattr(replica, "settings", None), "context", None)
        self.settings: ContextSettings = (
            settings if isinstance(settings, ContextSettings) else ContextSettings()
        )
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens  # a cap below the engine's budget (None: none)
        self._counter: TokenCounter | None = None
        self.system_prompt = system_prompt
        # the user message of the current run, so the reply step (redone after a restart too)
        # answers that message even if the active branch moved meanwhile
        self.pending: dict[str, Any] = {}

    def get_state(self) -> dict[str, Any]:
        return {"pending": self.pending}

    def set_state(self, state: dict[str, Any]) -> None:
        self.pending = dict(state.get("pending") or {})

    @property
    def store(self) -> SessionStore:
        return SessionStore(self.blackboard, self.settings)

    def _run_id(self) -> str | None:
        run = self.agent.current_run if self.agent is not None else None
        return run.run_id if run is not None else None

    async def _emit(self, event_type: str, data: Any) -> None:
        if self.agent is not None:
            await self.agent.emit_run_event(event_type, data)

    # the tree is the session's record, not part of the agent's checkpoints: an undo does not take a
    # message back out (effects, colony.agents.actions.EFFECTS)
    @action_executor(action_type=ActionType.MESSAGE_RECEIVE, effects=("memory_write",))
    async def handle_user_message(self, message: str) -> dict[str, Any]:
        """Add the user's message at the end of the active branch (the session's first message
        starts the `main` branch). Returns the stored message. Run again with the same
        idempotency key (re-executed after a crash), it returns the message stored the first time."""
        if not isinstance(message, str):
            raise InvalidArgument('a session turn\'s input is {"message": "<text>"}')
        run_id = self._run_id()
        stored = await self.store.add("user", message, run_id=run_id, message_id=_keyed_id())
        view = stored.model_dump(mode="json")
        self.pending = {"run_id": run_id, "user": view}
        await self._emit("user_chat_message", view)
        memory = self._memory()
        if memory is not None:
            try:
                await memory.heard(message)
            except Exception as exc:  # memory is an aid: a turn never fails for it
                log.warning("session %s: the user's statements were not kept: %r", self._who(), exc)
        return view

    async def _user_message(self) -> dict[str, Any]:
        """The user message of the current run: the one `handle_user_message` kept, else (its
        result was replayed from the action log after a restart, so it did not run here) the
        tree's newest user message of this run."""
        run_id = self._run_id()
        user = self.pending.get("user") or {}
        if user.get("id") and self.pending.get("run_id") == run_id:
            return dict(user)
        found = await self.store.added_by(run_id, "user") if run_id else None
        if found is None:
            raise AgentUsageError(
                "respond_to_user answers the message handle_user_message added in the same run"
            )
        return found.model_dump(mode="json")

    @action_executor(action_type=ActionType.MESSAGE_SEND, effects=("memory_write",))
    async def respond_to_user(self) -> dict[str, Any]:
        """Write the reply to the run's user message from the path that leads to it, streaming
        its tokens; the reply is added under that message. Returns {"message", "context", "cut"}:
        the reply, the ids of the messages the prompt held and of those of them cut to fit it
        (`prompt_messages`). Run again with the same idempotency key after the reply was stored
        (re-executed after a crash), it returns that reply without calling the model again."""
        if self.engine is None:
            raise AgentUsageError("the session agent runs on an engine replica (no engine was injected)")
        user = await self._user_message()
        transcript = await self.store.path(user["id"])
        budget = prompt_budget(self.engine, self.settings, self.max_tokens, self.max_prompt_tokens)
        room = budget.prompt - await self._pages_tokens()
        if room < MIN_PROMPT_ROOM:
            raise InvalidArgument(
                f"the session's pages take {budget.prompt - room} of the {budget.prompt} prompt tokens "
                "an engine slot leaves; bind it to fewer or smaller pages (page_tokens when mapping), "
                "or raise engine.slot_context_tokens"
            )
        builder = TurnPromptBuilder(
            self.store,
            self.engine,
            self.counter,
            self.settings,
            self.system_prompt,
            self._memory(),
            self._who(),
        )
        prompt, memory = await builder.build(transcript, room)
        await self._emit("prompt_context", memory)
        reply_id = _keyed_id()
        earlier = await self.store.stored(reply_id) if reply_id is not None else None
        if earlier is not None:  # stored by an attempt cut off after it: linked once, not rewritten
            text = earlier.content
            usage = earlier.usage or await self._usage({}, prompt.messages, text)
        else:
            request = InferenceRequest(
                messages=prompt.messages, max_tokens=budget.reply, page_ids=self.page_ids
            )
            report: dict[str, Any] = {}
            async with self._pages_in():
                text = await stream_reply(self.agent, self.engine, request, report) or "(no reply)"
            usage = await self._usage(report, prompt.messages, text)
        reply = await self.store.add(
            "assistant",
            text[: self.settings.session_max_message_chars],
            parent_id=user["id"],
            run_id=self._run_id(),
            message_id=reply_id,
            usage=usage,
        )
        self.pending = {}
        counts = reply.usage or usage
        return {
            "message": reply.model_dump(mode="json"),
            "context": prompt.context,
            "cut": prompt.cut,
            "memory": _brief(memory),
            "finish_reason": counts.finish_reason,
            "usage": {
                "prompt_tokens": counts.prompt_tokens,
                "completion_tokens": counts.completion_tokens,
                "total_tokens": counts.prompt_tokens + counts.completion_tokens,
            },
        }

    async def _usage(self, report: dict[str, Any], messages: list[ChatMessage], text: str) -> TurnUsage:
        """The turn's token counts and finish reason: the engine's (`report`, from stream_reply), or
        (an engine that reports none, a reply stored before replies kept them) counted with its
        tokenizer."""
        finish = report.get("finish_reason")
        finish = finish if finish in ("length", "loop") else "stop"
        usage = report.get("usage")
        if usage is not None:
            return TurnUsage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                finish_reason=finish,
            )
        prompt = await self.counter.count_messages(*(m.content for m in messages))
        prompt += await self._pages_tokens()
        return TurnUsage(
            prompt_tokens=prompt, completion_tokens=await self.counter.count(text), finish_reason=finish
        )

    def _who(self) -> str:
        return self.agent.agent_id if self.agent is not None else "?"

    def _memory(self) -> ChatMemory | None:
        """The agent's chat memory (colony.memory.session), if it has one."""
        return capability_of(self.agent, ChatMemory)

    def _pages_in(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The session's pages resident and pinned for the turn: faulted in on the replica hosting
        it (counted, the page table told; the agent may evict its own pages to fit them), or
        nothing to do for a session without pages."""
        if not self.page_ids:
            return contextlib.nullcontext()
        holder = self.agent.agent_id if self.agent is not None else None
        return self._paging().using(self.page_ids, holder)  # type: ignore[no-any-return]

    def _paging(self) -> Any:
        """The pages of the replica hosting the agent (colony.system.host_pages.ReplicaPages)."""
        paging = getattr(self.replica, "paging", None)
        if paging is None:
            raise AgentUsageError("a page-bound session runs on an engine replica (no replica was injected)")
        return paging

    async def _pages_tokens(self) -> int:
        """Tokens the session's pages take at the head of each prompt (counted once: pages never
        change, their ids are their content's hash)."""
        if not self.page_ids:
            return 0
        if self._page_tokens is None:
            paging = self._paging()
            pages = [await paging.fetch(page_id) for page_id in self.page_ids]
            self._page_tokens = await self.counter.count(render_page_prefix(pages))
        return self._page_tokens

    @property
    def counter(self) -> TokenCounter:
        """Token counts by the engine's tokenizer (chars/4 without one), kept for the agent's life:
        its cache spares counting the same messages again every turn."""
        if self._counter is None or self._counter.engine is not self.engine:
            self._counter = TokenCounter(self.engine)
        return self._counter


def _brief(memory: dict[str, Any]) -> dict[str, Any]:
    """What entered the prompt, without the texts (the turn's result keeps ids and counts)."""
    summary = memory.get("summary")
    return {
        "left_out": memory.get("left_out", 0),
        "summary": None if summary is None else {k: v for k, v in summary.items() if k != "text"},
        "recalled": [item["id"] for item in memory.get("recalled", [])],
        "standing": memory.get("standing", 0),
    }


def _keyed_id() -> str | None:
    """The message id of the running action's idempotency key (None outside the action log)."""
    key = current_idempotency_key()
    return message_id_for(key) if key else None
