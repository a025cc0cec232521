"""Sessions over HTTP (colony.api.routes.sessions) and the client (colony.client_sessions): the API
served on a loopback port over a real Redis, with a ReplicaHost (scripted engine) and an in-process
control plane behind it, so `POST /v1/sessions` really places a session agent through the catalog's
`session` agent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_kit import ServedApi

from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.client import ColonyClient
from colony.config import ColonySettings, ServeSettings
from colony.errors import ApiError
from colony.inference import InferenceEngine, InferenceRequest
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import session_starter_blueprint
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TOKEN = "sessions-token"


class SessionApp(ServedApi):
    """`model`: the replica's engine (default: the scripted one answering `reply`); `settings`:
    fields of ColonySettings beside these (tests/test_page_sessions.py maps folders)."""

    def __init__(self, redis_url: str, model: InferenceEngine | None = None, **settings: Any) -> None:
        context = settings.pop("context", {"session_max_message_chars": 500})
        colony = ColonySettings(
            redis_url=redis_url,
            colony_id=f"sa{uuid.uuid4().hex[:8]}",
            serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=16),
            context=context,
            **settings,
        )
        super().__init__(colony, TOKEN, start_timeout=60)
        self.counter = 0
        self.engine = model if model is not None else ScriptedEngine(self.reply)
        self.host: ReplicaHost | None = None
        self.control: ControlPlane | None = None
        self._client: Any = None

    def reply(self, request: InferenceRequest) -> str:
        """`reply number N`; to a message starting with `/`, a second line quoting it (a reply
        with a newline, and proof of what was sent)."""
        self.counter += 1
        asked = request.messages[-1].content
        tail = f"\nto {asked}" if asked.startswith("/") else ""
        return f"reply number {self.counter}{tail}"

    async def start_services(self) -> ApiServices:
        settings = self.settings
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, "colony:sessions", settings=settings.blackboard)
        self.host = ReplicaHost(settings, "ra", engine=self.engine)
        self.control = ControlPlane(board, {"ra": self.host}, settings)
        self.host.spawner = self.control.place
        await self.host.start(board)
        await self.control.place(session_starter_blueprint())
        ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        return ApiServices(
            runs=RunService(board, self.control.registry, settings=settings, **ids),
            registry=self.control.registry,
            token=TOKEN,
            pages=self.host.pages,
            vcm=settings.vcm,
            settings=settings,
        )

    async def stop_services(self) -> None:
        assert self.control is not None and self.host is not None
        await self.control.close()
        await self.host.close()
        await self._client.aclose()


@pytest.fixture
def served(redis_url: str) -> Iterator[SessionApp]:
    with SessionApp(redis_url) as served:
        yield served


@pytest.fixture
def client(served: SessionApp) -> Iterator[ColonyClient]:
    with ColonyClient(served.url, TOKEN) as client:
        yield client


def prompt(served: SessionApp) -> list[str]:
    return [m.content for m in served.engine.requests[-1].messages if m.role != "system"]


def test_three_turns_revert_and_the_tree_never_leaks(served: SessionApp, client: ColonyClient) -> None:
    session = client.sessions.start()
    sid = session["session_id"]
    assert session["active"] is None and session["messages"] == 0
    events = list(client.sessions.send(sid, "first question"))
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "turn" and kinds[1] == "user_chat_message" and kinds[-1] == "message"
    tokens = [e["data"]["text"] for e in events if e["event_type"] == "token"]
    assert tokens  # the reply streamed before the final message (its words may share an event)
    final = events[-1]["data"]["message"]
    assert final["role"] == "assistant" and final["content"] == "".join(tokens).strip() == "reply number 1"
    client.sessions.reply(sid, "second question")
    client.sessions.reply(sid, "third question")
    active = client.sessions.messages(sid)["messages"]
    assert [m["role"] for m in active] == ["user", "assistant"] * 3
    message_2, message_3 = active[1], active[2]

    reverted = client.sessions.revert(sid, message_2["id"])
    assert {b["name"]: b["length"] for b in reverted["branches"]} == {"main": 2}
    out = client.sessions.reply(sid, "a different second question")
    # the prompt holds messages 1-2 and the new one only
    assert prompt(served) == ["first question", "reply number 1", "a different second question"]
    assert out["context"][:2] == [active[0]["id"], message_2["id"]] and len(out["context"]) == 3
    everything = client.sessions.messages(sid, all=True)
    listed = {m["id"]: m for m in everything["messages"]}
    assert message_3["id"] in listed and len(listed) == 8  # message 3 and its reply are still there
    assert any(m["parent_id"] == message_3["id"] and m["role"] == "assistant" for m in listed.values())
    now = [m["content"] for m in client.sessions.messages(sid)["messages"]]
    assert now == ["first question", "reply number 1", "a different second question", "reply number 4"]


def test_two_forks_from_one_message_keep_separate_transcripts(
    served: SessionApp, client: ColonyClient
) -> None:
    sid = client.sessions.start()["session_id"]
    client.sessions.reply(sid, "hello")
    start = client.sessions.messages(sid)["messages"][1]["id"]
    left = client.sessions.fork(sid, start, "left")
    assert left["active"] == "left"
    client.sessions.reply(sid, "left question")
    right = client.sessions.fork(sid, start)
    assert right["active"] not in ("left", "main")
    client.sessions.reply(sid, "right question")
    assert prompt(served) == ["hello", "reply number 1", "right question"]  # nothing of `left`
    right_transcript = [m["content"] for m in client.sessions.messages(sid)["messages"]]
    client.sessions.switch(sid, "left")
    left_transcript = [m["content"] for m in client.sessions.messages(sid)["messages"]]
    assert right_transcript == ["hello", "reply number 1", "right question", "reply number 3"]
    assert left_transcript == ["hello", "reply number 1", "left question", "reply number 2"]
    view = client.sessions.get(sid)
    assert {b["name"]: b["length"] for b in view["branches"]} == {
        "main": 2,
        "left": 4,
        right["active"]: 4,
    }


def test_errors(served: SessionApp, client: ColonyClient) -> None:
    sid = client.sessions.start()["session_id"]
    unknown = "msg-0123456789ab"
    # no active branch (no message yet) -> 409
    with pytest.raises(ApiError) as caught:
        client.sessions.revert(sid, unknown)
    assert caught.value.status == 409 and "no active branch" in str(caught.value)
    client.sessions.reply(sid, "hi")
    for call in (lambda: client.sessions.revert(sid, unknown), lambda: client.sessions.fork(sid, unknown)):
        with pytest.raises(ApiError) as caught:
            call()
        assert caught.value.status == 404 and unknown in str(caught.value)
    # an unknown session, and an agent that is not a session -> 404
    for other in ("session-0123456789abcdef", "session"):
        with pytest.raises(ApiError) as caught:
            client.sessions.messages(other)
        assert caught.value.status == 404
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        too_long = http.post(f"/v1/sessions/{sid}/messages", json={"message": "x" * 501})
        assert too_long.status_code == 422 and "session_max_message_chars" in too_long.text
        blank = http.post(f"/v1/sessions/{sid}/messages", json={"message": " \u2028\u3000 "})
        assert blank.status_code == 422 and "only whitespace" in blank.text  # (found by review)
        bad_id = http.post(f"/v1/sessions/{sid}/revert", json={"message_id": "../../etc"})
        assert bad_id.status_code == 422 and "message_id" in bad_id.text
        taken = http.post(
            f"/v1/sessions/{sid}/fork",
            json={"message_id": client.sessions.messages(sid)["messages"][0]["id"], "branch": "main"},
        )
        assert taken.status_code == 422 and "already has a branch" in taken.text
        assert http.get(f"/v1/sessions/{sid}", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_turn_without_room_for_its_reply_is_refused_before_anything_is_stored(redis_url: str) -> None:
    """Found by review: the last message under `session_max_messages` was stored and answered by the
    model, then its reply refused and lost, and the limit answered as a 200 stream ending in error."""
    with SessionApp(redis_url, context={"session_max_messages": 11}) as served, ColonyClient(
        served.url, TOKEN
    ) as client:
        sid = client.sessions.start()["session_id"]
        for n in range(5):
            client.sessions.reply(sid, f"message {n}")
        asked = served.counter
        with pytest.raises(ApiError) as caught:
            client.sessions.reply(sid, "one too many")
        assert caught.value.status == 422 and "holds 10 of its 11 messages" in str(caught.value)
        assert served.counter == asked and client.sessions.get(sid)["messages"] == 10


def test_revert_to_another_branchs_message_is_refused(served: SessionApp, client: ColonyClient) -> None:
    """A revert goes back along the active branch only: a message of another branch would bring
    that branch's messages into this one's prompt. 404 saying what to do; nothing changes."""
    sid = client.sessions.start()["session_id"]
    client.sessions.reply(sid, "hello")
    start = client.sessions.messages(sid)["messages"][1]["id"]
    client.sessions.reply(sid, "main secret")
    client.sessions.fork(sid, start, "side")
    side = client.sessions.reply(sid, "side question")["message"]["id"]
    client.sessions.switch(sid, "main")
    before = client.sessions.get(sid)
    with pytest.raises(ApiError) as caught:
        client.sessions.revert(sid, side)
    assert caught.value.status == 404 and "not on the active branch" in str(caught.value)
    assert "switch to the branch" in str(caught.value)
    assert client.sessions.get(sid) == before
    main = [m["content"] for m in client.sessions.messages(sid)["messages"]]
    assert main == ["hello", "reply number 1", "main secret", "reply number 2"]


def test_message_listing_pages(served: SessionApp, client: ColonyClient) -> None:
    sid = client.sessions.start()["session_id"]
    for text in ("one", "two", "three"):
        client.sessions.reply(sid, text)
    whole = client.sessions.messages(sid)
    assert whole["total"] == 6 and whole["offset"] == 0 and whole["next_offset"] is None
    ids = [m["id"] for m in whole["messages"]]
    first = client.sessions.messages(sid, limit=4)
    assert [m["id"] for m in first["messages"]] == ids[:4] and first["next_offset"] == 4
    rest = client.sessions.messages(sid, limit=4, offset=first["next_offset"])
    assert [m["id"] for m in rest["messages"]] == ids[4:] and rest["next_offset"] is None
    assert client.sessions.messages(sid, offset=50)["messages"] == []
    client.sessions.revert(sid, ids[1])
    client.sessions.reply(sid, "again")
    everything = client.sessions.messages(sid, all=True, limit=5, offset=3)
    assert everything["total"] == 8 and len(everything["messages"]) == 5
    assert everything["messages"][0]["id"] == ids[3] and everything["next_offset"] is None
    paged = [m["content"] for m in client.sessions.all_messages(sid, all=True)]
    assert paged[:6] == ["one", "reply number 1", "two", "reply number 2", "three", "reply number 3"]
    assert len(paged) == 8
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        url = f"/v1/sessions/{sid}/messages"
        assert http.get(url, params={"limit": 10_000}).status_code == 200
        for params, field in (
            ({"limit": 0}, "limit"),
            ({"limit": 10_001}, "limit"),
            ({"limit": "many"}, "limit"),
            ({"offset": -1}, "offset"),
        ):
            answer = http.get(url, params=params)
            assert answer.status_code == 422 and field in answer.json()["error"]["message"], params


def session_agents(client: ColonyClient) -> set[str]:
    return {a["agent_id"] for a in client.agents() if a["agent_id"].startswith("session-")}


def test_a_start_retried_after_its_503_gets_the_same_session(
    served: SessionApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start answers 503 when its session is not placed in time, and the run goes on: the
    client's retry (same Idempotency-Key) follows that same starter run, never a second session."""
    from colony.api.routes import sessions as routes

    real_get, seen = RunService.get, []

    async def first_still_queued(self: RunService, run_id: str) -> Any:
        view = await real_get(self, run_id)
        seen.append(run_id)
        return view.model_copy(update={"status": "queued"}) if len(seen) == 1 else view

    monkeypatch.setattr(routes, "START_TIMEOUT_S", 0.0)  # a try looks once: the first sees it queued
    monkeypatch.setattr(RunService, "get", first_still_queued)
    with ColonyClient(served.url, TOKEN, attempts=8) as client:
        before = session_agents(client)
        started = client.sessions.start()
        made = session_agents(client) - before
    assert len(seen) >= 2 and len(set(seen)) == 1  # retried (after the 503), on the same starter run
    assert made == {started["session_id"]}  # one session for one start, however many tries


