"""Ingestion transformers: how a scope turns what it pulled into entries of its own.

`SummarizingTransformer` consolidates a batch of source entries into one summary with the model of
the replica hosting the agent. The summary names its sources (provenance) and sources are never
deleted by it: the scope they live in prunes them on its own schedule, after the summary exists.

Consolidation wants batches worth summarising: with `min_batch` the scope waits (`waits`: its
subscription's position stays, so the next look sees these entries and the newer ones) until that
many entries came, or until the oldest is `max_wait_seconds` old. With `keep_sources` the batch's
entries are copied as they are beside the summary (what was said stays word for word; the summary
adds an overview), and a model that fails or is missing leaves the copies alone instead of stopping
ingestion. A summary must be grounded in its sources (colony.memory.grounding: its names and
numbers are theirs, most of its words too): one that is not is dropped and counted, never stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.errors import AgentUsageError
from colony.inference import ChatMessage, InferenceRequest
from colony.memory.capability import copy_transform
from colony.memory.grounding import check_grounded
from colony.memory.types import MemoryEntry, NewMemory

if TYPE_CHECKING:
    from colony.memory.capability import MemoryCapability

DEFAULT_PROMPT = (
    "Summarise these memories of an agent into a few factual sentences. Keep names, numbers, "
    "decisions and outcomes; drop repetition."
)
MAX_INPUT_CHARS = 6000
SUMMARY_COVERAGE = 0.85  # of a summary's content words, the share its sources must hold
log = logging.getLogger(__name__)


class SummarizingTransformer:
    """One summary entry per batch, written by the model (the capability's `engine`); with
    `keep_sources`, the batch's entries copied beside it (module docstring)."""

    def __init__(
        self,
        prompt: str = DEFAULT_PROMPT,
        *,
        max_tokens: int = 200,
        tags: Sequence[str] = ("summary",),
        min_batch: int = 1,
        max_wait_seconds: float = 0.0,
        keep_sources: bool = False,
    ) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.tags = frozenset(tags)
        self.min_batch = max(1, min_batch)
        self.max_wait_seconds = max_wait_seconds
        self.keep_sources = keep_sources

    def waits(self, entries: Sequence[MemoryEntry], now: float | None = None) -> bool:
        """Whether to leave `entries` for a later, larger batch (fewer than `min_batch`, the oldest
        younger than `max_wait_seconds`)."""
        if not entries or len(entries) >= self.min_batch:
            return False
        oldest = min(e.created_at for e in entries)
        return (now or time.time()) - oldest < self.max_wait_seconds

    async def transform(
        self, entries: Sequence[MemoryEntry], capability: MemoryCapability
    ) -> list[NewMemory]:
        copies = copy_transform(entries, capability.ttl_seconds) if self.keep_sources else []
        try:
            summary = await self._summary(entries, capability)
        except Exception as exc:
            if not self.keep_sources:
                raise
            log.warning(
                "%s: no summary of %d entries (%r); copied them as they are",
                capability.name,
                len(entries),
                exc,
            )
            metrics.MEMORY_SUMMARIES.labels("failed").inc()
            return copies
        return [*copies, *summary]

    async def _summary(self, entries: Sequence[MemoryEntry], capability: MemoryCapability) -> list[NewMemory]:
        engine: Any = capability.engine
        if engine is None:
            raise AgentUsageError(
                "SummarizingTransformer needs the model of the replica hosting the agent; "
                "it runs inside a hosted agent (or pass engine= to the MemoryCapability)"
            )
        listing, shown, used = [], [], 0
        for entry in entries:  # an entry too long for what is left is skipped, not the end of the list
            line = f"- {entry.content}"
            if used + len(line) > MAX_INPUT_CHARS:
                continue
            listing.append(line)
            shown.append(entry)
            used += len(line)
        if not shown:
            return []
        entries = shown  # sources, grounding and the count name only what the model was shown
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
        text = (response.text or "").strip()
        said = [e.content for e in entries]
        verdict = check_grounded(text, said, min_coverage=SUMMARY_COVERAGE, pronouns=False)
        if not verdict.grounded:
            log.info("%s: summary not stored: %s", capability.name, verdict.reason)
            metrics.MEMORY_SUMMARIES.labels("ungrounded").inc()
            return []
        metrics.MEMORY_SUMMARIES.labels("stored").inc()
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
