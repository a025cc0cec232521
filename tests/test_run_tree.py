"""The runs of one job seen together (issue 37, deliverable 4): a run submitted over HTTP whose agent
delegates to a catalog child and then asks two more the same question answers `GET /v1/runs/{id}/tree`
with every request nested under the one it was made in, each with its agent, state and times; the
CLI prints it; an unknown run is a 404. In-process control plane over two replica hosts on a real
redis-server (tests/test_api_checkpoints.py's ControlledApi)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_checkpoints import TOKEN, ControlledApi

from colony import cli
from colony.agents import Agent, AgentBlueprint, AgentMetadata, AgentRunCapability, ScriptedActionPolicy
from colony.cli_runs import render_tree
from colony.client import ColonyClient
from colony.errors import ApiError
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.collaborate import CollaborationCapability


def lead_blueprint(agent_id: str) -> AgentBlueprint:
    """Delegates the task to echo, then asks two echoes the same question."""
    steps = [
        {"action": "delegate", "parameters": {"agent": "echo", "task": "$input.task"}},
        {"action": "deliberate", "parameters": {"question": "$input.task", "agent": "echo", "count": 2}},
    ]
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="lead"),
        capabilities=[CollaborationCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(steps=steps),
    )


@pytest.fixture
def served(redis_url: str) -> Iterator[ControlledApi]:
    with ControlledApi(redis_url) as made:
        assert made.control is not None
        made.call(lambda: made.control.place(lead_blueprint("lead")))  # type: ignore[union-attr]
        yield made


def test_a_jobs_runs_are_seen_together(
    served: ControlledApi, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with ColonyClient(served.url, TOKEN, timeout=60) as client:
        done = client.run("lead", {"task": "ping"}, timeout_s=60)
        assert done["status"] == "succeeded", done
        tree: dict[str, Any] = client.tree(done["run_id"])
        root = tree["root"]
        assert tree["trace_id"] == done["run_id"] == root["request_id"] and root["agent"] == "lead"
        assert root["status"] == "succeeded" and root["ended_at"] >= root["created_at"]
        assert root["replica"] in ("ra", "rb") and root["pages"] == []  # where "lead" is hosted
        children = root["children"]
        assert len(children) == 3 and tree["nodes"] == 4 and not tree["truncated"]
        assert all(c["agent"].startswith("lead-") and c["status"] == "succeeded" for c in children)
        assert all(c["created_at"] >= root["created_at"] and c["children"] == [] for c in children)
        # per-step spans: each step event says what its time went to
        events = list(client.events(done["run_id"]))
        steps = [e for e in events if e["event_type"] == "step"]
        spans = [span for e in steps for span in e["data"]["spans"]]
        assert {s["name"] for s in spans if s["kind"] == "action"} == {"delegate", "deliberate"}
        assert any(s.get("blocked") for s in spans) and all(s["ms"] >= 0 for s in spans)
        assert all(e["data"]["ended_at"] >= e["data"]["began_at"] for e in steps)
        started = [e["data"]["agents"] for e in events if e["event_type"] == "children"]
        assert len(started) == 2 and len(started[1]) == 2  # once per call that started agents
        with pytest.raises(ApiError) as missing:
            client.tree("run-nope")
        assert missing.value.status == 404
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    assert cli.main(["runs", "tree", done["run_id"], "--url", served.url, "--token", TOKEN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "\x1b" not in render_tree({"trace_id": "t", "nodes": "\x1b]0;x\x07", "root": None})
    assert lines[0] == f"trace {done['run_id']}: 4 run(s)"
    assert lines[1].startswith(f"- lead  {done['run_id']}  succeeded  ")
    assert lines[1].endswith(f"  on {root['replica']}")  # where its agent is hosted
    assert len(lines) == 5 and all(line.startswith("  - lead-") for line in lines[2:])


def test_colony_run_shows_agents_started_waits_and_restarts() -> None:
    from colony.run_display import RunDisplay

    display = RunDisplay()
    shown = "".join(
        display.feed(event)
        for event in (
            {
                "event_type": "children",
                "data": {"agents": ["lead-x-0", "lead-x-1\x1b[2J"], "blueprint": "echo"},
            },
            {
                "event_type": "step",
                "data": {
                    "step": 1,
                    "name": "deliberate",
                    "action": {
                        "success": True,
                        "blocked": True,
                        "blocked_reason": "waiting for 2 of 2 agents",
                    },
                },
            },
            {"event_type": "child_restarted", "data": {"agent": "lead-x-0", "retry": "lead-x-0-r"}},
            {"event_type": "step", "data": {"step": 2, "name": "deliberate", "action": {"success": True}}},
            {"event_type": "children", "data": {"agents": 5}},  # what a writer of Redis could leave
        )
    )
    assert shown == (
        "  started 2 echo agent(s): lead-x-0, lead-x-1 [2J\n"
        "  step 1: deliberate waiting for 2 of 2 agents\n"
        "  agent lead-x-0 failed; started again as lead-x-0-r\n"
        "  step 2: deliberate ok\n"
        "  started 0 agent(s): \n"
    )


def alt_lead(agent_id: str) -> AgentBlueprint:
    """`lead_blueprint` serving its runs in the namespace `alt`."""
    made = lead_blueprint(agent_id)
    capabilities = [CollaborationCapability.bind(), AgentRunCapability.bind(namespace="alt")]
    return made.model_copy(update={"capabilities": capabilities})


def test_the_tree_follows_runs_served_in_another_namespace_and_runs_do_not_share_waits(
    served: ControlledApi,
) -> None:
    assert served.control is not None
    served.call(lambda: served.control.place(alt_lead("alt-lead")))  # type: ignore[union-attr]
    with ColonyClient(served.url, TOKEN, timeout=60) as client:
        done = client.run("alt-lead", {"task": "ping"}, namespace="alt", timeout_s=60)
        assert done["status"] == "succeeded", done
        assert client.tree(done["run_id"])["nodes"] == 4
        time.sleep(1.2)  # between two runs of one agent: not a wait of the second
        again = client.run("lead", {"task": "pong"}, timeout_s=60)
        first = next(e for e in client.events(again["run_id"]) if e["event_type"] == "step")
        assert not [s for s in first["data"]["spans"] if s["kind"] == "wait"]


async def test_a_tree_read_back_from_a_spoilt_redis_stays_bounded_and_true(bb: Any) -> None:
    """Lists pointing back up the tree, ids that may not reach a key, a result that is no object,
    a child that stopped without answering: the tree shows each node once and says what it can."""
    from colony.blackboard import BlackboardScope, scope_id
    from colony.blackboard.protocol import AgentRegistryProtocol, AgentStateProtocol
    from colony.blackboard.protocol import AgentRunProtocol as Keys
    from colony.system.run_tree import RunTreeReader

    colony = f"t{uuid.uuid4().hex[:8]}"

    def board(agent: str) -> Any:
        scope = scope_id(BlackboardScope.AGENT, tenant_id="default", colony_id=colony, agent_id=agent)
        return bb.scoped(Keys.namespaced_scope(scope, RUNS_NAMESPACE)), bb.scoped(scope)

    root, _ = board("root")
    await root.write(Keys.request_key("r0"), {"input": 1, "pages": ["p-1", "bad page/..", 7, "p-2"]})
    registry = bb.scoped(scope_id(BlackboardScope.COLONY, tenant_id="default", colony_id=colony))
    await registry.write(
        AgentRegistryProtocol.agent_key("root"), {"agent_id": "root", "replica": "replica-a"}
    )
    await registry.write(
        AgentRegistryProtocol.agent_key("kid"), {"agent_id": "kid", "replica": "no such\nid"}
    )
    listed = [{"agent_id": "root", "request_id": "r0"}, {"agent_id": "bad:id", "request_id": "x"}]
    listed.append({"agent_id": "kid", "request_id": "r1"})
    await root.write(Keys.children_key("r0"), {"listed": listed, "more": 3})
    kid, kid_state = board("kid")
    await kid.write(Keys.request_key("r1"), {"input": 2})
    await kid.write(Keys.claim_key("r1"), "kid")
    await kid.write(Keys.children_key("r1"), [{"agent_id": "root", "request_id": "r0"}])
    await kid_state.write(AgentStateProtocol.key("lifecycle"), {"state": "stopped"})
    await root.write(Keys.result_key("r0"), ["not", "an", "object"])
    tree = await RunTreeReader(bb, tenant_id="default", colony_id=colony, namespace=RUNS_NAMESPACE).tree(
        "root", "r0"
    )
    assert tree.nodes == 2 and tree.truncated  # `more`: children the list no longer keeps
    assert tree.root.status == "failed" and tree.root.error is None
    # where its agent is hosted (registry) and the pages it named, each checked as an id
    assert tree.root.replica == "replica-a" and tree.root.pages == ["p-1", "p-2"]
    [child] = tree.root.children
    assert (child.agent, child.status, child.error, child.children) == (
        "kid",
        "failed",
        "it stopped without answering",
        [],
    )
    assert child.replica is None and child.pages == []
