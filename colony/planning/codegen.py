"""CodeGenerationActionPolicy: the model writes a Python program calling `run(action_key, **params)`;
the program runs in the sandbox (an isolated child process, see `sandbox.py`) and its calls are
proxied back to the agent's dispatcher. Every call lands in the call trace and in the streams.
The model call and the proxied actions go through the agent's action log, so a step redone after a
crash reruns the same program and gets the recorded results of the actions that had finished.

Model-written code is untrusted, so the policy refuses (`SandboxRefused`) to run it with process
isolation only (no bubblewrap here) unless `planning.allow_weak_sandbox` says that is acceptable.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from colony.agents.models import ActionResult
from colony.agents.policy import ActionPolicyExecutionState, ActionPolicyIterationResult
from colony.config import ColonySettings, PlanningSettings
from colony.errors import AgentUsageError, SandboxRefused
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.planning.context import format_planning_prompt
from colony.planning.policies import FINISH, FINISH_ACTION, EventDrivenActionPolicy, call_record
from colony.planning.sandbox import SandboxLimits, resolve_isolation, run_sandboxed

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The first fenced code block of a reply, else the reply itself."""
    match = _CODE_BLOCK.search(text)
    return (match.group(1) if match else text).strip()


class CodeGenerationActionPolicy(EventDrivenActionPolicy):
    SYSTEM = (
        "You are the planner of an agent. Write a short Python program that makes progress on the goals by "
        "calling run(action_key, **parameters) for the available actions; it returns the action's output. "
        "Call run('finish', answer=...) when the task is done. Only standard-library computation is allowed: "
        "no files, no network, no processes. Reply with one ```python block."
    )

    def __init__(
        self,
        agent: Any = None,
        *,
        engine: InferenceEngine | None = None,
        limits: SandboxLimits | dict[str, Any] | None = None,
        max_tokens: int = 512,
        planning: PlanningSettings | dict[str, Any] | None = None,
        settings: ColonySettings | None = None,
        **kwargs: Any,
    ) -> None:
        # `kwargs` are the event-driven policy's; a host offers every service it has (replica,
        # pages, spawner) to a constructor taking **kwargs, and those are not for it
        accepted = inspect.signature(EventDrivenActionPolicy.__init__).parameters
        super().__init__(agent, **{k: v for k, v in kwargs.items() if k in accepted})
        self.engine = engine
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**(limits or {}))
        self.max_tokens = max_tokens
        if planning is None:  # the host's settings (a replica's --config / Serve args), else its agent's
            if settings is None and agent is None:
                raise AgentUsageError("CodeGenerationActionPolicy needs planning=, settings= or agent=")
            planning = (settings if settings is not None else agent.colony_settings()).planning
        self.planning = planning if isinstance(planning, PlanningSettings) else PlanningSettings(**planning)

    async def check_isolation(self) -> str:
        """The isolation programs will get; raises `SandboxRefused` when it is not acceptable."""
        isolation, why = await resolve_isolation(self.planning)
        if isolation == "bubblewrap":
            return isolation
        if isolation == "process" and self.planning.allow_weak_sandbox:
            return isolation
        raise SandboxRefused(
            f"generated code was not run: bubblewrap isolation is unavailable ({why}). Install bubblewrap "
            "(Debian/Ubuntu: apt-get install bubblewrap) or, to accept process isolation only, set "
            "planning.allow_weak_sandbox (COLONY_PLANNING__ALLOW_WEAK_SANDBOX=true)."
        )

    async def plan_step(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        if self.engine is None or self.agent is None:
            raise AgentUsageError("CodeGenerationActionPolicy needs its agent and an engine")
        await self.check_isolation()
        actions = [a.json_schema() for a in self.planning_actions()]

        def render() -> str:
            return format_planning_prompt(
                self.planning_context(state, [*actions, FINISH_ACTION]),
                instructions="Write the next program.",
            )

        fitted = await self.fit_prompt(
            state, render, engine=self.engine, system=self.SYSTEM, max_tokens=self.max_tokens
        )
        prompt = fitted.text
        # the output the window leaves beside the prompt (the budget clamps it; docs/compaction.md)
        max_tokens = fitted.budget.planner_max if fitted.budget is not None else self.max_tokens
        response = await self.generate(  # through the action log: a redone step gets the same program
            self.engine,
            InferenceRequest(
                messages=[
                    ChatMessage(role="system", content=self.SYSTEM),
                    ChatMessage(role="user", content=prompt),
                ],
                max_tokens=max_tokens,
                temperature=0.0,
            ),
        )
        finished: dict[str, Any] = {}
        waiting: dict[str, Any] = {}  # a call that came back blocked: the program stops there
        table = program_actions(self.agent.dispatcher, [a["name"] for a in actions], finished, waiting)
        outcome = await run_sandboxed(
            extract_code(response.text), actions=table, limits=self.limits, settings=self.planning
        )
        for call in outcome.calls:
            if call.action_key == FINISH:
                continue
            result = ActionResult(success=call.success, output=call.output, error=call.error)
            self.record_call(call_record(call.action_key, call.parameters, result))
        if not outcome.ok:
            # the failure is experience for the next iteration, not the end of the run
            self.record_call(
                {
                    "action_key": "program",
                    "parameters": {},
                    "success": False,
                    "output": None,
                    "output_preview": outcome.stdout[-500:],
                    "error": outcome.error,
                }
            )
        if waiting:  # suspended until the agents answer; on resume the call is made again
            self.blocked_call = {"action": waiting["action"], "parameters": waiting["parameters"]}
            action, parameters = waiting["action"], waiting["parameters"]
            return ActionPolicyIterationResult(
                action=action, parameters=parameters, action_result=waiting["result"]
            )
        if "answer" in finished:
            return ActionPolicyIterationResult(action=FINISH, done=True, output=finished["answer"])
        return ActionPolicyIterationResult(action="program", parameters={"calls": len(outcome.calls)})


def program_actions(
    dispatcher: Any, names: list[str], finished: dict[str, Any], waiting: dict[str, Any]
) -> dict[str, Any]:
    """The functions a program calls: each action through the dispatcher (a failure raised in the
    program; a call that comes back blocked is kept in `waiting` and stops the program), and
    `finish` (its answer kept in `finished`)."""

    def proxy(name: str) -> Any:
        async def call(**parameters: Any) -> Any:
            if waiting:
                raise RuntimeError("the program already waits for other agents")
            result = await dispatcher.dispatch(name, parameters)
            if result.blocked:
                waiting.update(action=name, parameters=parameters, result=result)
                raise RuntimeError(
                    f"{name} waits for other agents ({result.blocked_reason}); the program stops "
                    "here and the call is made again once they have answered"
                )
            if not result.success:
                raise RuntimeError(result.error)
            return result.output

        return call

    async def finish(answer: Any = None) -> Any:
        finished["answer"] = answer
        return answer

    table: dict[str, Any] = {name: proxy(name) for name in names}
    table[FINISH] = finish
    return table
