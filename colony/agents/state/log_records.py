"""The records of the write-ahead action log (colony.agents.state.action_log), as stored and read
back, and the ids derived from an action's idempotency key.

Why apart: the log's records are data (validated with pydantic, bounded), used by whoever reads or
carries the log (the log itself, agent export); `effect_id` is what a capability uses to name what
its action creates after the action's key, so a redo of the action finds it made (docs/effects.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from colony.inference import InferenceRequest

log = logging.getLogger(__name__)

# A record's JSON may be this large; a larger result is recorded without its body (see docs).
MAX_RECORD_BYTES = 256 * 1024
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class LogRecord(BaseModel):
    """One record of the log, as stored (JSON) and as read back (validated, bounded).

    `kind` model/action: a call (`status` started: an action about to run; done: its result is
    `response` / `result`; `summary` is a model call of compaction's summariser, numbered apart
    from the planner's). `kind` truncate: records of this run with a step after `after_step`
    recorded before this marker no longer count."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    step: int = Field(ge=0, le=10_000_000)
    kind: Literal["model", "summary", "action", "truncate"]
    n: int = Field(0, ge=0, le=1_000_000)
    status: Literal["started", "done"] = "done"
    at: float = 0.0
    action: str | None = Field(None, max_length=200)
    capability: str | None = Field(None, max_length=200)
    effects: tuple[Annotated[str, Field(pattern=NAME_PATTERN)], ...] = Field((), max_length=16)
    shape: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # digest of what the call asked
    response: dict[str, Any] | None = None  # an InferenceResponse (validated when replayed)
    result: dict[str, Any] | None = None  # an ActionResult (validated when replayed)
    state: dict[str, Any] | None = None  # the action's capability's state right after it ran
    dropped_bytes: int | None = Field(None, ge=0)  # the result's body was larger than MAX_RECORD_BYTES
    after_step: int | None = Field(None, ge=0)

    @property
    def succeeded(self) -> bool | None:
        """Whether the recorded action succeeded (None: cut off before its result was recorded)."""
        if self.status != "done" or self.result is None:
            return None
        return bool(self.result.get("success"))

    @property
    def key(self) -> str:
        """The call's idempotency key."""
        return idempotency_key(self.run_id, self.step, self.kind, self.n)


def idempotency_key(run_id: str, step: int, kind: str, n: int) -> str:
    return f"{run_id}:{step}:{kind[0]}{n}"


def parse_records(items: Iterable[Any]) -> list[LogRecord]:
    """Stored ring items as records; an item that is not a valid record is skipped (logged)."""
    records = []
    for item in items:
        try:
            records.append(LogRecord.model_validate(item))
        except ValidationError as exc:
            log.warning("action log: skipped a stored record that is not one (%s)", exc.error_count())
    return records


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def model_shape(request: InferenceRequest) -> str:
    """What kind of model call this is (its system messages and output schema), not its prompt:
    a resumed step's prompt may hold events that came after the crash, but the call it makes in
    that place is the same one and gets the recorded answer."""
    system = [m.content for m in request.messages if m.role == "system"]
    return digest({"system": system, "format": request.response_format})


def action_shape(action: str, parameters: dict[str, Any]) -> str:
    return digest({"action": action, "parameters": parameters})


def bounded(
    fields: dict[str, Any], field: str, body: BaseModel, state: dict[str, Any] | None = None
) -> LogRecord:
    """The record of a call's answer (and of its capability's state); without them when they are
    larger than MAX_RECORD_BYTES together (or not JSON): an action's success and error are kept,
    a model response not at all."""
    try:
        dumped = body.model_dump(mode="json")
        size = len(json.dumps([dumped, state], separators=(",", ":")))
    except (ValueError, TypeError):  # an output that is not JSON cannot be stored, like a huge one
        dumped, size = None, MAX_RECORD_BYTES + 1
    if dumped is not None and size <= MAX_RECORD_BYTES:
        return LogRecord(**fields, **{field: dumped}, state=state)
    kept = None
    if field == "result":
        kept = {
            "success": bool(getattr(body, "success", False)),
            "error": (getattr(body, "error", None) or "")[:2000],
        }
    return LogRecord(**fields, **{field: kept}, dropped_bytes=size)


def effect_id(key: str, *parts: str, length: int = 16) -> str:
    """`length` hex digits naming what the action with idempotency `key` creates (`parts` tell
    apart several things one call creates, or whose they are): the same on every re-execution of
    that action, so a redo finds the session, child or entry the cut-off call made. A digest, so
    the key's text never reaches a Redis key."""
    text = "\n".join((key, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:length]
