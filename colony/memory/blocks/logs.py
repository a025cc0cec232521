"""Rolling LOG blocks: what one entry may hold, and how the prompt shows the last entries."""

from __future__ import annotations

from typing import Any

from colony.memory.blocks.directory import clean_text

MAX_LOG_FIELDS = 16
MAX_LOG_VALUE_CHARS = 1000


def bounded_log_value(value: Any) -> Any:
    """A log entry's field as stored: numbers and booleans as they are, the rest as text of at most
    MAX_LOG_VALUE_CHARS characters (a log keeps its last entries and their history: bounded)."""
    if isinstance(value, bool | int | float) or value is None:
        return value
    return clean_text(str(value))[:MAX_LOG_VALUE_CHARS]


def render_log(entries: list[dict[str, Any]], shown: int) -> str:
    """A LOG block's content as the prompt shows it: its last `shown` entries, one line each."""
    lines = []
    for entry in entries[-shown:]:
        kind = " ".join(str(entry.get("kind", "event")).split())[:32]
        text = " ".join(str(entry.get("text", "")).split())[:300]
        lines.append(f"- [{kind}] {text}")
    return "\n".join(lines)
