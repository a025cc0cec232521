"""Compaction for chats: the turns that left a session's prompt, summarised by the model.

A session turn's prompt holds the newest messages of the path that fit its token budget
(colony.context.session_agent). The older ones are not dropped silently: they are summarised, and
the summary goes in the prompt ahead of the messages. A summary covers a path from its first
message to one message (`SessionProtocol.summary_key(message_id)`), so it is shared by every branch
that runs through that message and never holds a message of another branch. It is brought up to
date incrementally (the previous summary and the messages after it, in calls that fit the engine's
window), and only once `session_summary_batch` more messages have left the prompt: until then the
turn says how many left since (recall, colony.memory.session, can still bring them back).

The summariser's calls are bounded (MAX_CALLS_PER_TURN a turn, each at most
`summariser_input_tokens` in and `session_summary_tokens` out), and one that fails never fails the
turn: the last good summary is used, with the messages it lacks counted.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from colony.context.prompt_fit import cut_to_fit
from colony.context.sessions import SessionStore
from colony.context.tree import Message
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.inference.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, engine_window

log = logging.getLogger(__name__)
MAX_CALLS_PER_TURN = 3
LINE_TOKENS = 160  # a message's share of a summariser call at most (cut in the middle beyond)
SUMMARY_SYSTEM = (
    "You keep a short running summary of a conversation between a user and an assistant. Keep "
    "every name, number, date, place and preference the user stated, in plain sentences. Write "
    "only the summary."
)
SPEAKERS = {"user": "User", "assistant": "Assistant", "system": "System"}


@dataclass(frozen=True)
class ChatSummary:
    """What a turn's prompt says of the messages that left it: `text` summarises the first
    `messages` of them (up to message `covers`); `pending` more left after it and are not in it."""

    text: str
    covers: str
    messages: int
    pending: int

    def render(self) -> str:
        """The summary as the system prompt shows it: one line, with nothing of a prompt's own
        structure (found by review: the model's summary could open a `## Memory blocks` section or a
        `<human>` block of lines the user never said): invisible characters dropped, `<` written
        `&lt;`, a leading `#` escaped."""
        folded = " ".join("".join(c for c in self.text if unicodedata.category(c) != "Cf").split())
        folded = folded.replace("<", "&lt;")
        folded = "\\" + folded if folded.startswith("#") else folded
        lines = ["## Summary of the earlier conversation", folded]
        if self.pending:
            lines.append(f"({self.pending} later messages are not in this summary.)")
        return "\n".join(lines)


def message_line(message: Message) -> str:
    """`Speaker: text` on one line (a summariser's input, a recalled message in a prompt)."""
    return f"{SPEAKERS.get(message.role, message.role)}: {' '.join(message.content.split())}"


class ChatSummaries:
    """The summaries of one session's paths, written with the session's engine."""

    def __init__(
        self,
        store: SessionStore,
        engine: InferenceEngine,
        counter: TokenCounter,
        *,
        max_tokens: int,
        batch: int,
        input_tokens: int,
    ) -> None:
        self.store, self.engine, self.counter = store, engine, counter
        self.max_tokens, self.batch = max_tokens, batch
        window = engine_window(engine)
        room = input_tokens if window is None else min(input_tokens, window - max_tokens - 64)
        self.input_tokens = max(room, 2 * LINE_TOKENS)

    async def of(self, dropped: Sequence[Message]) -> ChatSummary | None:
        """The summary of `dropped` (a path's first messages, oldest first), written or brought up
        to date when due; None when nothing left the prompt or nothing could be summarised yet."""
        if not dropped:
            return None
        found = await self.store.latest_summary([m.id for m in dropped])
        last, text = (found[0], str(found[1].get("text", ""))) if found is not None else (-1, "")
        done = last + 1
        pending = list(dropped[done:])
        if pending and (last < 0 or len(pending) >= self.batch):
            calls = 0
            while pending and calls < MAX_CALLS_PER_TURN:
                chunk, lines = await self._chunk(pending, text)
                calls += 1
                try:
                    written = await self._summarise(text, lines)
                except Exception as exc:  # the turn goes on with the last good summary
                    log.warning("session summary not written: %r", exc)
                    break
                if not written:  # nothing to keep: these messages wait for the next try
                    log.warning("session summary not written: the model answered nothing")
                    break
                text = written
                done += len(chunk)
                pending = pending[len(chunk) :]
                await self.store.keep_summary(chunk[-1].id, {"text": text, "messages": done})
        if done == 0 or not text.strip():
            return None
        return ChatSummary(text=text, covers=dropped[done - 1].id, messages=done, pending=len(pending))

    async def _chunk(self, pending: list[Message], summary: str) -> tuple[list[Message], list[str]]:
        """The oldest messages of `pending` whose lines fit one call beside `summary` (one at least,
        each line cut to LINE_TOKENS)."""
        used = await self.counter.count_messages(SUMMARY_SYSTEM) + await self.counter.count(summary) + 64
        taken: list[Message] = []
        lines: list[str] = []
        for message in pending:
            line = await cut_to_fit(message_line(message), LINE_TOKENS, self.counter)
            need = await self.counter.count(line) + MESSAGE_OVERHEAD_TOKENS
            if taken and used + need > self.input_tokens:
                break
            taken.append(message)
            lines.append(line)
            used += need
        return taken, lines

    async def _summarise(self, summary: str, lines: list[str]) -> str:
        words = max(20, self.max_tokens * 3 // 5)
        body = (
            f"Summary so far:\n{summary.strip() or '(nothing yet)'}\n\nMessages since:\n"
            + "\n".join(lines)
            + f"\n\nWrite the updated summary in at most {words} words."
        )
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=SUMMARY_SYSTEM),
                ChatMessage(role="user", content=body),
            ],
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        response = await self.engine.generate(request)
        return response.text.strip()
