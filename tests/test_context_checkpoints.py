"""Checkpoints, undo and restore on a real redis-server with the runtime that hosts agents
(colony.agents.state.checkpoints): one checkpoint per step in the persist transaction, a capped ring,
undo/restore that bring back the run, the policy and capability states and the context head,
discard the later checkpoints, and report the effects they cannot undo."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from agent_kit import counter_blueprint
from prometheus_client import REGISTRY

from colony.agents import (
    ActionType,
    Agent,
    AgentCapability,
    LocalAgentRuntime,
    action_executor,
    build_agent,
)
from colony.agents.models import RunStatus
from colony.agents.state.checkpoints import CHECKPOINTS, list_checkpoints, restore_checkpoint, undo
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ColonySettings, ContextSettings, load_settings
from colony.errors import (
    AgentStateConflict,
    CheckpointNotFound,
    ContextError,
    InvalidArgument,
    NothingToUndo,
)

# notices really sent, by agent id (outside any agent state: what a replay must not add to)
SENT: dict[str, int] = {}


class NotifyCapability(AgentCapability):
    """Sends a notice outside Colony (declared `external`): what an undo cannot take back."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.sent = 0
        self.delay = delay

    @action_executor(action_type=ActionType.ANALYZE, effects=("external",))
    async def notify(self, text: str) -> str:
        """Send `text` to the outside world; returns it."""
        await asyncio.sleep(self.delay)
        agent_id = self.agent.agent_id if self.agent is not None else "?"
        SENT[agent_id] = SENT.get(agent_id, 0) + 1
        self.sent += 1
        return text

    def get_state(self) -> dict[str, Any]:
        return {"sent": self.sent}

    def set_state(self, state: dict[str, Any]) -> None:
        self.sent = int(state.get("sent", 0))


# seven steps: add 1..5, add 7, notify (totals 1, 3, 6, 10, 15, 22, 22; the run's output "done")
STEPS = [{"action": "add", "parameters": {"amount": k}} for k in (1, 2, 3, 4, 5, 7)]
STEPS.append({"action": "notify", "parameters": {"text": "done"}})


def counted(op: str) -> float:
    return REGISTRY.get_sample_value("colony_context_checkpoints_total", {"op": op}) or 0.0


@pytest.fixture
async def kept5(bb: Blackboard) -> Any:
    """A runtime whose settings keep 5 checkpoints per agent."""
    settings = ColonySettings(context=ContextSettings(checkpoints_kept=5))
    runtime = LocalAgentRuntime(bb, colony_id=f"ck{uuid.uuid4().hex[:8]}", settings=settings)
    yield runtime
    await runtime.shutdown()


async def ran(runtime: LocalAgentRuntime, agent_id: str, delay: float = 0.0) -> Agent:
    notify = NotifyCapability.bind(delay=delay)
    await runtime.spawn(counter_blueprint(agent_id, STEPS, delay=delay, extra=[notify]))
    run = await runtime.start_run(agent_id, None)
    done = await runtime.wait_for_run(agent_id, run.run_id, timeout=30)
    assert done.status is RunStatus.SUCCEEDED and done.steps == 7 and done.output == "done"
    return runtime.get(agent_id)


def totals(agent: Agent) -> tuple[int, int]:
    counter, notify = agent.get_capability("CounterCapability"), agent.get_capability("NotifyCapability")
    return counter.total, notify.sent  # type: ignore[union-attr]


async def wait_run_done(runtime: LocalAgentRuntime, agent_id: str) -> Agent:
    async with asyncio.timeout(20):
        while True:
            agent = runtime._agents.get(agent_id)
            if agent is not None and agent.current_run is not None and agent.current_run.done:
                return agent
            await asyncio.sleep(0.05)


