"""Removing agents for good: `DELETE /v1/sessions/{id}` (`ControlPlane.delete`) and the idle-session
retention (`SessionSweeper`, `context.session_idle_retention_seconds`).

The keys go through `colony.system.agent_purge.purge_agent`: the agent's scope and the scopes
namespaced in it (its state, conversation tree, rings, run requests, claims, results and event
streams, tag and expiry indexes: one SCAN MATCH on the scope's hash tag) and the memory blocks it
owns. A removal is a rare act (a user's DELETE, a sweep every few minutes of at most SWEEP_BATCH
sessions), so the SCAN's cost is paid there, never on a request's hot path. The registry record
goes last: a removal cut off half-way is found again and finished by the next DELETE or sweep.
"""

from __future__ import annotations

import logging
import time

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.context.sessions import SESSION_ROLE
from colony.system.registry import AgentRegistry

log = logging.getLogger(__name__)

SWEEP_BATCH = 100  # sessions one sweep removes at most (the next sweep takes the rest)
SWEEP_MAX_SECONDS = 300.0  # a sweep every this long at most (a quarter of the retention if shorter)


def agent_scope(agent_id: str, *, tenant_id: str, colony_id: str) -> str:
    return scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)


class SessionSweeper:
    """Removes session agents idle (no turn, no resume) for `retention_seconds`: their last
    activity is their lifecycle's last change (a turn moves it, a suspension or a resume too).
    Run by the control loop (`tick`), every SWEEP_MAX_SECONDS or a quarter of the retention."""

    def __init__(
        self, blackboard: Blackboard, registry: AgentRegistry, *, tenant_id: str, colony_id: str
    ) -> None:
        self.blackboard = blackboard
        self.registry = registry
        self.ids = {"tenant_id": tenant_id, "colony_id": colony_id}
        self._next = 0.0

    def due(self, retention_seconds: float) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + min(SWEEP_MAX_SECONDS, retention_seconds / 4)
        return True

    async def expired(self, retention_seconds: float) -> list[str]:
        """The sessions idle for longer than the retention: suspended ones and hosted idle ones (at
        most SWEEP_BATCH, the longest idle first)."""
        cutoff = time.time() - retention_seconds
        found: list[tuple[float, str]] = []
        for state in ("suspended", "idle"):
            for record in await self.registry.list(state=state):
                # the record is rewritten at each state change (a turn, a suspension, a resume):
                # one written since the cutoff is of a session active since, with no read more
                if record.role != SESSION_ROLE or record.updated_at >= cutoff:
                    continue
                board = self.blackboard.scoped(agent_scope(record.agent_id, **self.ids))
                lifecycle = await board.read(AgentStateProtocol.key("lifecycle"))
                last = lifecycle.updated_at if lifecycle is not None else record.updated_at
                if last < cutoff:
                    found.append((last, record.agent_id))
        return [agent_id for _, agent_id in sorted(found)[:SWEEP_BATCH]]
