"""How the control plane sees and addresses engine replicas, in-process or on Ray Serve.

The placer and the resource monitor work on `ReplicaPort`s found through a `ReplicaDirectory`:
`LocalReplicas` wraps in-process `ReplicaHost`s (tests, one-process tools); the Serve control
plane uses `colony.serve.replicas.ServeReplicas`, which addresses a replica through the
page-affinity router. Either way the decisions are made from the same `ReplicaSnapshot`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from colony.errors import ReplicaUnavailable
from colony.vcm.placement import ReplicaView

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost


class AgentSlot(BaseModel):
    """What the placer needs to know of a hosted agent to pick a suspension victim."""

    agent_id: str
    priority: int = 0
    busy: bool = False
    idle_since: float = 0.0
    memory_mb: int = 0


class ReplicaSnapshot(BaseModel):
    replica_id: str
    resident: list[str] = Field(default_factory=list)
    swapped: list[str] = Field(default_factory=list)
    agents: list[AgentSlot] = Field(default_factory=list)

    def view(self, capacity: int | None, memory_mb: int | None = None) -> ReplicaView:
        free = None if memory_mb is None else memory_mb - sum(a.memory_mb for a in self.agents)
        return ReplicaView(
            self.replica_id, set(self.resident), set(self.swapped), len(self.agents), capacity, free
        )


class ReplicaPort(Protocol):
    """One replica, as the control plane calls it."""

    @property
    def replica_id(self) -> str: ...

    async def snapshot(self) -> ReplicaSnapshot: ...

    async def ensure_agent(self, blueprint: str) -> dict[str, Any]: ...

    async def resume_agent(self, agent_id: str) -> dict[str, Any]: ...

    async def suspend_agent(self, agent_id: str, reason: str, condition: dict[str, Any] | None) -> bool: ...

    async def stop_agent(self, agent_id: str) -> bool: ...


class ReplicaDirectory(Protocol):
    """The replicas that are alive now, and a way to address any replica by id (which raises
    `ReplicaUnavailable` when that replica is gone)."""

    async def ports(self) -> list[ReplicaPort]: ...

    def port(self, replica_id: str) -> ReplicaPort: ...


class LocalReplicas:
    """In-process hosts as a directory (a host is its own port)."""

    def __init__(self, hosts: Mapping[str, ReplicaHost]) -> None:
        self.hosts = hosts

    async def ports(self) -> list[ReplicaPort]:
        return [self.hosts[name] for name in sorted(self.hosts)]

    def port(self, replica_id: str) -> ReplicaPort:
        host = self.hosts.get(replica_id)
        return host if host is not None else GoneReplica(replica_id)


class GoneReplica:
    """The port of a replica that no longer exists: every call says so."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id

    def _gone(self) -> ReplicaUnavailable:
        return ReplicaUnavailable(f"replica {self.replica_id} is not running")

    async def snapshot(self) -> ReplicaSnapshot:
        raise self._gone()

    async def ensure_agent(self, blueprint: str) -> dict[str, Any]:
        raise self._gone()

    async def resume_agent(self, agent_id: str) -> dict[str, Any]:
        raise self._gone()

    async def suspend_agent(self, agent_id: str, reason: str, condition: dict[str, Any] | None) -> bool:
        raise self._gone()

    async def stop_agent(self, agent_id: str) -> bool:
        raise self._gone()


def as_directory(replicas: Mapping[str, ReplicaHost] | ReplicaDirectory) -> ReplicaDirectory:
    if isinstance(replicas, Mapping):
        return LocalReplicas(replicas)
    return replicas


def views_of(
    snapshots: list[ReplicaSnapshot], capacity: int | None, memory_mb: int | None = None
) -> list[ReplicaView]:
    return [s.view(capacity, memory_mb) for s in sorted(snapshots, key=lambda s: s.replica_id)]
