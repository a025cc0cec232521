"""Fast suspend/resume and prefetch (M14), on a real redis-server with in-process replica hosts:

- an explicit resume is one placement decision (no replica asked for its state when the last
  round's views are fresh, no other suspended agent resumed with it) and one state read on the
  target; views that find no room, or chose a replica lost since, are read again; with no room at
  all the agent stays suspended and the monitor resumes it once room appears;
- the control loop resumes an agent whose condition came true within one tick;
- a page-bound agent placed or resumed on a replica finds its page resident at its first step
  (prefetched: the step faults nothing); a prefetch never evicts a page another agent needs soon;
- `engine.pages_needed_soon` names the pages of idle page-bound agents hosted here and of
  suspended ones the monitor would resume here, not those of agents bound elsewhere.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentType,
    ResumptionCondition,
    ResumptionKind,
    ScriptedActionPolicy,
    action_executor,
)
from colony.blackboard import Blackboard
from colony.config import ColonySettings, ServeSettings
from colony.errors import BlackboardUnavailable, ReplicaUnavailable
from colony.inference import InferenceRequest, InferenceResponse, Page, PageLoad
from colony.inference.scripted import ScriptedEngine
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.replicas import LocalReplicas, ReplicaPort
from colony.vcm import PageSource

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


class SlotEngine(ScriptedEngine):
    """A scripted engine with `slots` page slots that logs its page operations and generations in
    order (`ops`); a load into a full cache evicts the first resident page in no use."""

    def __init__(self, slots: int | None = None) -> None:
        super().__init__(["ok"])
        self.slots = slots
        self.ops: list[tuple[str, Any]] = []

    def page_capacity(self) -> int | None:
        return self.slots

    async def load_page(self, page: Page) -> PageLoad:
        if self.slots is not None and len(self.resident_pages()) >= self.slots:
            in_use = self.pinned_pages()
            victim = next(p for p in self.resident_pages() if p not in in_use)
            await self.evict_page(victim)
        self.ops.append(("load", page.page_id))
        return await super().load_page(page)

    async def evict_page(self, page_id: str) -> bool:
        self.ops.append(("evict", page_id))
        return await super().evict_page(page_id)

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        self.ops.append(("generate", list(request.page_ids)))
        return await super().generate(request)


class PageReader(AgentCapability):
    """A page-bound agent's step: one generation over its bound pages on its replica; the step's
    output is what that generation had to fault in."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        replica: Any = None,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.replica = replica

    @action_executor(action_type=ActionType.ANALYZE)
    async def read(self) -> list[str]:
        """Generate over the agent's pages; returns the pages faulted in for it."""
        assert self.agent is not None and self.replica is not None
        answer = await self.replica.generate(
            {"prompt": "summarise"}, list(self.agent.metadata.bound_pages), holder=self.agent.agent_id
        )
        return list(answer["faulted"])


def reader_blueprint(agent_id: str, pages: list[str]) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.VCM_BOUND, bound_pages=pages),
        capabilities=[PageReader.bind()],
        action_policy=ScriptedActionPolicy.bind(steps=[{"action": "read", "parameters": {}}]),
    )


class CountingReplicas(LocalReplicas):
    """In-process hosts as a directory that counts the snapshots asked of them."""

    def __init__(self, hosts: dict[str, ReplicaHost]) -> None:
        super().__init__(hosts)
        self.snapshots = 0

    async def ports(self) -> list[ReplicaPort]:
        return [Counted(port, self) for port in await super().ports()]

    def port(self, replica_id: str) -> ReplicaPort:
        return Counted(super().port(replica_id), self)


class Counted:
    def __init__(self, port: ReplicaPort, owner: CountingReplicas) -> None:
        self._port, self._owner = port, owner
        self.replica_id = port.replica_id

    async def snapshot(self) -> Any:
        self._owner.snapshots += 1
        return await self._port.snapshot()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._port, name)


class Colony:
    def __init__(self, hosts: dict[str, ReplicaHost], control: ControlPlane, directory: CountingReplicas):
        self.hosts, self.control, self.directory = hosts, control, directory

    def where(self, agent_id: str) -> list[str]:
        return [n for n, h in self.hosts.items() if h.runtime is not None and agent_id in h.runtime.agent_ids]


async def make_colony(
    bb: Blackboard, redis_url: str, *, max_agents: int = 8, slots: int | None = None, period: float = 1.0
) -> Colony:
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"fr{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(
            max_agents_per_replica=max_agents,
            monitor_period_seconds=period,
            heartbeat_seconds=0.2,
            placement_retry_seconds=0,
        ),
    )
    hosts = {n: ReplicaHost(settings, n, engine=SlotEngine(slots)) for n in ("ra", "rb")}
    directory = CountingReplicas(hosts)
    control = ControlPlane(bb, directory, settings)
    for host in hosts.values():
        host.spawner = control.place
        await host.start(bb)
    return Colony(hosts, control, directory)


