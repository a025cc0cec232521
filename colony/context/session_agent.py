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
middle (`prompt_messages`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from colony.agents import ActionType, Agent, AgentCapability, action_executor
from colony.agents.protocols import ChatMemory
from colony.agents.reply_stream import stream_reply
from colony.agents.state.action_log import current_idempotency_key
from colony.blackboard import Blackboard
from colony.config import ContextSettings
from colony.context.chat_summary import ChatSummaries, message_line
from colony.context.sessions import SessionStore
from colony.context.tree import Message, message_id_for
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine, render_page_prefix
from colony.inference.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, engine_window

log = logging.getLogger(__name__)
RECALLED_HEADER = "## Recalled from earlier in this conversation"
RECALL_LINE_TOKENS = 80  # a recalled message's room in the prompt at most
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly and accurately."
# tokens left free in the window beside the prompt and the reply: the chat template's generation
# prompt and the rounding of counting each message apart
PROMPT_MARGIN_TOKENS = 32
# the window assumed for an engine that declares none (an OpenAI-compatible server, the scripted
# engine) and no `context.token_budget`: the embedded engine's default slot
FALLBACK_WINDOW = 4096
# an older message too long to fit on its own is cut only into at least this much room
MIN_CUT_TOKENS = 48
# the least prompt a page-bound session's pages must leave for its chat (the starter refuses less)
MIN_PROMPT_ROOM = 2 * MIN_CUT_TOKENS
_CUT_TRIES = 8


@dataclass(frozen=True)
class PromptBudget:
    """Token figures of one turn: the prompt holds at most `prompt` tokens (chat-template overhead
    included) and the reply is asked for at most `reply` tokens; with a known window, prompt +
    reply + PROMPT_MARGIN_TOKENS fits it."""

    prompt: int
    reply: int
    window: int | None


def prompt_budget(
    engine: InferenceEngine | None,
    settings: ContextSettings,
    max_tokens: int,
    cap: int | None = None,
) -> PromptBudget:
    """The budget of a turn on `engine` (colony.inference.tokens.engine_window). The reply gets
    `max_tokens`, at most half the window; the prompt the rest less a margin, lowered further by
    `context.token_budget` (when set) and `cap` (a SessionCapability parameter). An engine with no
    known window is given `context.token_budget`, else FALLBACK_WINDOW."""
    window = engine_window(engine)
    if window is None and settings.token_budget > 0:
        reply, prompt = max_tokens, settings.token_budget
    else:
        assumed = window if window is not None else FALLBACK_WINDOW
        reply = max(1, min(max_tokens, assumed // 2))
        prompt = assumed - reply - PROMPT_MARGIN_TOKENS
        if settings.token_budget > 0:
            prompt = min(prompt, settings.token_budget)
    if cap is not None:
        prompt = min(prompt, cap)
    return PromptBudget(prompt=max(prompt, 2 * MIN_CUT_TOKENS), reply=reply, window=window)


@dataclass(frozen=True)
class SessionPrompt:
    """The chat the model sees and what it holds: `context` the ids of the messages in it (oldest
    first), `cut` those of them shortened to fit, `tokens` its count."""

    messages: list[ChatMessage]
    context: list[str]
    cut: list[str]
    tokens: int


def cut_marker(removed: int) -> str:
    return f"\n[... {removed:,} characters cut from the middle of this message ...]\n"


def _cut(text: str, keep: int) -> str:
    """`text` with only its first and last `keep`/2 characters (about) and a marker between."""
    head = keep - keep // 2
    tail = keep // 2
    return text[:head] + cut_marker(len(text) - head - tail) + (text[len(text) - tail :] if tail else "")


async def cut_to_fit(text: str, tokens: int, counter: TokenCounter) -> str:
    """`text` cut in the middle (its head and tail kept, a marker saying how many characters went)
    so it counts at most `tokens`; the text itself when it fits already. Counted with `counter`
    (the engine's tokenizer), the kept length shrinking until the count fits; the marker alone
    when nothing more fits."""
    total = await counter.count(text)
    if total <= tokens:
        return text
    keep = int(len(text) * tokens / max(total, 1))
    for _ in range(_CUT_TRIES):
        if keep <= 0:
            break
        candidate = _cut(text, keep)
        used = await counter.count(candidate)
        if used <= tokens:
            return candidate
        keep = min(keep - 1, int(keep * tokens / used * 0.95))
    return _cut(text, 0)


async def prompt_messages(
    system_prompt: str,
    transcript: list[Message],
    *,
    counter: TokenCounter,
    budget: int,
) -> SessionPrompt:
    """The chat the model sees, at most `budget` tokens by `counter` (template overhead counted,
    MESSAGE_OVERHEAD_TOKENS a message): the system prompt, then the newest messages of
    `transcript` that fit, whole. Walking back from the newest, the first message that does not
    fit ends the prompt: it is left out with every older one when it would fit on its own (the
    newer ones took the room), and cut to the room left (head and tail kept, `cut_marker` between)
    when it is the newest message or too long to fit on its own at all, so a turn always fits and a
    long document stays in view, cut, on the turns after it. Only the transcript given, i.e. one
    branch's path, is ever used."""
    used = await counter.count_messages(system_prompt)
    room_all = budget - used  # what the messages may take together
    kept: list[tuple[Message, str]] = []
    cut: list[str] = []
    for message in reversed(transcript):
        need = await counter.count_messages(message.content)
        room = budget - used
        if need <= room:
            kept.append((message, message.content))
            used += need
            continue
        if not kept or (need > room_all and room - MESSAGE_OVERHEAD_TOKENS >= MIN_CUT_TOKENS):
            text = await cut_to_fit(message.content, max(room - MESSAGE_OVERHEAD_TOKENS, 0), counter)
            kept.append((message, text))
            cut.append(message.id)
            used += await counter.count_messages(text)
        break
    kept.reverse()
    messages = [ChatMessage(role="system", content=system_prompt)] + [
        ChatMessage(role=m.role, content=text) for m, text in kept
    ]
    return SessionPrompt(messages=messages, context=[m.id for m, _ in kept], cut=cut, tokens=used)


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
        prompt, memory = await self._fitted_prompt(user["content"], transcript, room)
        await self._emit("prompt_context", memory)
        reply_id = _keyed_id()
        earlier = await self.store.stored(reply_id) if reply_id is not None else None
        if earlier is not None:  # stored by an attempt cut off after it: linked once, not rewritten
            text = earlier.content
        else:
            request = InferenceRequest(
                messages=prompt.messages, max_tokens=budget.reply, page_ids=self.page_ids
            )
            async with self._pages_in():
                text = await stream_reply(self.agent, self.engine, request) or "(no reply)"
        reply = await self.store.add(
            "assistant",
            text[: self.settings.session_max_message_chars],
            parent_id=user["id"],
            run_id=self._run_id(),
            message_id=reply_id,
        )
        self.pending = {}
        return {
            "message": reply.model_dump(mode="json"),
            "context": prompt.context,
            "cut": prompt.cut,
            "memory": _brief(memory),
        }

    def _who(self) -> str:
        return self.agent.agent_id if self.agent is not None else "?"

    def _memory(self) -> ChatMemory | None:
        """The agent's chat memory (colony.memory.session), if it has one."""
        for capability in self.agent.capabilities.values() if self.agent is not None else ():
            if isinstance(capability, ChatMemory):
                return capability
        return None

    async def _fitted_prompt(
        self, question: str, transcript: list[Message], room: int
    ) -> tuple[SessionPrompt, dict[str, Any]]:
        """The turn's prompt within `room` tokens: the system prompt with the agent's standing
        memory sections (its blocks), the newest messages of the path that fit and, when older
        ones left, a summary of them and the ones memory recalls for `question`, in a share of the
        room (a third at most) kept from the messages. Also what entered it (`prompt_context`)."""
        memory = self._memory()
        standing: list[str] = []
        if memory is not None:
            try:
                standing = await memory.standing_sections()
            except Exception as exc:
                log.warning("session %s: memory blocks left out of the prompt: %r", self._who(), exc)
        system = "\n\n".join([self.system_prompt, *standing])
        prompt = await prompt_messages(system, transcript, counter=self.counter, budget=room)
        info: dict[str, Any] = {"left_out": 0, "summary": None, "recalled": [], "standing": len(standing)}
        if len(prompt.context) == len(transcript):
            return prompt, info
        settings = self.settings
        reserve = min(
            room // 3, settings.session_summary_tokens + RECALL_LINE_TOKENS * settings.session_recalled
        )
        prompt = await prompt_messages(system, transcript, counter=self.counter, budget=room - reserve)
        dropped = transcript[: len(transcript) - len(prompt.context)]
        info["left_out"] = len(dropped)
        extras = await self._compacted(question, dropped, memory, reserve, info)
        if extras:
            head = ChatMessage(role="system", content=f"{prompt.messages[0].content}\n\n{extras}")
            used = prompt.tokens + await self.counter.count(extras)
            prompt = replace(prompt, messages=[head, *prompt.messages[1:]], tokens=used)
        return prompt, info

    async def _compacted(
        self,
        question: str,
        dropped: list[Message],
        memory: ChatMemory | None,
        reserve: int,
        info: dict[str, Any],
    ) -> str:
        """The summary of `dropped` and the messages of it memory recalls, within `reserve` tokens."""
        settings = self.settings
        wanted = RECALL_LINE_TOKENS * settings.session_recalled if memory is not None else 0
        summary_room = reserve - min(wanted, reserve // 2)  # recall gets up to half, the summary the rest
        summaries = ChatSummaries(
            self.store,
            self.engine,  # type: ignore[arg-type]  # respond_to_user checked it
            self.counter,
            max_tokens=min(settings.session_summary_tokens, summary_room),
            batch=settings.session_summary_batch,
            input_tokens=settings.summariser_input_tokens,
        )
        parts: list[str] = []
        summary = await summaries.of(dropped)
        if summary is not None:
            parts.append(await cut_to_fit(summary.render(), summary_room, self.counter))
            info["summary"] = {
                "covers": summary.covers,
                "messages": summary.messages,
                "pending": summary.pending,
                "text": summary.text,
            }
        left = reserve - (await self.counter.count(parts[0]) if parts else 0)
        recalled = await self._recalled(question, dropped, memory, left)
        if recalled:
            parts.append("\n".join([RECALLED_HEADER, *(line for _, line in recalled)]))
            info["recalled"] = [{"id": message_id, "text": line[2:]} for message_id, line in recalled]
        return "\n\n".join(parts)

    async def _recalled(
        self, question: str, dropped: list[Message], memory: ChatMemory | None, room: int
    ) -> list[tuple[str, str]]:
        """(id, "- Speaker: text") of the dropped messages memory recalls, within `room` tokens."""
        wanted = self.settings.session_recalled
        if memory is None or wanted < 1 or room < MIN_CUT_TOKENS:
            return []
        by_id = {m.id: m for m in dropped}
        try:
            ids = await memory.recalled(question, set(by_id), wanted)
        except Exception as exc:
            log.warning("session %s: recall left out of the prompt: %r", self._who(), exc)
            return []
        lines: list[tuple[str, str]] = []
        left = room - await self.counter.count(RECALLED_HEADER) - MESSAGE_OVERHEAD_TOKENS
        for message_id in ids[:wanted]:
            share = min(RECALL_LINE_TOKENS, left)
            if share < MIN_CUT_TOKENS // 2:
                break
            line = await cut_to_fit("- " + message_line(by_id[message_id]), share, self.counter)
            lines.append((message_id, line))
            left -= await self.counter.count(line) + 1
        return lines

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
