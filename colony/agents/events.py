"""`@event_handler(pattern=...)`: capability methods fed by their scope's blackboard events.

A handler gets each `BlackboardEvent` whose key matches its glob; a dict it returns is added to
the agent's accumulated context, which the action policy sees on its next iteration.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from colony.blackboard.protocol import validate_pattern

EVENT_HANDLER_ATTR = "__colony_event_handler__"


def event_handler(pattern: str = "*") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark an async capability method `async def on_x(self, event) -> dict | None` as an event handler."""
    validate_pattern(pattern)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@event_handler needs an async method; {fn.__qualname__} is not")
        setattr(fn, EVENT_HANDLER_ATTR, pattern)
        return fn

    return mark


@dataclass(frozen=True)
class EventHandlerSpec:
    pattern: str
    handler: Callable[[Any], Awaitable[dict[str, Any] | None]]

    def matches(self, key: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern)


def discover_event_handlers(capability: object) -> list[EventHandlerSpec]:
    specs = []
    for attr in dir(type(capability)):
        pattern = getattr(getattr(type(capability), attr, None), EVENT_HANDLER_ATTR, None)
        if pattern is not None:
            specs.append(EventHandlerSpec(pattern, getattr(capability, attr)))
    return specs
