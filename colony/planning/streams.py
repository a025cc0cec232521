"""Consciousness streams: filtered, ordered slices of an agent's experience, rendered into the prompt.

The policy feeds every event context and every action call to every stream; each stream's filters
decide what it records and its formatter decides how it reads. Nothing domain-specific lives in
the policy. Filters are top-level classes (picklable); streams and formatters travel as blueprints.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from colony.agents.blueprint import Bindable, Blueprint

MAX_PINNED = 32  # pinned entries a stream keeps past its window (the newest; older ones go)

EventFilter = Callable[[dict[str, Any]], bool]
ActionFilter = Callable[[dict[str, Any]], bool]


class EventContextKeyFilter:
    """Accept events whose accumulated context has any of these context keys."""

    def __init__(self, *keys: str) -> None:
        self.keys = tuple(keys)

    def __call__(self, contexts: dict[str, Any]) -> bool:
        return any(key in contexts for key in self.keys)


class ActionKeySubstringFilter:
    """Accept action calls whose action_key contains any of these substrings."""

    def __init__(self, *substrings: str) -> None:
        self.substrings = tuple(substrings)

    def __call__(self, call: dict[str, Any]) -> bool:
        key = str(call.get("action_key", ""))
        return any(s in key for s in self.substrings)


class SuccessfulActionFilter:
    """Another action filter, and the call succeeded."""

    def __init__(self, inner: ActionFilter | None = None) -> None:
        self.inner = inner

    def __call__(self, call: dict[str, Any]) -> bool:
        return bool(call.get("success")) and (self.inner is None or self.inner(call))


class AnyOf:
    def __init__(self, *filters: Callable[[dict[str, Any]], bool]) -> None:
        self.filters = filters

    def __call__(self, item: dict[str, Any]) -> bool:
        return any(f(item) for f in self.filters)


class AllOf:
    def __init__(self, *filters: Callable[[dict[str, Any]], bool]) -> None:
        self.filters = filters

    def __call__(self, item: dict[str, Any]) -> bool:
        return all(f(item) for f in self.filters)


class ConsciousnessStreamFormatter(Bindable, ABC):
    """Renders a stream's entries into one markdown prompt section ("" when there is nothing)."""

    @abstractmethod
    def format(self, entries: list[dict[str, Any]]) -> str: ...


def _preview(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConversationFormatter(ConsciousnessStreamFormatter):
    """A chat thread: user events as `**User**: ...`, the agent's actions as `**You (Agent)**: ...`."""

    def __init__(
        self,
        user_context_key: str = "user_chat_message",
        message_field: str = "message",
        section_title: str = "## Conversation",
    ) -> None:
        self.user_context_key = user_context_key
        self.message_field = message_field
        self.section_title = section_title

    def format(self, entries: list[dict[str, Any]]) -> str:
        lines = []
        for entry in entries:
            if entry["kind"] == "event":
                context = entry["contexts"].get(self.user_context_key)
                if context is None:
                    continue
                message = context.get(self.message_field) if isinstance(context, dict) else context
                lines.append(f"**User**: {message}")
            else:
                call = entry["call"]
                output = call.get("output_preview", call.get("output"))
                lines.append(
                    f"**You (Agent)**: {output if isinstance(output, str) else _preview(output, 2000)}"
                )
        return "\n".join([self.section_title, "", *lines]) if lines else ""


class JSONStreamFormatter(ConsciousnessStreamFormatter):
    """A flat bullet list: `- <context key or action key>: <value, truncated>`."""

    def __init__(self, section_title: str = "## Recent Activity", max_value_chars: int = 300) -> None:
        self.section_title = section_title
        self.max_value_chars = max_value_chars

    def format(self, entries: list[dict[str, Any]]) -> str:
        lines = []
        for entry in entries:
            if entry["kind"] == "event":
                for key, value in entry["contexts"].items():
                    lines.append(f"- {key}: {_preview(value, self.max_value_chars)}")
            else:
                call = entry["call"]
                failed = not call.get("success", True)
                status = " (failed)" if failed else ""
                # a failure shows its error: that is what the planner needs to see
                value = (
                    call.get("error")
                    if failed and call.get("error")
                    else call.get("output_preview", call.get("output"))
                )
                lines.append(f"- {call.get('action_key')}{status}: {_preview(value, self.max_value_chars)}")
        return "\n".join([self.section_title, "", *lines]) if lines else ""


class ConsciousnessStream(Bindable):
    """One stream: filters decide membership, the formatter decides shape; a rolling window."""

    def __init__(
        self,
        name: str,
        formatter: ConsciousnessStreamFormatter | Blueprint[ConsciousnessStreamFormatter],
        event_filter: EventFilter | None = None,
        action_filter: ActionFilter | None = None,
        max_entries: int = 20,
    ) -> None:
        self.name = name
        self.formatter = formatter.local_instance() if isinstance(formatter, Blueprint) else formatter
        self.event_filter = event_filter
        self.action_filter = action_filter
        self.max_entries = max_entries
        self.entries: list[dict[str, Any]] = []
        # entries the window dropped, kept for compaction to summarise (None: dropped for good).
        # A policy with a token budget sets a list here and drains it (colony.planning.compaction).
        self.overflow: list[dict[str, Any]] | None = None
        # event context keys whose entries the window keeps (the policy's pinned keys: user
        # corrections); set by the policy's compactor
        self.pinned_keys: frozenset[str] = frozenset()

    def is_pinned(self, entry: dict[str, Any]) -> bool:
        """An event entry whose contexts hold a pinned key (a user correction): never dropped by the
        window nor compacted."""
        return entry.get("kind") == "event" and bool(self.pinned_keys & set(entry.get("contexts") or {}))

    def _append(self, entry: dict[str, Any]) -> None:
        """Add an entry; past `max_entries` the oldest go (to `overflow` when it is a list). The
        newest MAX_PINNED pinned entries are not counted against the window and stay, however
        old: the stream holds at most `max_entries + MAX_PINNED` entries."""
        self.entries.append(entry)
        if len(self.entries) <= self.max_entries:
            return
        pinned = [id(e) for e in self.entries if self.is_pinned(e)][-MAX_PINNED:]
        kept = set(pinned)
        others = [e for e in self.entries if id(e) not in kept]
        over = len(others) - self.max_entries
        if over <= 0:
            return
        gone = {id(e) for e in others[:over]}
        if self.overflow is not None:
            self.overflow.extend(e for e in self.entries if id(e) in gone)
        self.entries = [e for e in self.entries if id(e) not in gone]

    def consider_event(self, contexts: dict[str, Any]) -> None:
        if contexts and self.event_filter is not None and self.event_filter(contexts):
            self._append({"kind": "event", "timestamp": time.time(), "contexts": dict(contexts)})

    def consider_action(self, call: dict[str, Any]) -> None:
        if self.action_filter is not None and self.action_filter(call):
            self._append({"kind": "action", "timestamp": time.time(), "call": dict(call)})

    def render(self) -> str:
        return self.formatter.format(self.entries)
