"""What an agent's lower layers call in the layers above them, typed as protocols: the upper layer
implements them, the lower one imports only this module (docs/architecture.md). A capability that
implements one is found among the agent's capabilities with `isinstance`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class HistorySummaryLog(Protocol):
    """Keeps the summaries a planner's compaction writes of its earlier history (the memory blocks
    capability's `history_summary` log block)."""

    async def log_history_summary(self, text: str, *, items: int, ref: str) -> None: ...
