"""Ingestion transformers: how a scope turns what it pulled into entries of its own.

`SummarizingTransformer` consolidates a batch of source entries into one summary with the model of
the replica hosting the agent. The summary names its sources (provenance) and sources are never
deleted by it: the scope they live in prunes them on its own schedule, after the summary exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from colony.errors import AgentUsageError
from colony.inference import ChatMessage, InferenceRequest
from colony.memory.types import MemoryEntry, NewMemory

if TYPE_CHECKING:
    from colony.memory.capability import MemoryCapability

DEFAULT_PROMPT = (
    "Summarise these memories of an agent into a few factual sentences. Keep names, numbers, "
    "decisions and outcomes; drop repetition."
)
MAX_INPUT_CHARS = 6000


class SummarizingTransformer:
    """One summary entry per batch, written by the model (the capability's `engine`)."""

    def __init__(
        self, prompt: str = DEFAULT_PROMPT, *, max_tokens: int = 200, tags: Sequence[str] = ("summary",)
    ) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.tags = frozenset(tags)

    async def transform(
        self, entries: Sequence[MemoryEntry], capability: MemoryCapability
    ) -> list[NewMemory]:
        engine: Any = capability.engine
        if engine is None:
            raise AgentUsageError(
                "SummarizingTransformer needs the model of the replica hosting the agent; "
                "it runs inside a hosted agent (or pass engine= to the MemoryCapability)"
            )
        listing, used = [], 0
        for entry in entries:
            line = f"- {entry.content}"
            if used + len(line) > MAX_INPUT_CHARS:
                break
            listing.append(line)
            used += len(line)
        response = await engine.generate(
            InferenceRequest(
                messages=[
                    ChatMessage(role="system", content=self.prompt),
                    ChatMessage(role="user", content="\n".join(listing)),
                ],
                max_tokens=self.max_tokens,
                temperature=0.0,
            )
        )
        text = (response.text or "").strip() or "\n".join(listing)
        tags = set(self.tags)
        for entry in entries:
            tags |= {t for t in entry.tags if t.startswith("action_type:")}
        return [
            NewMemory(
                content=text[:4000],
                tags=frozenset(sorted(tags)[:32]),
                kind="summary",
                sources=[e.ref for e in entries][:256],
                importance=max((e.importance for e in entries), default=0.5),
                metadata={"summarised": len(entries)},
            )
        ]