def test_a_message_retried_after_a_5xx_is_one_turn(
    served: SessionApp, client: ColonyClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message's run is submitted, then the route fails (500): the client retries with the
    same key and follows the same turn; the message is stored once and the reply comes back."""
    sid = client.sessions.start()["session_id"]
    real, calls = RunService.submit, []

    async def submit_then_fail(self: RunService, agent: str, input_data: Any, **kwargs: Any) -> Any:
        record = await real(self, agent, input_data, **kwargs)
        calls.append(kwargs.get("run_id"))
        if len(calls) == 1:
            raise RuntimeError("the replica died after submitting the turn")
        return record

    monkeypatch.setattr(RunService, "submit", submit_then_fail)
    reply = client.sessions.reply(sid, "only once please")
    assert reply["message"]["content"].startswith("reply number")
    assert len(calls) == 2 and calls[0] is not None and calls[0] == calls[1]  # the same run, twice asked
    contents = [m["content"] for m in client.sessions.messages(sid, all=True)["messages"]]
    assert contents.count("only once please") == 1 and len(contents) == 2


def test_a_replayed_turn_is_told_as_the_turn_it_was(served: SessionApp, client: ColonyClient) -> None:
    """A keyed message sent again after its answer: the server answers 303 to the turn's run
    events, whose end (`completed`) the client tells as the `message` it was."""
    from colony.client_sessions import as_turn_event

    sid = client.sessions.start()["session_id"]
    key = {"Idempotency-Key": uuid.uuid4().hex, "Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=served.url, headers=key, timeout=30) as http:
        first = http.post(f"/v1/sessions/{sid}/messages", json={"message": "hello there"})
        assert first.status_code == 200 and "event: message" in first.text
        again = http.post(f"/v1/sessions/{sid}/messages", json={"message": "hello there"})
    assert again.status_code == 303 and again.headers["Idempotent-Replayed"] == "true"
    run_id = again.headers["Colony-Run-Id"]
    told = [as_turn_event(e) for e in client.events(run_id)]
    assert told[-1]["event_type"] == "message"
    assert told[-1]["data"]["message"]["content"] == "reply number 1"
    assert as_turn_event({"event_type": "failed", "data": {"error": "boom"}}) == {
        "event_type": "error",
        "data": {"status": "failed", "error": "boom"},
    }
    contents = [m["content"] for m in client.sessions.messages(sid, all=True)["messages"]]
    assert contents == ["hello there", "reply number 1"]
