"""Where a run's time goes, step by step: spans published with each `step` run event.

Each step of a run is timed with what happened in it: the model calls (the planner's decisions,
summaries), the actions dispatched (with their name, and whether they came back blocked), and a
`wait` before it when the same agent object waited more than a second since its last step. An agent
suspended and hosted again is a new object: its wait is the gap between the previous step's
`ended_at` and this one's `began_at` (both in every step event). Hooks on the
agent's join points measure them (`ActionLog.model_call`, `ActionDispatcher.dispatch`,
`Agent.run_step`), so nothing in a policy or capability needs to know; the run capability adds
`spans` to the step event. Bounded: MAX_SPANS spans a step.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from colony.agents.hooks import HookContext, HookType, Pointcut
from colony.agents.models import ActionResult

if TYPE_CHECKING:
    from colony.agents.base import Agent

MAX_SPANS = 32
WAIT_MS = 1000.0  # a gap between two steps longer than this is reported as a wait


class StepSpans:
    """Times the steps, model calls and actions of one agent (hooks registered on construction)."""

    def __init__(self, agent: Agent, owner: Any) -> None:
        self.spans: list[dict[str, Any]] = []
        self._step_started: float | None = None
        self._last_step_ended: float | None = None
        register = agent.hooks.register
        register(Pointcut.for_instance(agent, "run_step"), HookType.AROUND, self._step, owner=owner)
        register(
            Pointcut.for_instance(agent.dispatcher, "dispatch"), HookType.AROUND, self._action, owner=owner
        )
        register(
            Pointcut.for_instance(agent.action_log, "model_call"), HookType.AROUND, self._model, owner=owner
        )

    def _add(self, span: dict[str, Any]) -> None:
        if len(self.spans) < MAX_SPANS:
            self.spans.append(span)

    async def _step(self, ctx: HookContext, proceed: Callable[[], Awaitable[Any]]) -> Any:
        self.spans = []
        self._step_started = time.time()
        run = getattr(ctx.instance, "current_run", None)
        if run is None or run.steps == 0:  # a run's first step: the time before it is not its wait
            self._last_step_ended = None
        if self._last_step_ended is not None and self._step_started - self._last_step_ended > WAIT_MS / 1000:
            self._add({"kind": "wait", "ms": round((self._step_started - self._last_step_ended) * 1000, 1)})
        try:
            return await proceed()
        finally:
            self._last_step_ended = time.time()

    async def _action(self, ctx: HookContext, proceed: Callable[[], Awaitable[Any]]) -> Any:
        started = time.perf_counter()
        result = await proceed()
        span: dict[str, Any] = {
            "kind": "action",
            "name": str(ctx.args[0] if ctx.args else ctx.kwargs.get("action")),
        }
        span["ms"] = round((time.perf_counter() - started) * 1000, 1)
        if isinstance(result, ActionResult):
            span["ok"] = result.success
            if result.blocked:
                span["blocked"] = True
        self._add(span)
        return result

    async def _model(self, ctx: HookContext, proceed: Callable[[], Awaitable[Any]]) -> Any:
        started = time.perf_counter()
        result = await proceed()
        channel = ctx.kwargs.get("channel", "model")
        usage = getattr(result, "usage", None)
        span = {
            "kind": "model",
            "channel": str(channel),
            "ms": round((time.perf_counter() - started) * 1000, 1),
        }
        if usage is not None:
            span["tokens"] = int(getattr(usage, "completion_tokens", 0) or 0)
        self._add(span)
        return result

    def take(self) -> dict[str, Any]:
        """What the step event carries: when the step began and ended, how long it took, its spans."""
        now = time.time()
        began = self._step_started
        took = round((now - began) * 1000, 1) if began is not None else None
        return {"began_at": began, "ended_at": now, "ms": took, "spans": list(self.spans)}