@pytest.fixture
async def colony(bb: Blackboard, redis_url: str) -> AsyncIterator[Colony]:
    made = await make_colony(bb, redis_url)
    yield made
    await made.control.close()
    for host in made.hosts.values():
        await host.close()


async def test_explicit_resume_is_one_decision_not_a_monitor_round(colony: Colony) -> None:
    control = colony.control
    await control.place(counter_blueprint("target", STEPS))
    await control.place(counter_blueprint("bystander", STEPS))
    (host,) = (colony.hosts[n] for n in colony.where("target"))
    await host.runtime.get("target").run(7)
    await control.suspend("target")
    # another suspended agent whose condition holds: a monitor round would resume it too
    (other,) = (colony.hosts[n] for n in colony.where("bystander"))
    await other.runtime.suspend("bystander")  # IMMEDIATE
    await control.monitor._refresh()  # the last round's views, fresh
    asked = colony.directory.snapshots
    record = await control.resume("target")
    assert colony.directory.snapshots == asked, "the resume asked replicas for their state"
    assert record.state == "idle" and record.replica in colony.hosts
    assert colony.where("target") == [record.replica]
    restored = colony.hosts[record.replica].runtime.get("target")
    assert restored.get_capability("CounterCapability").total == 7  # its state, read back
    assert (await control.registry.get("bystander")).state == "suspended"  # left to the monitor
    assert await control.monitor.tick() == ["bystander"]


async def test_stale_views_without_room_are_read_again(bb: Blackboard, redis_url: str) -> None:
    colony = await make_colony(bb, redis_url, max_agents=1)
    try:
        control = colony.control
        await control.place(counter_blueprint("a", STEPS))
        await control.place(counter_blueprint("b", STEPS))  # both replicas full now
        await control.monitor._refresh()
        (name,) = colony.where("a")
        await colony.hosts[name].suspend_agent("a")  # by its replica: the views do not know
        asked = colony.directory.snapshots
        record = await control.resume("a")
        assert record.state == "idle" and colony.where("a") == [name]
        assert colony.directory.snapshots > asked  # the full views were read again, and had room
    finally:
        await control.close()
        for host in colony.hosts.values():
            await host.close()


async def test_a_replica_lost_since_the_last_round_is_not_the_answer(colony: Colony) -> None:
    control = colony.control
    for agent_id in ("x", "y", "z"):  # least loaded first: x and z on ra, y on rb
        await control.place(counter_blueprint(agent_id, STEPS))
    assert colony.where("y") == ["rb"]
    await control.suspend("y")  # rb is the emptier one now
    await control.monitor._refresh()
    lost = colony.hosts.pop("rb")  # gone since the last round's views

    async def unavailable(agent_id: str) -> Any:
        raise ReplicaUnavailable("replica rb is not running")

    lost.resume_agent = unavailable  # type: ignore[method-assign]
    try:
        record = await control.resume("y")
        assert record.state == "idle" and record.replica == "ra" and colony.where("y") == ["ra"]
    finally:
        colony.hosts["rb"] = lost


async def test_resume_without_room_waits_for_the_monitor(bb: Blackboard, redis_url: str) -> None:
    colony = await make_colony(bb, redis_url, max_agents=1)
    try:
        control = colony.control
        await control.place(counter_blueprint("a", STEPS))
        await control.suspend("a")
        await control.place(counter_blueprint("b", STEPS))
        await control.place(counter_blueprint("c", STEPS))  # both replicas full
        record = await control.resume("a")
        assert record.state == "suspended" and colony.where("a") == []
        assert await control.monitor.tick() == []  # still no room
        (name,) = colony.where("c")
        await control.stop("c")
        assert await control.monitor.tick() == ["a"]  # the noted request, met once room appeared
        assert colony.where("a") == [name]
    finally:
        await control.close()
        for host in colony.hosts.values():
            await host.close()


