"""Meta-actions: a planned agent involves others. `spawn`, `wait_for`, `delegate`, `deliberate`,
`cancel_children` (CollaborationCapability), over the child-agent machinery of
colony.system.children: catalog agents placed as one-shot workers where their pages are held,
named from the run so a call redone after a crash or the resume never starts a second set, bounded
fan-out, a failed child restarted once. An action that must wait returns *blocked*: the agent is
suspended until its children have stopped, and the planner then runs the same call again
(colony.planning.policies), which finds their answers.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from colony.agents import ActionResult, ActionType, AgentHandle, action_executor
from colony.agents.blueprint import Blueprint
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.children import NOT_SPAWNABLE, CatalogName, ChildAgents, PageIds, Task

__all__ = ["NOT_SPAWNABLE", "CollaborationCapability", "collaboration"]


class CollaborationCapability(ChildAgents):
    """The meta-actions over catalog agents (options as ChildAgents')."""

    DEFAULT_KEY = "collaborate"

    # -- actions -----------------------------------------------------------------------------------

    @action_executor(action_type=ActionType.AGENT_SPAWN, effects=("spawn",))
    async def spawn(
        self,
        agent: CatalogName,
        task: Task,
        count: Annotated[int, Field(ge=1, le=8)] = 1,
        pages: PageIds | None = None,
    ) -> dict[str, Any]:
        """Start `count` agents of the catalog kind `agent` on `task` and go on; `wait_for` gets
        their answers. `pages`: mapped pages they should work where they are held."""
        call_id = self._call("spawn", {"agent": agent, "task": task, "count": count, "pages": pages})
        record = await self._start(call_id, "spawn", agent, task, count, pages or [])
        return {"agents": sorted(record["children"])}

    @action_executor(action_type=ActionType.AGENT_MONITOR, effects=("spawn",))
    async def wait_for(
        self,
        agents: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)] | None = None,
    ) -> ActionResult:
        """Wait until the agents you started (`agents`, default: all of this run's) have answered;
        their answers by agent."""
        run = self._agent().current_run
        mine = self._children(run.run_id if run is not None else None, retries=False)
        if agents is not None:
            replaced = {r[0]: c for c, r in self._retries().items()}  # a retry's id names its child
            agents = list(dict.fromkeys(replaced.get(a, a) for a in agents))
            unknown = [a for a in agents if a not in mine]
            if unknown:
                return ActionResult(
                    success=False, error=f"not agents you started in this run: {', '.join(unknown[:5])}"
                )
            mine = {a: mine[a] for a in agents}
        if not mine:
            return ActionResult(success=False, error="you have started no agents in this run (spawn first)")
        return await self._waited(mine, lambda answers: answers)

    @action_executor(action_type=ActionType.AGENT_SPAWN, effects=("spawn",))
    async def delegate(self, agent: CatalogName, task: Task, pages: PageIds | None = None) -> ActionResult:
        """Have an agent of the catalog kind `agent` do `task` and wait for its answer."""
        call_id = self._call("delegate", {"agent": agent, "task": task, "pages": pages})
        record = await self._start(call_id, "delegate", agent, task, 1, pages or [])
        [child] = record["children"]
        return await self._waited({child: record["children"][child]}, lambda answers: answers[child])

    @action_executor(action_type=ActionType.NEGOTIATE, effects=("spawn",))
    async def deliberate(
        self, question: Task, agent: CatalogName = "ask", count: Annotated[int, Field(ge=2, le=5)] = 3
    ) -> ActionResult:
        """Ask `count` agents of the kind `agent` the same question; their answers side by side."""
        call_id = self._call("deliberate", {"question": question, "agent": agent, "count": count})
        record = await self._start(call_id, "deliberate", agent, question, count, [])
        return await self._waited(
            dict(record["children"]), lambda answers: [{"agent": c, **a} for c, a in sorted(answers.items())]
        )

    @action_executor(action_type=ActionType.AGENT_TERMINATE, effects=("colony_write",))
    async def cancel_children(self) -> dict[str, Any]:
        """Cancel the agents you started that have not answered (they stop at their next step)."""
        parent = self._agent()
        answers = await self._results(self._children())
        cancelled = []
        for child_id, answer in answers.items():
            if answer is None:
                request_id = self._children()[child_id]
                if await AgentHandle(child_id, owner=parent).cancel(request_id, namespace=RUNS_NAMESPACE):
                    cancelled.append(child_id)
        return {"cancelled": sorted(cancelled)}


def collaboration(**options: Any) -> Blueprint[CollaborationCapability]:
    """The meta-actions as a capability blueprint (options as CollaborationCapability's)."""
    return CollaborationCapability.bind(**options)
