"""Token counts and the token budget of a planning prompt.

Compaction decides on token counts, so they come from the engine's own tokenizer where the engine
has one (the embedded llama.cpp engine answers `/tokenize` on its localhost server; a vLLM engine
holds a Hugging Face tokenizer) and from a characters/4 estimate otherwise (an OpenAI-compatible
server, the scripted engine). A count that fails falls back to the estimate: a tokenizer hiccup
must never fail a run.

The budget (`Budget`) says when compaction triggers. A prompt may hold `limit` tokens: the
configured `context.token_budget`, else the engine's context window, and never more than the
window minus the planner's own output. The summariser's call must fit the window as well (the
failure the issue cites: a 175k context plus a 32k summary in a 200k window), so the trigger is
the lower of `limit` and `window - summary_max_tokens - summariser_input_tokens`; the
summariser's input is bounded by `summariser_input_tokens` (clamped to what the window leaves),
whatever the size of the history. The summary and the planner's output are clamped too
(`plan_budget`), so no setting makes a call larger than the window.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx

from colony.config import ContextSettings
from colony.inference.engine import InferenceEngine

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4.0
# chat-template tokens around each message (role markers, separators): a safe margin for SmolLM2's
# `<|im_start|>role\n ... <|im_end|>\n` and similar templates
MESSAGE_OVERHEAD_TOKENS = 8
# the smallest trigger that leaves room for anything; below it the summariser headroom is dropped
MIN_TRIGGER_TOKENS = 128
MIN_SUMMARY_TOKENS = 16  # the smallest summary a budget allows (context.summary_max_tokens' floor)
_CACHE_SIZE = 256
_MAX_TOKENIZE_CHARS = 2_000_000  # a text longer than this is estimated, not sent to a tokenizer


def estimate_tokens(text: str) -> int:
    """Characters / 4, rounded up: the estimate used where no tokenizer is at hand."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def engine_window(engine: InferenceEngine | None) -> int | None:
    """The context window of one request on this engine, when it is known.

    An engine may declare `context_window`; the embedded engine's window is its slot context
    (`engine.slot_context_tokens`), a vLLM engine's its `engine.max_model_len`. An OpenAI-compatible
    server or the scripted engine has none (None): only a configured `context.token_budget` applies."""
    if engine is None:
        return None
    declared = getattr(engine, "context_window", None)
    if isinstance(declared, int) and declared > 0:
        return declared
    settings = getattr(engine, "settings", None)
    kind = getattr(engine, "kind", None)
    if kind == "embedded" and settings is not None:
        return int(settings.slot_context_tokens)
    if kind == "vllm" and settings is not None and settings.max_model_len:
        return int(settings.max_model_len)
    return None


class TokenCounter:
    """Counts tokens of text with an engine's tokenizer (or estimates them); remembers recent
    counts, since the same prompt sections are counted again at every step."""

    def __init__(self, engine: InferenceEngine | None = None) -> None:
        self.engine = engine
        self.exact = getattr(engine, "kind", None) in ("embedded", "vllm")
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._warned = False

    async def count(self, text: str) -> int:
        if not text:
            return 0
        key = hash(text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        counted = await self._count(text)
        self._cache[key] = counted
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return counted

    async def count_messages(self, *texts: str) -> int:
        """Tokens of a chat request made of these messages, template overhead included."""
        return sum([await self.count(t) for t in texts]) + MESSAGE_OVERHEAD_TOKENS * len(texts)

    async def _count(self, text: str) -> int:
        if not self.exact or len(text) > _MAX_TOKENIZE_CHARS:
            return estimate_tokens(text)
        try:
            if self.engine is not None and self.engine.kind == "embedded":
                return await self._embedded(text)
            tokenizer: Any = getattr(self.engine, "_tokenizer", None)
            if tokenizer is not None:
                return len(tokenizer.encode(text))
        except Exception as exc:  # the estimate stands in; compaction goes on
            if not self._warned:
                log.warning("token count with the engine's tokenizer failed (%r); estimating chars/4", exc)
                self._warned = True
        return estimate_tokens(text)

    async def _embedded(self, text: str) -> int:
        """The llama.cpp server of the embedded engine tokenises on its localhost `/tokenize`
        (through the engine's own HTTP client when it has one: no connection of ours to close)."""
        engine: Any = self.engine
        await engine.start()
        shared = getattr(engine, "_http", None)
        if isinstance(shared, httpx.AsyncClient):
            response = await shared.post("/tokenize", json={"content": text})
        else:
            async with httpx.AsyncClient(base_url=engine.base_url, timeout=30.0) as http:
                response = await http.post("/tokenize", json={"content": text})
        response.raise_for_status()
        tokens = response.json().get("tokens")
        if not isinstance(tokens, list):
            raise ValueError("the tokenizer answered without a token list")
        return len(tokens)


@dataclass(frozen=True)
class Budget:
    """Token figures of one policy's planning prompt (see the module docstring)."""

    window: int | None  # the engine's context window (None: unknown)
    limit: int  # most tokens a planning prompt may hold
    trigger: int  # compaction starts above this
    summariser_input: int  # most history tokens one summariser call is given
    summary_max: int  # most tokens the summariser may write
    planner_max: int = 0  # most tokens the planner may write (its max_tokens, clamped to the window)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "limit": self.limit,
            "trigger": self.trigger,
            "summariser_input": self.summariser_input,
            "summary_max": self.summary_max,
            "planner_max": self.planner_max,
        }


def plan_budget(settings: ContextSettings, window: int | None, planner_max_tokens: int) -> Budget | None:
    """The budget of a planner writing at most `planner_max_tokens` on an engine with `window`;
    None when there is nothing to keep under (no configured budget and no known window).

    Clamped so that each call fits the window whatever the settings say: the planner's output to
    leave the prompt at least a quarter of the window (`planner_max`, which the policy asks for);
    the summary to at most a quarter of the window and of the limit (it must sit in the planning
    prompt beside the rest); the summariser's input to what the window leaves after the summary."""
    if settings.token_budget <= 0 and window is None:
        return None
    limit = settings.token_budget if settings.token_budget > 0 else int(window or 0)
    summary_max = settings.summary_max_tokens
    summariser_input = settings.summariser_input_tokens
    planner_max = max(1, planner_max_tokens)
    trigger = limit
    if window is not None:
        planner_max = min(planner_max, max(1, window - max(MIN_TRIGGER_TOKENS, window // 4)))
        limit = min(limit, max(1, window - planner_max))
        summary_max = max(MIN_SUMMARY_TOKENS, min(summary_max, window // 4))
        # the summariser's input is bounded to what its call can carry in the window
        summariser_input = max(64, min(summariser_input, window - summary_max - 4 * MESSAGE_OVERHEAD_TOKENS))
        headroom_trigger = window - summary_max - summariser_input
        trigger = min(limit, headroom_trigger) if headroom_trigger >= MIN_TRIGGER_TOKENS else limit
    summary_max = max(MIN_SUMMARY_TOKENS, min(summary_max, limit // 4))
    trigger = min(trigger, limit)
    return Budget(
        window=window,
        limit=limit,
        trigger=trigger,
        summariser_input=summariser_input,
        summary_max=summary_max,
        planner_max=planner_max,
    )
