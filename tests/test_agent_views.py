"""Views of agents for people (issue 38: the console's agent and colony views): an agent's profile
(`GET /v1/agents/{id}/profile`: what it is built with, as it recorded it) and the resumption
queue (`GET /v1/colony/resumption`: the suspended agents in the order the resource monitor
resumes them, read with the monitor's own code). In-process control plane over two replica
hosts on a real redis-server (tests/test_api_checkpoints.py's ControlledApi)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_api_checkpoints import TOKEN, ControlledApi

from colony.agents import Agent, AgentBlueprint, AgentMetadata, AgentRunCapability, ScriptedActionPolicy
from colony.agents.models import ResumptionCondition, ResumptionKind, SuspensionRequest
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.blackboard.query import newest_tagged
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.collaborate import CollaborationCapability
from colony.system.resumption_queue import queue_of


def blueprint(agent_id: str, priority: int = 0) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="lead", priority=priority),
        capabilities=[CollaborationCapability.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
        action_policy=ScriptedActionPolicy.bind(
            steps=[{"action": "delegate", "parameters": {"agent": "echo"}}]
        ),
    )


@pytest.fixture
def served(redis_url: str) -> Iterator[ControlledApi]:
    with ControlledApi(redis_url) as made:
        for name, priority in (("v-low", 0), ("v-high", 5), ("v-low-2", 0)):
            made.call(lambda n=name, p=priority: made.control.place(blueprint(n, p)))  # type: ignore[union-attr]
        yield made


def get(served: ControlledApi, path: str, **params: Any) -> httpx.Response:
    return httpx.get(
        served.url + path, params=params, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )


def test_an_agents_profile_says_what_it_is_built_with(served: ControlledApi) -> None:
    body = get(served, "/v1/agents/v-high/profile").json()
    assert body["agent_id"] == "v-high" and body["role"] == "lead" and body["priority"] == 5
    profile = body["profile"]
    assert profile["agent_class"] == "colony.agents.base.Agent"
    assert profile["action_policy"].endswith("ScriptedActionPolicy")
    assert any(c.endswith("CollaborationCapability") for c in profile["capabilities"])
    actions = {a["name"]: a for a in profile["actions"]}
    assert {"spawn", "delegate", "wait_for", "deliberate", "cancel_children"} <= set(actions)
    assert actions["spawn"]["planned"] and actions["spawn"]["description"]
    assert actions["spawn"]["effects"]  # declared effects travel with it (docs/effects.md)
    assert get(served, "/v1/agents/nobody/profile").status_code == 404
    assert get(served, "/v1/agents/..%2Fx/profile").status_code in (404, 422)


def test_a_profile_spoilt_in_redis_is_shown_as_not_recorded(served: ControlledApi) -> None:
    async def spoil() -> None:
        services = await served._services()
        agent_board = services.runs.api_board.scoped(services.runs.agent_scope("v-low"))
        entry = await agent_board.read(AgentStateProtocol.key("metadata"))
        value = {**entry.value, "profile": {"agent_class": "x" * 5000, "actions": "not a list"}}
        await agent_board.write(AgentStateProtocol.key("metadata"), value)

    served.call(spoil)
    body = get(served, "/v1/agents/v-low/profile").json()
    assert body == {**body, "agent_id": "v-low", "profile": None, "agent_type": None}


def test_the_resumption_queue_is_in_the_monitors_order(served: ControlledApi) -> None:
    empty = {"agents": [], "total": 0, "truncated": False, "complete": True}
    assert get(served, "/v1/colony/resumption").json() == empty
    for name in ("v-low", "v-high", "v-low-2"):  # suspended in this order: FIFO among equals
        served.call(lambda n=name: served.control.suspend(n))  # type: ignore[union-attr]
    queue = get(served, "/v1/colony/resumption").json()
    assert [a["agent_id"] for a in queue["agents"]] == ["v-high", "v-low", "v-low-2"]
    assert [a["position"] for a in queue["agents"]] == [1, 2, 3] and queue["total"] == 3
    head = queue["agents"][0]
    assert head["priority"] == 5 and head["waits"] == "custom" and head["suspended_at"] > 0
    assert head["page_bound"] is False and head["pages"] == []
    short = get(served, "/v1/colony/resumption", limit=1).json()
    assert [a["agent_id"] for a in short["agents"]] == ["v-high"] and short["truncated"] is True
    assert get(served, "/v1/colony/resumption", limit=0).status_code == 422
    assert get(served, "/v1/colony/resumption", limit=501).status_code == 422
    served.call(lambda: served.control.resume("v-high"))  # type: ignore[union-attr]
    assert [a["agent_id"] for a in get(served, "/v1/colony/resumption").json()["agents"]] == [
        "v-low",
        "v-low-2",
    ]


async def test_the_queue_orders_by_priority_then_time_then_id_and_skips_what_it_cannot_read(
    bb: Blackboard,
) -> None:
    def board_of(agent_id: str) -> Blackboard:
        return bb.scoped(f"{bb.scope_id}:{agent_id}")

    async def suspended(agent_id: str, priority: int | None, at: float) -> None:
        board = board_of(agent_id)
        if priority is not None:
            await board.write(
                AgentStateProtocol.key("metadata"), AgentMetadata(agent_id=agent_id, priority=priority)
            )
        condition = ResumptionCondition(kind=ResumptionKind.CHILDREN_COMPLETED, agent_ids=["c"])
        request = SuspensionRequest(agent_id=agent_id, condition=condition, requested_at=at)
        await board.write(AgentStateProtocol.key("suspension"), request.model_dump(mode="json"))

    await suspended("b", 1, 20.0)
    await suspended("a", 1, 20.0)
    await suspended("late", 1, 30.0)
    await suspended("urgent", 9, 40.0)
    await suspended("unknown", None, 10.0)  # no metadata: priority 0
    await board_of("spoilt").write(AgentStateProtocol.key("metadata"), {"priority": "high", "agent_type": 7})
    queued = await queue_of(["b", "a", "late", "urgent", "unknown", "spoilt"], board_of)
    assert [q.agent_id for q in queued] == ["urgent", "a", "b", "late", "spoilt", "unknown"]
    assert queued[0].condition.kind is ResumptionKind.CHILDREN_COMPLETED
    spoilt = next(q for q in queued if q.agent_id == "spoilt")
    assert spoilt.priority == 0 and spoilt.condition.kind is ResumptionKind.CUSTOM and spoilt.since == 0.0


def test_an_agents_runs_are_listed_newest_first(served: ControlledApi) -> None:
    from test_api_checkpoints import STEPS

    from colony.client import ColonyClient

    served.place("lister", STEPS, serve="runs")
    served.place("other", STEPS, serve="runs")
    with ColonyClient(served.url, TOKEN, timeout=60) as client:
        done = [client.run("lister", {"go": n}, timeout_s=60)["run_id"] for n in range(3)]
        client.run("other", {"go": 9}, timeout_s=60)
    listed = get(served, "/v1/runs", agent="lister").json()
    assert [r["run_id"] for r in listed["runs"]] == done[::-1]
    assert listed["total"] == 3 and listed["truncated"] is False and listed["agent"] == "lister"
    assert all(r["status"] == "succeeded" and "output" not in r for r in listed["runs"])
    assert [r["run_id"] for r in get(served, "/v1/runs", agent="lister", limit=1).json()["runs"]] == done[-1:]
    assert get(served, "/v1/runs", agent="nobody").json() == {
        "agent": "nobody",
        "runs": [],
        "total": 0,
        "truncated": False,
        "unreadable": 0,
    }
    for bad in ({}, {"agent": "a b"}, {"agent": "x" * 129}, {"agent": "lister", "limit": 0}):
        answer = get(served, "/v1/runs", **bad)
        assert answer.status_code == 422, (bad, answer.text)


async def test_newest_tagged_reads_a_bounded_part_and_prunes_what_is_gone(bb: Blackboard) -> None:
    for n in range(6):
        await bb.write(f"item:{n}", n, tags={"t"})
        await asyncio.sleep(0.003)  # creation times are in milliseconds
    await bb.redis.sadd(bb.keyspace.tag_key("t"), "item:gone", "other:x")  # retired; no item key
    keys, total, truncated = await newest_tagged(bb, "t", 3, 100, lambda k: k.startswith("item:"))
    assert keys == ["item:5", "item:4", "item:3"] and total == 6 and not truncated  # live items only
    assert "item:gone" not in await bb.redis.smembers(bb.keyspace.tag_key("t"))
    await bb.redis.srem(bb.keyspace.tag_key("t"), "other:x")  # six live members left
    keys, total, truncated = await newest_tagged(bb, "t", 10, 2)
    assert len(keys) == 2 and truncated  # more members than compared: says so


def test_a_run_record_that_does_not_validate_is_left_out_not_a_500(served: ControlledApi) -> None:
    from test_api_checkpoints import STEPS

    from colony.blackboard.protocol import ApiRunProtocol
    from colony.client import ColonyClient

    served.place("spoilt-runs", STEPS, serve="runs")
    with ColonyClient(served.url, TOKEN, timeout=60) as client:
        good = client.run("spoilt-runs", {"go": 1}, timeout_s=60)["run_id"]

    async def spoil() -> None:
        board = (await served._services()).runs.api_board
        tag = {ApiRunProtocol.agent_tag("spoilt-runs")}
        await board.write(ApiRunProtocol.run_key("run-bad"), {"agent": "spoilt-runs", "oops": 1}, tags=tag)
        await board.write("known:run-x", {"not": "a run record"}, tags=tag)  # no run key: not counted

    served.call(spoil)
    listed = get(served, "/v1/runs", agent="spoilt-runs")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [r["run_id"] for r in body["runs"]] == [good] and body["unreadable"] == 1 and body["total"] == 2


def test_a_queue_longer_than_one_reading_says_its_order_may_not_be_the_monitors(
    served: ControlledApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    from colony.api.routes import agent_views

    for name in ("v-low", "v-high", "v-low-2"):
        served.call(lambda n=name: served.control.suspend(n))  # type: ignore[union-attr]
    monkeypatch.setattr(agent_views, "MAX_QUEUE_READ", 2)
    queue = get(served, "/v1/colony/resumption").json()
    assert queue["complete"] is False and queue["total"] == 3 and len(queue["agents"]) == 2
    monkeypatch.setattr(agent_views, "MAX_QUEUE_READ", 20_000)
    assert get(served, "/v1/colony/resumption").json()["complete"] is True


def test_a_profile_over_its_bounds_in_redis_is_not_served() -> None:
    from pydantic import ValidationError

    from colony.agents.profile import NAME_CHARS, AgentProfile

    with pytest.raises(ValidationError):
        AgentProfile(agent_class="A", capabilities=["x" * (NAME_CHARS + 1)])
    with pytest.raises(ValidationError):
        AgentProfile.model_validate(
            {"agent_class": "A", "actions": [{"name": "a", "capability": "c", "effects": ["e" * 100_000]}]}
        )
