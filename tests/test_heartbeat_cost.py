"""A replica's heartbeat reads the registry records naming it in one paged query (pipelined
reads), not one read per hosted agent in turn (a round trip each per beat), and still heals both ways:
a hosted agent's stale record is rewritten, and a record naming the replica for an agent it does
not host takes the agent's lifecycle state. Its pages needed soon by suspended agents are one read
of what the resource monitor worked out for it, not a listing of every suspended agent of the
colony. Counted on a real redis-server (INFO commandstats)."""

from __future__ import annotations

import asyncio
import math
import uuid

from agent_kit import counter_blueprint

from colony.agents import AgentState
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.inference import Page
from colony.inference.scripted import ScriptedEngine
from colony.system.host import SWEEP_RECORDS_PER_BEAT, ReplicaHost
from colony.system.registry import AgentRecord

AGENTS = 60


async def commands(bb: Blackboard) -> int:
    stats = await bb.redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))


async def test_a_beat_does_not_read_each_hosted_agent(bb: Blackboard, redis_url: str) -> None:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"hb{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "r0", engine=ScriptedEngine())
    await host.start(bb)
    try:
        for i in range(AGENTS):
            await host.ensure_agent(counter_blueprint(f"idle-{i}", []))
        registry = host.registry
        await registry.put(AgentRecord(agent_id="idle-3", state="suspended"))  # stale: hosted here
        await registry.put(AgentRecord(agent_id="gone", state="idle", replica="r0"))  # never stored
        await host._beat()  # heals both
        state = host.runtime.get("idle-3").state.value
        assert state != "suspended"
        assert (await registry.get("idle-3")).model_dump(include={"state", "replica"}) == {
            "state": state,
            "replica": "r0",
        }
        assert (await registry.get("gone")).model_dump(include={"state", "replica"}) == {
            "state": "stopped",
            "replica": None,
        }
        gets = 0
        get = registry.get

        async def counted(agent_id: str) -> AgentRecord | None:
            nonlocal gets
            gets += 1
            return await get(agent_id)

        registry.get = counted  # type: ignore[method-assign]
        before = await commands(bb)
        await host._beat()  # nothing to heal: what an idle replica's beat costs
        spent = await commands(bb) - before
        assert gets == 0, f"the beat read {gets} records one by one"
        # one command per record at most, plus the beat's own (was: two per record, one at a time)
        assert spent < AGENTS * 1.5, f"a beat with {AGENTS} idle agents sent {spent} Redis commands"
    finally:
        await host.close()


SUSPENDED = 2000


async def test_needed_soon_is_one_read_whatever_is_suspended(bb: Blackboard, redis_url: str) -> None:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"hb{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "r0", engine=ScriptedEngine())
    await host.start(bb)
    try:
        registry = host.registry
        for start in range(0, SUSPENDED, 250):  # suspended agents of the colony, none bound here
            await asyncio.gather(
                *(
                    registry.put(AgentRecord(agent_id=f"s{i:05d}", state="suspended", agent_type=kind))
                    for i in range(start, start + 250)
                    for kind in ["vcm_bound" if i % 10 == 0 else "service"]
                )
            )
        await host.engine.load_page(Page(page_id="held", text="a page this engine holds"))
        await registry.put_needed_soon("r0", ["next", "held"], 30.0)  # what a monitor round left
        before = await commands(bb)
        await host.paging.refresh_needed_soon()  # what each beat does once the engine holds a page
        spent = await commands(bb) - before
        assert spent <= 2, f"reading the pages needed soon took {spent} Redis commands"
        assert list(host.engine.pages_needed_soon()) == ["next", "held"]  # in the monitor's order
        await registry.clear_needed_soon("r0")
        await host.paging.refresh_needed_soon()
        assert list(host.engine.pages_needed_soon()) == []
    finally:
        await host.close()


MANY = 300  # above SWEEP_RECORDS_PER_BEAT: the beats that read every record come one in three


async def test_a_beat_of_many_idle_agents_reads_their_records_once_in_a_while(
    bb: Blackboard, redis_url: str
) -> None:
    """With many agents hosted, a beat writes the records of those whose state changed (what it
    last read or wrote is kept) and reads every record naming the replica (healing what others
    wrote) one beat in ceil(agents / SWEEP_RECORDS_PER_BEAT): an idle replica's beats cost about
    that many record reads each on average, not all of them every beat."""
    settings = ColonySettings(redis_url=redis_url, colony_id=f"hb{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "r0", engine=ScriptedEngine())
    await host.start(bb)
    try:
        for i in range(MANY):
            await host.ensure_agent(counter_blueprint(f"idle-{i}", []))
        registry = host.registry
        await host._beat()
        before = await commands(bb)
        beats = 3 * math.ceil(MANY / SWEEP_RECORDS_PER_BEAT)
        for _ in range(beats):
            await host._beat()
        spent = (await commands(bb) - before) / beats
        # was: every record every beat (1.5 commands an agent)
        assert spent < 0.6 * MANY, f"an idle beat with {MANY} agents sent {spent:.0f} Redis commands"
        # a state change is written by the next beat, sweep or not
        agent = host.runtime.get("idle-7")
        await agent.transition(AgentState.LOADED, "a test")
        await host._beat()
        assert (await registry.get("idle-7")).state == "loaded"
        # what another process wrote over a hosted agent's record is healed within a sweep period
        await registry.put(AgentRecord(agent_id="idle-3", state="suspended"))
        for _ in range(math.ceil(MANY / SWEEP_RECORDS_PER_BEAT)):
            await host._beat()
        healed = await registry.get("idle-3")
        assert (healed.state, healed.replica) == (host.runtime.get("idle-3").state.value, "r0")
    finally:
        await host.close()