async def test_seven_steps_keep_five_and_undo_replans_from_the_previous_step(
    kept5: LocalAgentRuntime,
) -> None:
    created, restored = counted("created"), counted("restored")
    agent = await ran(kept5, "ck-undo", delay=0.3)
    board = agent.blackboard
    events = board.subscribe(CHECKPOINTS, from_id="0")
    listed = await list_checkpoints(board)
    assert [c.step for c in listed] == [3, 4, 5, 6, 7]  # 8 taken (run begin = 0), the newest 5 kept
    assert len(await board.ring(CHECKPOINTS)) == 5
    assert all(c.run_id == agent.current_run.run_id and c.size > 100 for c in listed)
    assert [c.effects for c in listed] == [[], [], [], [], ["external"]]  # step 7 notified
    assert [c.calls for c in listed] == [1, 1, 1, 1, 1]
    assert listed[-1].run_status == "succeeded" and listed[0].run_status == "running"
    assert counted("created") - created == 8
    assert totals(agent) == (22, 1)

    report = await kept5.restore_checkpoint("ck-undo", None)  # undo
    assert (report.step, report.discarded, report.kept) == (6, [7], [3, 4, 5, 6])
    (call,) = report.not_undone  # the notice step 7 sent stays sent
    assert (call.step, call.action, call.effects) == (7, "notify", ["external"])
    assert call.key == f"{agent.current_run.run_id}:7:a0"  # the action log's idempotency key
    # the report says that finished step 7 runs again, and when: now (the agent is hosted here)
    assert (report.reruns, report.rerun_when, report.request_id) == ([7], "now", None)
    (note,) = report.notes
    assert "driven on from step 7 now" in note and "step(s) [7] ran before and run again" in note
    hosted = kept5.get("ck-undo")
    assert hosted is not agent  # hosted again, rebuilt from what the undo wrote
    assert totals(hosted) == (22, 0)  # step 6's capability states, before step 7 runs again
    assert hosted.current_run.steps == 6 and not hosted.current_run.done
    assert counted("restored") - restored == 1

    # the next step re-plans from there: step 7 runs again (the counter adds 7 again)
    hosted = await wait_run_done(kept5, "ck-undo")
    assert hosted.current_run.status is RunStatus.SUCCEEDED and hosted.current_run.output == "done"
    assert totals(hosted) == (22, 1) and SENT["ck-undo"] == 2  # the notice went out again
    assert [c.step for c in await list_checkpoints(board)] == [3, 4, 5, 6, 7]  # a new 7
    head = await board.read(CHECKPOINTS)
    assert head.value["op"] == "created" and head.value["step"] == 7
    seen = []
    async with asyncio.timeout(5):
        while len(seen) < 10:  # 8 created, 1 restored, 1 created again: each one event
            event = await events.next(timeout=2)
            assert event is not None and event.key == CHECKPOINTS
            seen.append(event)
    events.close()


async def test_restore_reports_effects_it_cannot_undo(kept5: LocalAgentRuntime) -> None:
    agent = await ran(kept5, "ck-restore")
    run_id = agent.current_run.run_id
    await kept5.suspend("ck-restore")  # not hosted: rewritten only
    report = await kept5.restore_checkpoint("ck-restore", 5)
    assert (report.step, report.discarded, report.state) == (5, [6, 7], "suspended")
    assert (report.reruns, report.rerun_when) == ([6, 7], "on_resume")  # suspended: when resumed
    assert any("when the agent is resumed" in note and "[6, 7]" in note for note in report.notes)
    (call,) = report.not_undone
    assert any("declare no effects (add)" in note for note in report.notes)  # step 6 added
    assert (call.step, call.action, call.effects, call.capability) == (
        7,
        "notify",
        ["external"],
        "NotifyCapability",
    )
    assert call.key == f"{run_id}:7:a0"  # the action log's idempotency key of that call
    stored = await Agent.restore(
        "ck-restore", kept5.blackboard, colony_id=kept5.colony_id, settings=load_settings()
    )
    assert totals(stored) == (15, 0)
    assert stored.current_run.steps == 5 and stored.current_run.status is RunStatus.RUNNING
    assert stored.action_policy.index == 5  # type: ignore[union-attr]
    assert [c.step for c in await list_checkpoints(stored.blackboard)] == [3, 4, 5]

    with pytest.raises(CheckpointNotFound, match=r"kept steps: \[3, 4, 5\]"):
        await kept5.restore_checkpoint("ck-restore", 1)
    with pytest.raises(InvalidArgument):
        await kept5.restore_checkpoint("ck-restore", 4, mode="rewind")
    await kept5.restore_checkpoint("ck-restore", 3)
    with pytest.raises(NothingToUndo):
        await kept5.restore_checkpoint("ck-restore", None)

    resumed = await kept5.resume("ck-restore")  # drives the restored run from step 3
    resumed = await wait_run_done(kept5, "ck-restore")
    assert resumed.current_run.status is RunStatus.SUCCEEDED and resumed.current_run.output == "done"
    assert totals(resumed) == (22, 1)  # steps 4-7 ran again from step 3's states (6 + 4 + 5 + 7)
    assert SENT["ck-restore"] == 2  # re-executed: the notice went out a second time


