"""Room on demand (colony.system.placement, colony.api.wake): with room for two session agents
(`serve.max_agents_per_replica=3`, the `session` starter takes the third slot), a third session
suspends the least recently active idle one to Redis; a message (or a run) to a suspended session
resumes it and is answered; with every other agent busy the request is a quick 503 with
Retry-After, not a hang. The API on a loopback port over a real Redis, with a ReplicaHost (scripted
engine) and an in-process control plane behind it (tests/test_api_sessions.py's app, plus the
control plane the API reaches)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_api_sessions import TOKEN, SessionApp

from colony import metrics
from colony.api.app import ApiServices
from colony.api.wake import WAKE_SECONDS
from colony.client import ColonyClient
from colony.config import ServeSettings
from colony.system.placement import victims
from colony.system.registry import ON_DEMAND, AgentRecord
from colony.system.replicas import AgentSlot, ReplicaSnapshot


class RoomApp(SessionApp):
    """SessionApp with room for two sessions and its control plane behind the API."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        serve = ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=3)
        self.settings = self.settings.model_copy(update={"serve": serve})

    async def start_services(self) -> ApiServices:
        services = await super().start_services()
        services.control = self.control
        return services

    def record(self, agent_id: str) -> AgentRecord | None:
        assert self.control is not None
        registry = self.control.registry
        record: AgentRecord | None = self.call(lambda: registry.get(agent_id))
        return record

    def hosted(self) -> list[str]:
        assert self.host is not None and self.host.runtime is not None
        return sorted(self.host.runtime.agent_ids)

    def busy(self) -> set[str]:
        assert self.host is not None
        host = self.host
        snapshot: ReplicaSnapshot = self.call(lambda: host.snapshot())
        return {slot.agent_id for slot in snapshot.agents if slot.busy}


@pytest.fixture
def served(redis_url: str) -> Iterator[RoomApp]:
    with RoomApp(redis_url) as served:
        yield served


@pytest.fixture
def client(served: RoomApp) -> Iterator[ColonyClient]:
    with ColonyClient(served.url, TOKEN) as client:
        yield client


def evictions() -> float:
    return metrics.REGISTRY.get_sample_value("colony_agent_evictions_total", {"kind": "session"}) or 0.0


def test_sessions_beyond_room_suspend_the_least_recently_active(
    served: RoomApp, client: ColonyClient
) -> None:
    first = client.sessions.start()["session_id"]
    second = client.sessions.start()["session_id"]
    assert client.sessions.reply(first, "hello")["message"]["content"] == "reply number 1"
    before = evictions()
    third = client.sessions.start()["session_id"]  # no room: `second` was idle the longest
    assert served.hosted() == sorted(["session", first, third])
    record = served.record(second)
    assert record is not None and record.state == "suspended" and record.waits == ON_DEMAND
    assert evictions() == before + 1
    # waiting for its next message, it is no work for the resource monitor's rounds
    assert served.control is not None
    monitor = served.control.monitor
    assert second not in {r.agent_id for r in served.call(monitor._suspended_records)}
    assert served.call(monitor.tick) == []  # and a round does not resume it

    # a message to the suspended session resumes it (making room in its turn) and is answered
    out = client.sessions.reply(second, "are you there?")
    assert out["message"]["content"] == "reply number 2"
    assert second in served.hosted() and len(served.hosted()) == 3
    assert served.record(first).state == "suspended"  # type: ignore[union-attr]  # the oldest activity
    # and its tree came back with it: the earlier session's messages are all there too
    out = client.sessions.reply(first, "still here?")
    assert [m["content"] for m in client.sessions.messages(first)["messages"]] == [
        "hello",
        "reply number 1",
        "still here?",
        "reply number 3",
    ]
    assert out["message"]["content"] == "reply number 3"


def test_a_run_for_a_suspended_session_resumes_it(served: RoomApp, client: ColonyClient) -> None:
    first = client.sessions.start()["session_id"]
    client.sessions.start()
    client.sessions.start()  # `first` is suspended to make room
    assert served.record(first).state == "suspended"  # type: ignore[union-attr]
    answer = client.run(first, {"message": "a run, not a chat"}, timeout_s=20)
    assert answer["status"] == "succeeded" and answer["output"]["message"]["content"] == "reply number 1"
    assert first in served.hosted()


