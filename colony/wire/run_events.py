"""A run's status and event kinds as they cross the wire: what the agents write, what the API
streams as SSE and what the client waits for. One place, so the sides cannot drift apart."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


STARTED = "started"  # a run's first event: its request is being served
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
TERMINAL_EVENTS = frozenset({COMPLETED, FAILED, CANCELLED})
# A run interrupted mid-step (its replica died, or it was suspended mid-step) redoes that step from
# its last checkpoint: this event says so, once per redo, before the redo's own events. Events after
# `data.supersedes_after` and before it belong to the abandoned attempt (see docs/api.md, Run events).
RESTARTED = "restarted"


def terminal_event(status: RunStatus | str | None) -> str:
    """The terminal event that ends the event stream of a run that ended with `status` (a
    `RunStatus` or its value; anything else, e.g. an unknown or missing status, is `failed`)."""
    return {RunStatus.SUCCEEDED.value: COMPLETED, RunStatus.CANCELLED.value: CANCELLED}.get(
        status.value if isinstance(status, RunStatus) else str(status), FAILED
    )


def ended_status(event_type: Any) -> str:
    """The run status a terminal event reports (`terminal_event` the other way): `succeeded`,
    `cancelled`, else `failed`."""
    return {COMPLETED: RunStatus.SUCCEEDED.value, CANCELLED: RunStatus.CANCELLED.value}.get(
        event_type if isinstance(event_type, str) else "", RunStatus.FAILED.value
    )


def is_terminal(event: dict[str, Any]) -> bool:
    """Whether a run event (written by an agent: any JSON) is a terminal one."""
    kind = event.get("event_type")
    return isinstance(kind, str) and kind in TERMINAL_EVENTS


class AgentRunEvent(BaseModel):
    """One event of a streamed run.

    `seq` numbers a request's events 1, 2, 3, ... across restarts (never reused). `attempt` is the
    attempt at the run the event belongs to: 1, and one more after each `restarted` event.
    `during_step` is the index (0-based) of the run step in progress when the event was emitted,
    None for events outside a step (`started`, `step`, `restarted`, terminal ones): a restored run
    redoing step `n` supersedes the events its abandoned attempt emitted during steps `>= n`."""

    request_id: str
    event_type: str
    data: Any = None
    seq: int = 0
    attempt: int = 1
    during_step: int | None = None
    ts: float = Field(default_factory=time.time)
