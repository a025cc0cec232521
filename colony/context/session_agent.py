"""The session agent's capability (seed "consciousness streams", Example 1: the session agent).

One agent per session (the catalog's `session` agent spawns them, colony.system.builtin); its id is
the session id and its AGENT scope holds the session's conversation tree (colony.context.sessions).
A run of it is one turn: `handle_user_message` adds the user's message on the active branch and
emits it to the requester as the `user_chat_message` event, then `respond_to_user` writes the reply
with the replica's engine, streaming its tokens as `token` events, and adds it under the user's
message. The prompt is the system prompt and the linearised ACTIVE branch only: messages of other
branches, and messages reverted past, never reach the model.
"""

from __future__ import annotations

import contextlib
from typing import Any

from colony.agents import ActionType, Agent, AgentCapability, action_executor
from colony.blackboard import Blackboard
from colony.config import ContextSettings
from colony.context.action_log import current_idempotency_key
from colony.context.sessions import SessionStore
from colony.context.tree import Message, message_id_for
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly and accurately."


def prompt_messages(system_prompt: str, transcript: list[Message], max_chars: int) -> list[ChatMessage]:
    """The chat the model sees: the system prompt, then the newest messages of `transcript` whose
    text fits `max_chars` (older ones are left out whole, never cut mid-message; the newest one
    always goes in). Only the transcript given, i.e. one branch's path, is ever used."""
    kept: list[Message] = []
    used = 0
    for message in reversed(transcript):
        used += len(message.content)
        if kept and used > max_chars:
            break
        kept.append(message)
    kept.reverse()
    return [ChatMessage(role="system", content=system_prompt)] + [
        ChatMessage(role=m.role, content=m.content) for m in kept
    ]


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
        max_prompt_chars: int = 6000,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.engine = engine
        settings = getattr(getattr(replica, "settings", None), "context", None)
        self.settings: ContextSettings = (
            settings if isinstance(settings, ContextSettings) else ContextSettings()
        )
        self.max_tokens = max_tokens
        self.max_prompt_chars = max_prompt_chars
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
        its tokens; the reply is added under that message. Returns {"message", "context"}: the reply
        and the ids of the messages the prompt held. Run again with the same idempotency key after
        the reply was stored (re-executed after a crash), it returns that reply without calling
        the model again."""
        if self.engine is None:
            raise AgentUsageError("the session agent runs on an engine replica (no engine was injected)")
        user = await self._user_message()
        transcript = await self.store.path(user["id"])
        messages = prompt_messages(self.system_prompt, transcript, self.max_prompt_chars)
        context_ids = [m.id for m in transcript][-(len(messages) - 1) :]
        reply_id = _keyed_id()
        earlier = await self.store.stored(reply_id) if reply_id is not None else None
        if earlier is not None:  # stored by an attempt cut off after it: linked once, not rewritten
            text = earlier.content
        else:
            request = InferenceRequest(messages=messages, max_tokens=self.max_tokens)
            text = await self._write_reply(self.engine, request)
        reply = await self.store.add(
            "assistant",
            text[: self.settings.session_max_message_chars],
            parent_id=user["id"],
            run_id=self._run_id(),
            message_id=reply_id,
        )
        self.pending = {}
        return {"message": reply.model_dump(mode="json"), "context": context_ids}

    async def _write_reply(self, engine: InferenceEngine, request: InferenceRequest) -> str:
        """The model's reply, its tokens emitted as `token` events as they come."""
        parts: list[str] = []
        async with contextlib.aclosing(engine.stream(request)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    parts.append(chunk.text)
                    await self._emit("token", {"text": chunk.text})
        return "".join(parts).strip() or "(no reply)"


def _keyed_id() -> str | None:
    """The message id of the running action's idempotency key (None outside the action log)."""
    key = current_idempotency_key()
    return message_id_for(key) if key else None
