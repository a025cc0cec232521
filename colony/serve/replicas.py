"""Engine replicas as the control plane sees them on Ray Serve.

Live replicas are the ones with a heartbeat in the registry; a call to one replica goes through
the EngineReplica handle with `target_replica=<id>`, which the PageAffinityRouter honours. A
replica that is gone answers `ReplicaUnavailable` (from the replica that got the call instead,
or translated from Ray's actor-died errors), never a silent call to some other replica.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.handle import DeploymentHandle

from colony.errors import ReplicaUnavailable
from colony.system.registry import AgentRegistry
from colony.system.replicas import ReplicaPort, ReplicaSnapshot

T = TypeVar("T")


async def remote_result(response: Awaitable[T], replica_id: str | None = None) -> T:
    """Await a deployment call, re-raising the callee's own error (a Colony error keeps its type
    and message) and Ray's actor-died errors as `ReplicaUnavailable`."""
    try:
        return await response
    except RayTaskError as exc:
        cause = exc.cause
        raise (cause if isinstance(cause, Exception) else exc) from None
    except RayActorError as exc:
        raise ReplicaUnavailable(f"replica {replica_id or '?'} is not running: {exc}") from None


class ServeReplicaPort:
    def __init__(self, handle: DeploymentHandle, replica_id: str) -> None:
        self.handle = handle
        self.replica_id = replica_id

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        response: Awaitable[Any] = getattr(self.handle, method).remote(
            *args, target_replica=self.replica_id, **kwargs
        )
        return await remote_result(response, self.replica_id)

    async def snapshot(self) -> ReplicaSnapshot:
        return ReplicaSnapshot.model_validate(await self._call("snapshot"))

    async def ensure_agent(self, blueprint: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("ensure_agent", blueprint)
        return result

    async def resume_agent(self, agent_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("resume_agent", agent_id)
        return result

    async def suspend_agent(self, agent_id: str, reason: str, condition: dict[str, Any] | None) -> bool:
        return bool(await self._call("suspend_agent", agent_id, reason, condition))

    async def stop_agent(self, agent_id: str) -> bool:
        return bool(await self._call("stop_agent", agent_id))


class ServeReplicas:
    """The EngineReplica deployment as a `ReplicaDirectory`."""

    def __init__(self, handle: DeploymentHandle, registry: AgentRegistry) -> None:
        self.handle = handle
        self.registry = registry

    async def ports(self) -> list[ReplicaPort]:
        ids = sorted({beat["replica_id"] for beat in await self.registry.replicas()})
        return [self.port(replica_id) for replica_id in ids]

    def port(self, replica_id: str) -> ReplicaPort:
        return ServeReplicaPort(self.handle, replica_id)
