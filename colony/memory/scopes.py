"""Where memories live: scope ids of the default hierarchy and of shared memory.

A memory scope is a namespace of a blackboard scope, so it has its own entries, tag index and
event stream (what subscriptions pull from): an agent's private levels are namespaces of the
agent's scope (`...:agent:{id}:namespace:memory-working`), shared memory namespaces of the colony
scope (`...:colony:{c}:namespace:memory-collective-{team}`). Ids are built from validated segments
only, never from raw input.
"""

from __future__ import annotations

from colony.blackboard import BlackboardScope, scope_id
from colony.blackboard.protocol import validate_segment
from colony.errors import InvalidKey

NAMESPACE_PREFIX = "memory-"
# scope type -> namespace suffix of an agent's private levels (the seed's names; ':' is a separator
# in scope ids, so "ltm:episodic" is spelled "ltm-episodic" in the id)
AGENT_LEVELS = {
    "sensory": "sensory",
    "working": "working",
    "stm": "stm",
    "ltm:episodic": "ltm-episodic",
    "ltm:semantic": "ltm-semantic",
    "ltm:procedural": "ltm-procedural",
}
PURPOSES = {
    "sensory": "Raw events and observations (seconds)",
    "working": "Recent actions, current plan, immediate context (about an hour)",
    "stm": "Consolidated summaries from working memory (about a day)",
    "ltm:episodic": "Past experiences and task outcomes (persistent)",
    "ltm:semantic": "Learned concepts, facts, domain knowledge (persistent)",
    "ltm:procedural": "Strategies and skills (persistent)",
    "collective": "Knowledge shared by a team of agents",
    "task": "Context shared by the agents of one task",
    "global": "System-wide facts shared by every agent of the colony",
}
_SUFFIX_TO_TYPE = {v: k for k, v in AGENT_LEVELS.items()}


class MemoryScope:
    """Scope ids of memory levels; every helper takes the tenant and colony of the ids it builds."""

    @staticmethod
    def agent(agent_id: str, level: str, *, tenant_id: str = "default", colony_id: str = "default") -> str:
        """The scope id of one private level of an agent (`level`: a key of AGENT_LEVELS)."""
        suffix = AGENT_LEVELS.get(level)
        if suffix is None:
            raise InvalidKey(f"unknown memory level {level!r}; known: {', '.join(AGENT_LEVELS)}")
        return scope_id(
            BlackboardScope.AGENT,
            tenant_id=tenant_id,
            colony_id=colony_id,
            agent_id=agent_id,
            namespace=NAMESPACE_PREFIX + suffix,
        )

    @classmethod
    def agent_sensory(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "sensory", **where)

    @classmethod
    def agent_working(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "working", **where)

    @classmethod
    def agent_stm(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "stm", **where)

    @classmethod
    def agent_ltm_episodic(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "ltm:episodic", **where)

    @classmethod
    def agent_ltm_semantic(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "ltm:semantic", **where)

    @classmethod
    def agent_ltm_procedural(cls, agent_id: str, **where: str) -> str:
        return cls.agent(agent_id, "ltm:procedural", **where)

    @staticmethod
    def _shared(kind: str, name: str | None, tenant_id: str, colony_id: str) -> str:
        namespace = NAMESPACE_PREFIX + kind + (f"-{validate_segment(name, f'{kind} id')}" if name else "")
        return scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id, namespace=namespace)

    @classmethod
    def collective(cls, team_id: str, *, tenant_id: str = "default", colony_id: str = "default") -> str:
        """Memory shared by a team (every agent that names the same team id)."""
        return cls._shared("collective", team_id, tenant_id, colony_id)

    @classmethod
    def task(cls, task_id: str, *, tenant_id: str = "default", colony_id: str = "default") -> str:
        """Memory of one task, shared by the agents working on it."""
        return cls._shared("task", task_id, tenant_id, colony_id)

    @classmethod
    def global_(cls, *, tenant_id: str = "default", colony_id: str = "default") -> str:
        """System-wide memory of the colony."""
        return cls._shared("global", None, tenant_id, colony_id)

    @staticmethod
    def scope_type(memory_scope_id: str) -> str:
        """The type of a memory scope id ("working", "ltm:episodic", "collective", ...)."""
        _, sep, namespace = memory_scope_id.rpartition(":namespace:")
        if not sep or not namespace.startswith(NAMESPACE_PREFIX):
            raise InvalidKey(f"{memory_scope_id!r} is not a memory scope id")
        suffix = namespace[len(NAMESPACE_PREFIX) :]
        if suffix in _SUFFIX_TO_TYPE:
            return _SUFFIX_TO_TYPE[suffix]
        head = suffix.split("-", 1)[0]
        if head in ("collective", "task", "global"):
            return head
        return suffix

    @staticmethod
    def is_memory_scope(candidate: str) -> bool:
        _, sep, namespace = candidate.rpartition(":namespace:")
        return bool(sep) and namespace.startswith(NAMESPACE_PREFIX)

    @staticmethod
    def owner_scope(memory_scope_id: str) -> str:
        """The scope a memory scope is a namespace of (the agent's or the colony's)."""
        base, sep, _ = memory_scope_id.rpartition(":namespace:")
        if not sep:
            raise InvalidKey(f"{memory_scope_id!r} is not a memory scope id")
        return base
