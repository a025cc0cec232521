"""Memory producers: what an agent's behaviour leaves in memory, extracted by hooks.

`action_producer()` turns every dispatched action into a working-memory entry tagged with the
action, its type and its outcome; `conversation_producer()` records each run's task and answer;
`skill_producer()` records, for a run that succeeded, the actions that got it there (procedural
memory: what worked, for the SKILL lens to show the planner on a similar task).
Extractors are plain module-level functions so blueprints that carry them pickle by reference.
"""

from __future__ import annotations

import json
from typing import Any

from colony.agents.hooks import HookContext, Pointcut
from colony.memory.types import MemoryProducerConfig, NewMemory
from colony.wire.run_task import task_value

PREVIEW_CHARS = 400


def _preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def extract_action_from_dispatch(ctx: HookContext, result: Any) -> NewMemory | None:
    """An `ActionDispatcher.dispatch` call -> "Action X(params) succeeded: output", tagged
    `action`, `action:X`, `action_type:T` and `success` or `failure`."""
    action = ctx.args[0] if ctx.args else ctx.kwargs.get("action")
    if not isinstance(action, str):
        return None
    parameters = ctx.args[1] if len(ctx.args) > 1 else ctx.kwargs.get("parameters")
    spec = ctx.instance.get(action) if hasattr(ctx.instance, "get") else None
    action_type = getattr(getattr(spec, "action_type", None), "value", None) or "unspecified"
    success = bool(getattr(result, "success", False))
    outcome = _preview(result.output) if success else str(getattr(result, "error", "") or "")[:PREVIEW_CHARS]
    verdict = "succeeded" if success else "failed"
    content = f"Action {action}({_preview(parameters or {}, 200)}) {verdict}: {outcome}"
    tag_action = action if len(action) <= 64 and action.isidentifier() else "other"
    return NewMemory(
        content=content,
        tags={
            "action",
            f"action:{tag_action}",
            f"action_type:{action_type}",
            "success" if success else "failure",
        },
        kind="action",
        data={"action": action, "parameters": parameters or {}, "success": success},
        importance=0.5 if success else 0.7,
    )


def extract_run_turn(ctx: HookContext, result: Any) -> list[NewMemory] | None:
    """After a run's first step: the task it was given; after its last: the answer it gave."""
    agent = ctx.instance
    run = getattr(agent, "current_run", None)
    if run is None:
        return None
    made: list[NewMemory] = []
    if run.steps == 1:
        task = task_value(run.input)
        if task not in (None, ""):
            made.append(
                NewMemory(
                    content=f"User: {_preview(task, 4000)}",
                    tags={"conversation", "user"},
                    kind="conversation",
                    entry_id=f"turn-{run.run_id}-in",
                    importance=0.8,
                )
            )
    if run.done and run.output not in (None, ""):
        made.append(
            NewMemory(
                content=f"Assistant: {_preview(run.output, 4000)}",
                tags={"conversation", "assistant"},
                kind="conversation",
                entry_id=f"turn-{run.run_id}-out",
                importance=0.6,
            )
        )
    return made or None


MAX_SKILL_STEPS = 20


async def extract_skill(ctx: HookContext, result: Any) -> NewMemory | None:
    """After a run's last step, when it succeeded: "Task: ... / What worked: a -> b -> c", from
    the actions of its action log that succeeded (their order, repeats folded), tagged `skill`.
    One entry per run (its id derives from the run id)."""
    agent = ctx.instance
    run = getattr(agent, "current_run", None)
    if run is None or not run.done or getattr(run.status, "value", run.status) != "succeeded":
        return None
    log = getattr(agent, "action_log", None)
    if log is None:
        return None
    steps: list[str] = []
    for record in await log.records():
        ok = record.kind == "action" and record.status == "done" and (record.result or {}).get("success")
        if ok and record.action and (not steps or steps[-1] != record.action):
            steps.append(record.action)
    if not steps:
        return None
    task = task_value(run.input)
    tag_first = steps[0] if len(steps[0]) <= 64 and steps[0].isidentifier() else "other"
    return NewMemory(
        content=f"Task: {_preview(task, 300)}\nWhat worked: {' -> '.join(steps[:MAX_SKILL_STEPS])}",
        tags={"skill", "success", f"action:{tag_first}"},
        kind="procedure",
        entry_id=f"skill-{run.run_id}",
        data={"run_id": run.run_id, "actions": steps[:MAX_SKILL_STEPS]},
        importance=0.7,
    )


def skill_producer(ttl_seconds: float | None = None) -> MemoryProducerConfig:
    """The action sequences of runs that succeeded, as memories (procedural LTM)."""
    return MemoryProducerConfig(
        pointcut=Pointcut.pattern("Agent.run_step"),
        extractor=extract_skill,
        ttl_seconds=ttl_seconds,
        name="skills",
    )


def action_producer(ttl_seconds: float | None = None) -> MemoryProducerConfig:
    """Every action the agent dispatches, as a memory of the scope holding this producer."""
    return MemoryProducerConfig(
        pointcut=Pointcut.pattern("ActionDispatcher.dispatch"),
        extractor=extract_action_from_dispatch,
        ttl_seconds=ttl_seconds,
        name="actions",
    )


def conversation_producer(ttl_seconds: float | None = None) -> MemoryProducerConfig:
    """Each run's task and answer (the conversation stream), as memories."""
    return MemoryProducerConfig(
        pointcut=Pointcut.pattern("Agent.run_step"),
        extractor=extract_run_turn,
        ttl_seconds=ttl_seconds,
        name="conversation",
    )