async def test_the_control_loop_resumes_within_one_tick(bb: Blackboard, redis_url: str) -> None:
    colony = await make_colony(bb, redis_url, period=0.05)
    control = colony.control
    try:
        registry = control.registry
        await registry.put(AgentRecord(agent_id="child", state="running"))
        await control.place(counter_blueprint("parent", STEPS))
        (name,) = colony.where("parent")
        condition = ResumptionCondition(kind=ResumptionKind.CHILDREN_COMPLETED, agent_ids=["child"])
        await colony.hosts[name].runtime.suspend("parent", "children", condition)
        ticks: list[list[str]] = []
        tick = control.monitor.tick

        async def counted() -> list[str]:
            index = len(ticks)
            ticks.append([])
            ticks[index] = await tick()
            return ticks[index]

        control.monitor.tick = counted  # type: ignore[method-assign]
        control.start()
        async with asyncio.timeout(10):
            while len(ticks) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert not any("parent" in t for t in ticks)
        begun = len(ticks)  # rounds begun before the condition holds
        await registry.set_state("child", "stopped")
        async with asyncio.timeout(10):
            while not any("parent" in t for t in ticks):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        resumed_in = next(i for i, t in enumerate(ticks) if "parent" in t)
        # the round under way when the child stopped may have read it running; the next one resumes
        assert resumed_in <= begun, f"resumed in round {resumed_in}, the condition held from round {begun}"
        assert len(colony.where("parent")) == 1
    finally:
        await control.close()
        for host in colony.hosts.values():
            await host.close()


async def map_pages(colony: Colony, tmp_path: Path, count: int) -> list[str]:
    """`count` pages, one source each."""
    pages = []
    for i in range(count):
        folder = tmp_path / f"src{i}"
        folder.mkdir()
        (folder / "doc.md").write_text(f"# Doc {i}\n" + f"word{i} " * 300)
        source = PageSource(folder, allowed_roots=[tmp_path], page_tokens=1024)
        pages += (await colony.control.pages.map_source(source)).page_ids
    return pages


async def first_step_faults(host: ReplicaHost, agent_id: str) -> list[str]:
    runtime = host.runtime
    run = await runtime.start_run(agent_id, None)
    done = await runtime.wait_for_run(agent_id, run.run_id, timeout=10)
    assert done.status.value == "succeeded", done.error
    return list(done.output)


async def test_prefetch_before_the_first_step_after_placement_and_resumption(
    colony: Colony, tmp_path: Path
) -> None:
    (page,) = await map_pages(colony, tmp_path, 1)
    control = colony.control
    await control.place(reader_blueprint("reader", [page]))
    (name,) = colony.where("reader")
    host, engine = colony.hosts[name], colony.hosts[name].engine
    assert await first_step_faults(host, "reader") == []  # prefetched when placed
    assert engine.ops[:2] == [("load", page), ("generate", [page])]
    await control.suspend("reader")
    await engine.evict_page(page)  # gone while the agent was away
    engine.ops.clear()
    faults_before = host.paging.counts["faults"]
    record = await control.resume("reader")
    target = colony.hosts[record.replica]
    assert await first_step_faults(target, "reader") == []  # its step found the page resident
    assert target.engine.ops[:2] == [("load", page), ("generate", [page])]
    assert host.paging.counts["faults"] == faults_before and target.paging.counts["faults"] == 0
    assert sum(h.paging.counts["prefetched"] for h in colony.hosts.values()) == 2


async def test_prefetch_never_evicts_a_page_needed_soon(
    bb: Blackboard, redis_url: str, tmp_path: Path
) -> None:
    colony = await make_colony(bb, redis_url, slots=1)
    try:
        first, second = await map_pages(colony, tmp_path, 2)
        host = colony.hosts["ra"]
        # placed back to back (a burst of placements): `second`'s prefetch starts while `first`'s
        # is still loading, when the one slot still looks free
        await host.ensure_agent(reader_blueprint("first", [first]))
        await host.ensure_agent(reader_blueprint("second", [second]))
        await asyncio.wait_for(host.runtime.driver("first"), 5)  # its prefetch
        await asyncio.wait_for(host.runtime.driver("second"), 5)  # its prefetch, which gave up
        # one slot, holding a page the idle `first` needs: `second`'s page waits for its own step
        assert host.engine.ops == [("load", first)]
        assert list(host.engine.resident_pages()) == [first]
        assert first in host.paging.needed_soon()  # idle, bound to it: its next run uses it
        assert await first_step_faults(host, "first") == []
        assert await first_step_faults(host, "second") == [second]
        assert host.paging.counts["prefetched"] == 1
    finally:
        await colony.control.close()
        for h in colony.hosts.values():
            await h.close()


