"""Fitting a session turn's prompt into a token budget: the budget of a turn on an engine, and the
newest messages of a path that fit it, a message too long to fit cut in the middle.

Counted with the engine's own tokenizer (colony.inference.tokens.TokenCounter), so a turn always
fits the model's context whatever was said (docs/sessions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from colony.config import ContextSettings
from colony.context.tree import Message
from colony.inference import ChatMessage
from colony.inference.engine import InferenceEngine
from colony.inference.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, engine_window

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
