"""`ControlPlane.place(blueprint, wait=False)`: only the room there is now. On a full cluster it
neither waits `serve.placement_retry_seconds` for room (holding the lock the monitor's rounds and
explicit resumes share) nor suspends a lower-priority agent: ResourceExhausted at once, nothing
moved. With room it places as `place` does. Real redis-server, in-process replica hosts."""

from __future__ import annotations

import time
import uuid

import pytest
from agent_kit import counter_blueprint

from colony.agents import AgentBlueprint
from colony.blackboard import Blackboard
from colony.config import ColonySettings, ServeSettings
from colony.errors import ResourceExhausted
from colony.inference.scripted import ScriptedEngine
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost

RETRY_SECONDS = 3.0


def urgent(agent_id: str) -> AgentBlueprint:
    """A blueprint outranking the default-priority agents (the cascade would suspend one for it)."""
    bp = counter_blueprint(agent_id, [])
    bp.metadata.priority = 5
    return bp


async def test_place_without_wait_neither_waits_nor_suspends(bb: Blackboard, redis_url: str) -> None:
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"nw{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(max_agents_per_replica=1, placement_retry_seconds=RETRY_SECONDS),
    )
    hosts = {n: ReplicaHost(settings, n, engine=ScriptedEngine()) for n in ("ra", "rb")}
    control = ControlPlane(bb, hosts, settings)
    for host in hosts.values():
        await host.start(bb)
    try:
        placed = await control.place(counter_blueprint("a", []), wait=False)  # room: placed at once
        assert placed.step == "soft"
        await control.place(counter_blueprint("b", []))  # both replicas full now
        started = time.monotonic()
        with pytest.raises(ResourceExhausted, match="no replica has room"):
            await control.place(urgent("c"), wait=False)
        took = time.monotonic() - started
        assert took < RETRY_SECONDS / 2, f"place(wait=False) waited {took:.2f}s for room"
        hosted = sorted(a for h in hosts.values() for a in h.runtime.agent_ids)
        assert hosted == ["a", "b"], "place(wait=False) suspended an agent to make room"
        assert {(await control.registry.get(a)).state for a in ("a", "b")} <= {"idle", "initialized"}
        assert not control.placer.lock.locked()
        # the default still makes room: a lower-priority agent is suspended for the urgent one
        made = await control.place(urgent("c"))
        assert made.step == "suspend" and len(made.suspended) == 1
    finally:
        await control.close()
        for host in hosts.values():
            await host.close()