async def test_pages_needed_soon_by_suspended_agents_destined_here(colony: Colony, tmp_path: Path) -> None:
    here, elsewhere, nowhere = await map_pages(colony, tmp_path, 3)
    ra, rb = colony.hosts["ra"], colony.hosts["rb"]
    await ra.ensure_pages([here])
    await rb.ensure_pages([elsewhere])
    await ra.ensure_agent(reader_blueprint("waiter", [here]))
    await rb.ensure_agent(reader_blueprint("other", [elsewhere]))
    await rb.ensure_agent(reader_blueprint("homeless", [nowhere]))
    await ra.ensure_agent(counter_blueprint("unbound", STEPS))
    await asyncio.wait_for(rb.runtime.driver("homeless"), 5)  # its prefetch
    for host, agent_id in ((ra, "waiter"), (rb, "other"), (rb, "homeless"), (ra, "unbound")):
        until_asked = ResumptionCondition(kind=ResumptionKind.CUSTOM)  # waits on its bound pages
        await host.runtime.suspend(agent_id, "request", until_asked)
    await rb.evict_page(nowhere)  # prefetched when `homeless` was placed; held by no replica now
    assert await colony.control.monitor.tick() == []  # the round works out what each replica needs
    await ra.paging.refresh_needed_soon()  # what each heartbeat does (every 0.2 s here, too): one read
    await rb.paging.refresh_needed_soon()
    assert list(ra.engine.pages_needed_soon()) == [here]  # what the engine's eviction consults
    assert list(rb.engine.pages_needed_soon()) == [elsewhere]  # not `nowhere`: no replica holds it
    await colony.control.resume("waiter")
    assert await first_step_faults(ra, "waiter") == []
    assert await colony.control.monitor.tick() == []
    assert await colony.control.registry.needed_soon("ra") == []  # no suspended agent bound here
    await ra.paging.refresh_needed_soon()
    assert list(ra.paging.needed_soon()) == [here]  # hosted, idle again: its next run needs it


async def test_a_resume_that_took_effect_but_failed_is_not_repeated_elsewhere(
    colony: Colony, redis_url: str
) -> None:
    """The target restored the agent, then its registry write failed (a Redis blip; on Serve, a
    lost answer does the same): the resume took effect, so no second copy starts on another
    replica, neither by this resume nor by the next monitor round."""
    control = colony.control
    await control.place(counter_blueprint("x", STEPS))
    (first,) = colony.where("x")
    await colony.hosts[first].runtime.get("x").run(3)
    await control.suspend("x")
    await control.monitor.tick()  # a round: the views are fresh
    host = colony.hosts[first]  # the emptier replica (x left it), the one chosen again
    real_put = host.registry.put
    failures = [BlackboardUnavailable("write", redis_url)]

    async def flaky_put(record: AgentRecord) -> AgentRecord:
        if failures and record.agent_id == "x":
            raise failures.pop()
        return await real_put(record)

    host.registry.put = flaky_put  # type: ignore[method-assign]
    record = await control.resume("x")
    assert not failures, "the resume did not go to the replica whose write fails"
    assert colony.where("x") == [first], f"resumed on {colony.where('x')}"
    assert record.replica == first and record.state == "idle"
    assert await control.monitor.tick() == []  # the registry may still say suspended: not resumed again
    assert colony.where("x") == [first]
    async with asyncio.timeout(10):  # the replica's heartbeat writes the record it could not
        while (await control.registry.get("x")).replica != first:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert colony.hosts[first].runtime.get("x").get_capability("CounterCapability").total == 3
    assert colony.where("x") == [first]


async def test_a_round_between_a_suspension_and_its_answer_frees_no_slot_twice(
    bb: Blackboard, redis_url: str
) -> None:
    """A monitor round that read the replicas after an agent left, before `suspend` returned, counts
    its slot free already: `suspend` must not free it once more in the views, or the explicit
    resumes that follow place over `serve.max_agents_per_replica`."""
    colony = await make_colony(bb, redis_url, max_agents=2)
    control = colony.control
    try:
        for agent_id in ("a", "w", "b", "c"):
            await control.place(counter_blueprint(agent_id, STEPS))
        await control.suspend("c")
        await control.place(counter_blueprint("z", STEPS))  # both replicas full again
        real_port = colony.directory.port

        class RoundInBetween:
            def __init__(self, port: ReplicaPort) -> None:
                self._port = port

            async def suspend_agent(self, *args: Any) -> bool:
                answer = await self._port.suspend_agent(*args)
                await control.monitor._refresh()  # a round read the snapshots meanwhile
                return answer

            def __getattr__(self, name: str) -> Any:
                return getattr(self._port, name)

        colony.directory.port = lambda rid: RoundInBetween(real_port(rid))  # type: ignore[method-assign]
        await control.suspend("a")
        colony.directory.port = real_port  # type: ignore[method-assign]
        for agent_id in ("a", "c"):
            await control.resume(agent_id)
        loads = {name: len(host.runtime.agent_ids) for name, host in colony.hosts.items()}
        assert max(loads.values()) <= 2, f"placed over max_agents_per_replica=2: {loads}"
        resumed = [a for a in ("a", "c") if colony.where(a)]
        assert len(resumed) == 1, resumed  # one slot was free, one agent took it
        assert sum(loads.values()) == 4
    finally:
        await control.close()
        for host in colony.hosts.values():
            await host.close()
