"""The write-ahead action log: every model result and action result of a run, recorded before the
agent acts on it, so a resumed run replays what was done and re-executes only what was not.

Interface used by the rest of Colony (the policy's `generate`, the dispatcher, checkpoints):
`model_call`, `action_call`, `step_calls`, and `current_idempotency_key()` for capabilities that
make external effects idempotent. The recording itself is built in this module (issue #17).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.agents.models import ActionResult
    from colony.inference import InferenceRequest, InferenceResponse

_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """The idempotency key of the action being executed (None outside an action): the same on
    every re-execution of that action, so a capability can make an external effect idempotent."""
    return _IDEMPOTENCY_KEY.get()


class ActionLog:
    """One agent's write-ahead log of its current run's model and action results."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def model_call(
        self, request: InferenceRequest, call: Callable[[], Awaitable[InferenceResponse]]
    ) -> InferenceResponse:
        return await call()

    async def action_call(
        self, action: str, parameters: dict[str, Any], call: Callable[[], Awaitable[ActionResult]]
    ) -> ActionResult:
        return await call()

    def step_calls(self, step: int) -> list[dict[str, Any]]:
        """The actions dispatched during `step` of the current run: `{"action", "capability",
        "effects", "key", "success"}` each (what an undo of that step reports it cannot undo)."""
        return []
