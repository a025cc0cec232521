"""A session turn's prompt with memory: blocks, recalled messages, and a summary of what left.

Without memory a turn's prompt is the system prompt and the newest messages of the path being
answered that fit its budget (colony.context.prompt_fit). With the agent's chat memory
(colony.agents.protocols.ChatMemory, colony.memory.session) it also holds:

- the agent's standing sections (its memory blocks) after the system prompt, in a quarter of the
  budget at most (cut in the middle past it);
- the earlier messages of the path that memory recalls for the user's message (relevance at
  least `context.session_recall_min_relevance`, at most `context.session_recalled`, not the two
  just before it), quoted right before the user's message in its turn ("Earlier in this
  conversation: - I said: ..."), where a small model uses them; they may still be in the window
  or may have left it. Only messages of this path: never one of another branch or reverted past;
- when the path no longer fits, a summary of the messages that left it (colony.context.chat_summary)
  in a share of the budget (a quarter at most) taken from the messages.

The tree keeps the user's message as sent: only the prompt quotes the recalled messages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from colony.agents.protocols import ChatMemory
from colony.config import ContextSettings
from colony.context.chat_summary import ChatSummaries
from colony.context.prompt_fit import MIN_CUT_TOKENS, SessionPrompt, cut_to_fit, prompt_messages
from colony.context.sessions import SessionStore
from colony.context.tree import Message
from colony.inference import ChatMessage
from colony.inference.engine import InferenceEngine
from colony.inference.tokens import TokenCounter

log = logging.getLogger(__name__)
RECALLED_HEADER = "Earlier in this conversation:"
RECALL_LINE_TOKENS = 80  # a recalled message's room in the prompt at most
ADJACENT = 2  # the messages just before the user's are in view already: never recalled
VOICES = {"user": "I said", "assistant": "You said"}  # the user's voice: it is their turn


@dataclass
class TurnPromptBuilder:
    """Builds one turn's prompt for a session agent (`SessionCapability.respond_to_user`)."""

    store: SessionStore
    engine: InferenceEngine
    counter: TokenCounter
    settings: ContextSettings
    system_prompt: str
    memory: ChatMemory | None
    who: str = "?"

    async def build(self, transcript: list[Message], room: int) -> tuple[SessionPrompt, dict[str, Any]]:
        """The prompt for the last message of `transcript` (the user's) within `room` tokens, and
        what entered it besides the window's messages (the `prompt_context` event)."""
        standing = await self._standing()
        if standing:  # a quarter of the room at most, whatever the blocks hold
            standing = [await cut_to_fit("\n\n".join(standing), room // 4, self.counter)]
        system = "\n\n".join([self.system_prompt, *standing])
        info: dict[str, Any] = {"left_out": 0, "summary": None, "recalled": [], "standing": len(standing)}
        recalled = await self._recalled(transcript, room // 4)
        if recalled:
            info["recalled"] = [{"id": i, "text": text, "relevance": round(r, 3)} for i, text, r in recalled]
            preface = "\n".join([RECALLED_HEADER, *(f"- {text}" for _, text, _ in recalled)])
            asked = transcript[-1].model_copy(update={"content": f"{preface}\n\n{transcript[-1].content}"})
            transcript = [*transcript[:-1], asked]
        prompt = await prompt_messages(system, transcript, counter=self.counter, budget=room)
        if len(prompt.context) == len(transcript):
            return prompt, info
        reserve = min(room // 4, self.settings.session_summary_tokens + 32)
        if reserve < MIN_CUT_TOKENS:  # no room a summary could say anything in
            return prompt, {**info, "left_out": len(transcript) - len(prompt.context)}
        prompt = await prompt_messages(system, transcript, counter=self.counter, budget=room - reserve)
        dropped = transcript[: len(transcript) - len(prompt.context)]
        info["left_out"] = len(dropped)
        summaries = ChatSummaries(
            self.store,
            self.engine,
            self.counter,
            max_tokens=min(self.settings.session_summary_tokens, reserve - 16),
            batch=self.settings.session_summary_batch,
            input_tokens=self.settings.summariser_input_tokens,
        )
        summary = await summaries.of(dropped)
        if summary is None:
            return prompt, info
        info["summary"] = {
            "covers": summary.covers,
            "messages": summary.messages,
            "pending": summary.pending,
            "text": summary.text,
        }
        extra = await cut_to_fit(summary.render(), reserve, self.counter)
        head = ChatMessage(role="system", content=f"{prompt.messages[0].content}\n\n{extra}")
        used = prompt.tokens + await self.counter.count(extra)
        return replace(prompt, messages=[head, *prompt.messages[1:]], tokens=used), info

    async def _standing(self) -> list[str]:
        if self.memory is None:
            return []
        try:
            return await self.memory.standing_sections()
        except Exception as exc:  # memory is an aid: a turn never fails for it
            log.warning("session %s: memory blocks left out of the prompt: %r", self.who, exc)
            return []

    async def _recalled(self, transcript: list[Message], room: int) -> list[tuple[str, str, float]]:
        """(id, "I said: text" / "You said: text", relevance) of earlier messages of the path
        memory recalls for the last one, within `room` tokens, best first."""
        wanted = self.settings.session_recalled
        if self.memory is None or wanted < 1 or len(transcript) <= ADJACENT + 1 or room < MIN_CUT_TOKENS:
            return []
        question = transcript[-1].content
        earlier = {m.id: m for m in transcript[: -1 - ADJACENT] if m.content.strip() != question.strip()}
        try:
            found = await self.memory.recalled(
                question, set(earlier), wanted, self.settings.session_recall_min_relevance
            )
        except Exception as exc:
            log.warning("session %s: recall left out of the prompt: %r", self.who, exc)
            return []
        picked: list[tuple[str, str, float]] = []
        left = room - await self.counter.count(RECALLED_HEADER)
        for message_id, relevance in found[:wanted]:
            message = earlier.get(message_id)
            share = min(RECALL_LINE_TOKENS, left)
            if message is None or share < MIN_CUT_TOKENS // 2:
                continue
            voice = VOICES.get(message.role, message.role)
            text = await cut_to_fit(f"{voice}: {' '.join(message.content.split())}", share, self.counter)
            picked.append((message_id, text, relevance))
            left -= await self.counter.count(text) + 2
        return picked
