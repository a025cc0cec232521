"""Blackboard scopes: which partition of the blackboard a key lives in.

Scope ids are built from typed, validated segments with a fixed word before each one
(`tenant:`, `colony:`, `agent:`, ...), so ids of different scopes can never collide.
"""

from __future__ import annotations

from enum import StrEnum

from colony.blackboard.protocol import BlackboardProtocol, validate_segment
from colony.errors import InvalidKey


class BlackboardScope(StrEnum):
    """How widely a blackboard partition is shared."""

    TENANT = "tenant"  # everything a tenant owns, across colonies
    COLONY = "colony"  # shared by every agent of one colony
    SESSION = "session"  # one user session / run of the colony
    AGENT = "agent"  # private to one agent (and its parent through AgentHandle)


def scope_id(
    scope: BlackboardScope,
    *,
    tenant_id: str = "default",
    colony_id: str = "default",
    session_id: str | None = None,
    agent_id: str | None = None,
    namespace: str | None = None,
) -> str:
    """The scope id for `scope`, e.g. `tenant:default:colony:default:agent:a1`.

    `namespace` appends `:namespace:{namespace}`, giving one capability its own partition.
    """
    parts = [f"tenant:{validate_segment(tenant_id, 'tenant_id')}"]
    if scope is not BlackboardScope.TENANT:
        parts.append(f"colony:{validate_segment(colony_id, 'colony_id')}")
    if scope is BlackboardScope.SESSION:
        if session_id is None:
            raise InvalidKey("a SESSION scope needs session_id")
        parts.append(f"session:{validate_segment(session_id, 'session_id')}")
    elif scope is BlackboardScope.AGENT:
        if agent_id is None:
            raise InvalidKey("an AGENT scope needs agent_id")
        parts.append(f"agent:{validate_segment(agent_id, 'agent_id')}")
    built = ":".join(parts)
    return BlackboardProtocol.namespaced_scope(built, namespace) if namespace is not None else built