def test_nothing_to_suspend_is_a_quick_503_with_retry_after(served: RoomApp, client: ColonyClient) -> None:
    asleep = client.sessions.start()["session_id"]
    busy = [client.sessions.start()["session_id"] for _ in range(2)]  # `asleep` suspended
    assert served.record(asleep).state == "suspended"  # type: ignore[union-attr]
    served.engine.delay = 6.0  # the two hosted sessions are busy in a turn meanwhile
    replies: list[Any] = []
    turns = [
        threading.Thread(target=lambda s=s: replies.append(client.sessions.reply(s, "slow"))) for s in busy
    ]
    for turn in turns:
        turn.start()
    deadline = time.monotonic() + 10
    while served.busy() != set(busy) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.busy() == set(busy)
    started = time.monotonic()
    answer = httpx.post(
        f"{served.url}/v1/sessions/{asleep}/messages",
        json={"message": "anyone?"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=WAKE_SECONDS + 10,
    )
    waited = time.monotonic() - started
    assert answer.status_code == 503 and int(answer.headers["Retry-After"]) >= 1
    assert "no replica has room" in answer.json()["error"]["message"]
    assert waited < WAKE_SECONDS
    assert served.record(asleep).state == "suspended"  # type: ignore[union-attr]
    for turn in turns:
        turn.join(20)
    assert len(replies) == 2  # the busy ones were never suspended: both turns answered
    served.engine.delay = 0.0
    assert client.sessions.reply(asleep, "now?")["message"]["content"].startswith("reply number")


def test_victims_idle_sessions_first_then_lower_priority_then_longest_idle() -> None:
    snapshot = ReplicaSnapshot(
        replica_id="ra",
        agents=[
            AgentSlot(agent_id="low", priority=-1, idle_since=5.0),
            AgentSlot(agent_id="low-older", priority=-1, idle_since=1.0),
            AgentSlot(agent_id="equal", priority=0, idle_since=0.0),
            AgentSlot(agent_id="session-00000000000000aa", priority=3, idle_since=9.0),
            AgentSlot(agent_id="session-00000000000000bb", priority=3, idle_since=2.0),
            AgentSlot(agent_id="session-00000000000000cc", priority=0, idle_since=0.0, busy=True),
            AgentSlot(agent_id="low-busy", priority=-5, busy=True),
        ],
    )
    order = [v.agent_id for v in victims([snapshot], priority=0)]
    # busy ones never; an equal-priority non-session never; sessions whatever their priority
    assert order == ["session-00000000000000bb", "session-00000000000000aa", "low-older", "low"]


def test_a_waiting_turn_resumes_a_session_suspended_before_it_took_it(
    served: RoomApp, client: ColonyClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between a message stored for a hosted session and its agent taking it: a session
    suspended to make room there is resumed again by the waiting stream (`keep_awake`)."""
    from colony.api.routes import sessions as route

    monkeypatch.setattr(route, "KEEP_AWAKE_SECONDS", 0.05)
    monkeypatch.setattr(route, "KEEP_AWAKE_CHECKS", 3)
    session_id = client.sessions.start()["session_id"]
    assert served.control is not None
    control = served.control

    async def evict() -> str:
        return await control.placer.make_room_locked(0)

    assert served.call(evict) == session_id
    assert served.record(session_id).state == "suspended"  # type: ignore[union-attr]
    served.call(lambda: route.keep_awake(served.app.state.colony, session_id))
    assert session_id in served.hosted()


def test_a_session_suspended_by_request_is_not_woken_by_a_message(
    served: RoomApp, client: ColonyClient
) -> None:
    """Only a suspension for room is lifted by a message: one by request stays, and the message is
    refused at once (409, saying how to resume it), not stored for an agent that will not answer."""
    session_id = client.sessions.start()["session_id"]
    assert served.control is not None
    control = served.control
    served.call(lambda: control.suspend(session_id))
    answer = httpx.post(
        f"{served.url}/v1/sessions/{session_id}/messages",
        json={"message": "wake up?"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert answer.status_code == 409 and "/resume" in answer.json()["error"]["message"]
    assert served.record(session_id).state == "suspended"  # type: ignore[union-attr]
    assert client.sessions.messages(session_id)["total"] == 0
    served.call(lambda: control.resume(session_id))
    assert client.sessions.reply(session_id, "now")["message"]["content"] == "reply number 1"
