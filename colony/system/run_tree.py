"""The runs of one job seen together: a run and the requests made while it was served, as a tree.

An agent that asks another (AgentHandle.submit: `analyze`'s page workers, the meta-actions'
children) lists the child request under the request it is serving (`children:run:{id}` in its own
runs namespace, expiring with that request). The tree starts at a run submitted over HTTP and follows
those lists down; each node says which agent served it, its state and its times, read from the
request's keys. The root run's id names the whole job (its trace). Bounded: MAX_NODES nodes,
MAX_DEPTH levels.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentRegistryProtocol as Keys
from colony.blackboard.protocol import AgentRunProtocol, AgentStateProtocol
from colony.errors import ConcurrentModificationError
from colony.system.registry import DONE_STATES
from colony.wire.ids import ID_PATTERN

log = logging.getLogger(__name__)
ID = re.compile(ID_PATTERN)
MAX_NODES = 500
MAX_DEPTH = 8
MAX_NODE_PAGES = 64
HIDDEN = "(another agent)"  # a node the reader's token is not given (hide_others)
NodeStatus = Literal["queued", "running", "suspended", "succeeded", "failed", "cancelled", "gone"]


class RunNode(BaseModel):
    """One request of the job: the agent that served it, its state and times, its own children."""

    agent: str
    request_id: str
    status: NodeStatus
    created_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    replica: str | None = Field(None, description="the replica hosting its agent now (null: not hosted)")
    pages: list[str] = Field(
        default_factory=list, description=f"the pages the request named (at most {MAX_NODE_PAGES})"
    )
    children: list[RunNode] = Field(default_factory=list)


class RunTree(BaseModel):
    trace_id: str = Field(description="the root run's id: every run of the job is under it")
    root: RunNode
    nodes: int
    truncated: bool = Field(
        False,
        description="more than MAX_NODES nodes or MAX_DEPTH levels, or a run with more children than kept",
    )


class RunTreeReader:
    """Builds a RunTree from Redis (`root`: the blackboard every scope is reached from)."""

    def __init__(self, root: Blackboard, *, tenant_id: str, colony_id: str, namespace: str) -> None:
        self.root, self.tenant_id, self.colony_id, self.namespace = root, tenant_id, colony_id, namespace
        self.count, self.truncated = 0, False
        self.seen: set[tuple[str, str]] = set()  # (agent, request) shown: a list pointing back is skipped
        self.replicas: dict[str, str | None] = {}  # agent -> where it is hosted (read once)

    def _board(self, agent: str) -> Blackboard:
        scope = scope_id(
            BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent
        )
        return self.root.scoped(AgentRunProtocol.namespaced_scope(scope, self.namespace))

    async def tree(self, agent: str, run_id: str) -> RunTree:
        root = await self._node(agent, run_id, depth=0)
        return RunTree(trace_id=run_id, root=root, nodes=self.count, truncated=self.truncated)

    async def cancel_below(self, agent: str, run_id: str, *, reason: str, writer: str) -> list[str]:
        """Answer every request of the job under the run (not the run itself) that has not ended as
        cancelled (create-only: an answer already there stands); their agents cancel their runs at
        their next step, one-shot children then stop. The `agent/request` ids this call cancelled."""
        tree = await self.tree(agent, run_id)
        cancelled: list[str] = []
        pending = list(tree.root.children)
        while pending:
            node = pending.pop()
            pending.extend(node.children)
            if node.status not in ("queued", "running", "suspended"):
                continue
            value = {"status": "cancelled", "output": None, "error": reason, "run_id": None, "steps": 0}
            try:
                await self._board(node.agent).write(
                    AgentRunProtocol.result_key(node.request_id),
                    value,
                    tags={AgentRunProtocol.request_tag(node.request_id)},
                    created_by=writer,
                    expected_version=0,
                )
            except ConcurrentModificationError:
                continue  # it answered meanwhile
            cancelled.append(f"{node.agent}/{node.request_id}")
        return cancelled

    async def _node(self, agent: str, request_id: str, depth: int) -> RunNode:
        self.count += 1
        self.seen.add((agent, request_id))
        board = self._board(agent)
        keys = [AgentRunProtocol.request_key(request_id), AgentRunProtocol.result_key(request_id)]
        request, result, claim, children = await board.read_many(
            [*keys, AgentRunProtocol.claim_key(request_id), AgentRunProtocol.children_key(request_id)]
        )
        status = await self._status(agent, request, result, claim)
        node = RunNode(agent=agent, request_id=request_id, status=status)
        node.created_at = request.created_at if request is not None else None
        node.replica = await self._replica(agent)
        asked = (
            request.value.get("pages") if request is not None and isinstance(request.value, dict) else None
        )
        if isinstance(asked, list):
            node.pages = [p for p in asked if isinstance(p, str) and ID.fullmatch(p)][:MAX_NODE_PAGES]
        if result is not None:
            value = result.value if isinstance(result.value, dict) else {}
            node.ended_at, node.error = result.created_at, _text(value.get("error"))
        elif status == "failed":
            node.error = "it stopped without answering"
        held = children.value if children is not None else None
        listed = held.get("listed") if isinstance(held, dict) else held
        if isinstance(held, dict) and held.get("more"):
            self.truncated = True  # more children than the list keeps
        for child in listed if isinstance(listed, list) else []:
            if not _valid(child) or (child["agent_id"], child["request_id"]) in self.seen:
                continue  # (a list pointing back up the tree is not followed)
            if depth + 1 >= MAX_DEPTH or self.count >= MAX_NODES:
                self.truncated = True
                break
            node.children.append(await self._node(child["agent_id"], child["request_id"], depth + 1))
        return node

    async def _replica(self, agent: str) -> str | None:
        """Where the agent is hosted now, from its registry record (read once per agent)."""
        if agent not in self.replicas:
            scope = scope_id(BlackboardScope.COLONY, tenant_id=self.tenant_id, colony_id=self.colony_id)
            entry = await self.root.scoped(scope).read(Keys.agent_key(agent))
            held = entry.value.get("replica") if entry is not None and isinstance(entry.value, dict) else None
            self.replicas[agent] = held if isinstance(held, str) and ID.fullmatch(held) else None
        return self.replicas[agent]

    async def _status(self, agent: str, request: Any, result: Any, claim: Any) -> NodeStatus:
        if result is not None:
            held = result.value.get("status") if isinstance(result.value, dict) else None
            return held if held in ("succeeded", "cancelled") else "failed"
        if request is None:
            return "gone"  # expired with its retention
        scope = scope_id(
            BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent
        )
        lifecycle = await self.root.scoped(scope).read(AgentStateProtocol.key("lifecycle"))
        value = lifecycle.value if lifecycle is not None and isinstance(lifecycle.value, dict) else {}
        if value.get("state") in DONE_STATES:
            return "failed"  # it stopped without answering (as the supervisor counts it)
        if claim is None:
            return "queued"
        return "suspended" if value.get("state") == "suspended" else "running"


def hide_others(node: RunNode, sees: Callable[[str], bool]) -> None:
    """Blank the nodes of agents `sees` refuses (their agent, id, error, replica and pages; their
    state and times stay), in place, the whole tree down (iteratively: no deep recursion)."""
    stack = [node]
    while stack:
        held = stack.pop()
        if not sees(held.agent):
            held.agent, held.request_id, held.error, held.replica, held.pages = HIDDEN, HIDDEN, None, None, []
        stack.extend(held.children)


async def end_children(
    root: Blackboard, *, tenant_id: str, colony_id: str, namespace: str, agent: str, run_id: str, writer: str
) -> None:
    """A run ended from the API side (cancelled, timed out) takes the runs it started with it (a
    coordinator's workers, a planner's children): each one not ended is cancelled. Best effort: a
    child missed here still ends with its own deadline."""
    reader = RunTreeReader(root, tenant_id=tenant_id, colony_id=colony_id, namespace=namespace)
    try:
        ended = await reader.cancel_below(
            agent, run_id, reason=f"its parent run {run_id} ended", writer=writer
        )
    except Exception as exc:
        log.warning("run %s: the runs it started were not cancelled: %r", run_id, exc)
        return
    if ended:
        log.info("run %s ended: cancelled %d of the runs it started", run_id, len(ended))


def _valid(child: Any) -> bool:
    """A listed child whose ids may reach a key (the list is in Redis: a writer could have spoilt it)."""
    return isinstance(child, dict) and all(
        isinstance(child.get(k), str) and re.fullmatch(ID_PATTERN, child[k])
        for k in ("agent_id", "request_id")
    )


def _text(value: Any) -> str | None:
    return value[:2000] if isinstance(value, str) else None