async def test_restoring_a_finished_run_says_nothing_runs_again(kept5: LocalAgentRuntime) -> None:
    agent = await ran(kept5, "ck-finished")
    await kept5.suspend("ck-finished")
    report = await kept5.restore_checkpoint("ck-finished", 7)  # the newest: the finished run
    assert (report.discarded, report.reruns, report.rerun_when) == ([], [], "never")
    assert any(
        f"run {agent.current_run.run_id} is finished" in note and "nothing reruns" in note
        for note in report.notes
    )


async def test_replay_mode_reuses_the_recorded_results(kept5: LocalAgentRuntime) -> None:
    await ran(kept5, "ck-replay")
    await kept5.suspend("ck-replay")
    report = await kept5.restore_checkpoint("ck-replay", 5, mode="replay")
    assert report.mode == "replay" and any(note.startswith("replay:") for note in report.notes)
    await kept5.resume("ck-replay")
    agent = await wait_run_done(kept5, "ck-replay")
    # steps 6 and 7 got their recorded results (and the states they left) back: the notice was
    # not sent again, and the run ends with the output it had
    assert agent.current_run.status is RunStatus.SUCCEEDED and agent.current_run.output == "done"
    assert SENT["ck-replay"] == 1
    assert totals(agent) == (22, 1)


async def test_running_agent_is_refused(kept5: LocalAgentRuntime) -> None:
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 3
    await kept5.spawn(counter_blueprint("ck-busy", steps, delay=0.5))
    run = await kept5.start_run("ck-busy", None)
    await asyncio.sleep(0.7)  # in its second step
    with pytest.raises(AgentStateConflict, match="wait for its run to end or suspend it"):
        await kept5.restore_checkpoint("ck-busy", None)
    done = await kept5.wait_for_run("ck-busy", run.run_id, timeout=20)
    assert done.status is RunStatus.SUCCEEDED and done.output == 3  # untouched by the refusal


async def test_restore_truncates_the_context_ring(bb: Blackboard) -> None:
    """A checkpoint's context head: the ring goes back to its position and grows on from there."""
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 4
    blueprint = counter_blueprint("ck-context", steps)
    agent = build_agent(blueprint, bb, settings=load_settings())
    await agent.initialize(blueprint)
    await agent.begin_run(None)
    for i in range(4):
        agent.context.append({"note": i})
        await agent.run_step()
    assert agent.current_run.done and len(agent.context) == 4
    board = agent.blackboard
    report = await undo(agent)  # back to step 3: the context held 3 entries then
    assert report.step == 3
    assert [c["note"] for c in agent.context] == [0, 1, 2] and len(agent.context) == 3
    assert [c["note"] for c in await board.ring(Keys.key("context"))] == [0, 1, 2]
    assert [c["step"] for c in await board.ring(CHECKPOINTS)] == [0, 1, 2, 3]  # trimmed in Redis
    report = await restore_checkpoint(agent, 1)
    assert (report.step, report.discarded) == (1, [2, 3])
    again = await Agent.restore("ck-context", bb, settings=load_settings())
    assert [c["note"] for c in again.context] == [0] and again.current_run.steps == 1
    # it grows on from position 1: the entry appended next is stored at position 1
    again.context.append({"note": "later"})
    await again.persist()
    assert [c["note"] for c in await board.ring(Keys.key("context"))] == [0, "later"]


async def test_a_restored_agent_resumed_keeps_every_checkpoint_it_makes(bb: Blackboard) -> None:
    """The rings' discarded tails and the action log's later steps go in the restore's own fenced
    commit (nothing is trimmed after it: an agent resumed the moment the commit applied keeps
    every checkpoint it makes); the re-driven steps are checkpointed after the kept ones."""
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 6
    runtime = LocalAgentRuntime(bb, colony_id=f"c{uuid.uuid4().hex[:8]}", settings=load_settings())
    agent = await runtime.spawn(counter_blueprint("ck-race", steps))
    await agent.begin_run(None)
    for _ in range(3):
        await agent.run_step()
    await runtime.suspend("ck-race")
    board = runtime.agent_board("ck-race")
    stored = await Agent.restore("ck-race", bb, colony_id=runtime.colony_id, settings=load_settings())
    report = await restore_checkpoint(stored, 1)
    assert report.kept == [0, 1] and len(await board.ring(CHECKPOINTS)) == 2
    live = await runtime.resume("ck-race")
    await runtime.wait_for_run("ck-race", live.current_run.run_id, timeout=30)  # type: ignore[union-attr]
    listed = [c.step for c in await list_checkpoints(board)]
    assert listed == [0, 1, 2, 3, 4, 5, 6], listed
    assert len(await board.ring(CHECKPOINTS)) == 7
    assert live.get_capability("CounterCapability").total == 6  # type: ignore[union-attr]
    await runtime.shutdown()


async def test_a_checkpoint_its_capability_refuses_is_a_context_error_and_writes_nothing(
    bb: Blackboard,
) -> None:
    """A stored checkpoint is data read back from Redis: one whose capability state the capability
    refuses (set_state raises) is refused with ContextError naming the step; nothing is written."""
    steps = [{"action": "add", "parameters": {"amount": 1}}] * 3
    blueprint = counter_blueprint("ck-bad", steps)
    agent = build_agent(blueprint, bb, settings=load_settings())
    await agent.initialize(blueprint)
    await agent.begin_run(None)
    for _ in range(3):
        await agent.run_step()
    board = agent.blackboard
    ring = await board.ring(CHECKPOINTS)
    ring[1]["capabilities"] = {name: {"total": "not a number"} for name in ring[1]["capabilities"]}
    async with board.transaction() as tx:
        tx.ring_truncate(CHECKPOINTS, 0)
        tx.ring_push(CHECKPOINTS, ring, 100)
    before = (await board.read(Keys.key("policy_state")), await board.ring(CHECKPOINTS))
    with pytest.raises(ContextError, match="checkpoint 1 of agent ck-bad cannot be restored"):
        await restore_checkpoint(agent, 1)
    assert (await board.read(Keys.key("policy_state")), await board.ring(CHECKPOINTS)) == before


async def test_concurrent_restores_of_one_agent_apply_one(kept5: LocalAgentRuntime) -> None:
    """Two restores at once (two API calls, two processes) each read the ring; the second to
    commit finds the head moved (its expected version) and is refused, nothing applied."""
    await ran(kept5, "ck-race")
    await kept5.suspend("ck-race")
    copies = [
        await Agent.restore("ck-race", kept5.blackboard, colony_id=kept5.colony_id, settings=load_settings())
        for _ in (1, 2)
    ]
    outcomes = await asyncio.gather(
        restore_checkpoint(copies[0], 4), restore_checkpoint(copies[1], 6), return_exceptions=True
    )
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, AgentStateConflict)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "try again" in str(lost[0])
    stored = await Agent.restore(
        "ck-race", kept5.blackboard, colony_id=kept5.colony_id, settings=load_settings()
    )
    assert stored.current_run.steps == won[0].step  # the winner's state, whole
    assert [c.step for c in await list_checkpoints(stored.blackboard)] == won[0].kept


async def test_checkpoints_leave_with_the_agent(kept5: LocalAgentRuntime) -> None:
    """A stopped agent's checkpoint ring gets its state's retention; a new agent of that id starts
    with none of the old one's checkpoints."""
    agent = await ran(kept5, "ck-gone")
    board = agent.blackboard
    ring = board.keyspace.ring_key(CHECKPOINTS)
    assert await board.redis.ttl(ring) == -1  # kept while the agent lives
    await kept5.stop("ck-gone")
    assert await board.redis.ttl(ring) > 0
    await kept5.spawn(counter_blueprint("ck-gone", STEPS[:1]))
    assert await list_checkpoints(board) == []
    assert await board.read(CHECKPOINTS) is None
