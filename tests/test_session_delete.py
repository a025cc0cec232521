"""`DELETE /v1/sessions/{id}`, `colony chat --delete` and the idle-session retention
(`context.session_idle_retention_seconds`): a deleted session leaves no key in Redis (the whole
keyspace SCANned for its id), a second DELETE is a 404. Same app as tests/test_room_on_demand.py."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cli_kit import run_cli
from test_api_sessions import TOKEN
from test_room_on_demand import RoomApp

from colony.client import ColonyClient
from colony.config import ContextSettings
from colony.errors import ApiError
from colony.wire.token import TOKEN_ENV


@pytest.fixture
def served(redis_url: str) -> Iterator[RoomApp]:
    with RoomApp(redis_url) as served:
        yield served


@pytest.fixture
def client(served: RoomApp) -> Iterator[ColonyClient]:
    with ColonyClient(served.url, TOKEN) as client:
        yield client


def keys_of(redis_url: str, session_id: str) -> list[str]:
    """Every key of the whole Redis whose name holds the session id."""
    with redis.Redis.from_url(redis_url) as r:
        return sorted(k.decode() for k in r.scan_iter(match=f"*{session_id}*", count=1000))


def test_delete_removes_every_key_and_a_second_delete_is_404(
    served: RoomApp, client: ColonyClient, redis_url: str
) -> None:
    hosted = client.sessions.start()["session_id"]
    client.sessions.reply(hosted, "remember me")
    asleep = client.sessions.start()["session_id"]
    client.sessions.reply(asleep, "me too")
    client.sessions.start()  # no room: `hosted` (the longest idle) is suspended
    assert served.record(hosted).state == "suspended"  # type: ignore[union-attr]
    kept = client.sessions.start()["session_id"]  # and then `asleep`
    assert served.record(asleep).state == "suspended"  # type: ignore[union-attr]
    client.sessions.reply(hosted, "back")  # resumed: hosted again, its turn's keys too
    assert len(keys_of(redis_url, hosted)) > 20  # state, tree, run scope, registry record
    for session_id in (hosted, asleep):  # one hosted, one suspended
        client.sessions.delete(session_id)
        assert keys_of(redis_url, session_id) == []
        with pytest.raises(ApiError) as second:
            client.sessions.delete(session_id)
        assert second.value.status == 404
        with pytest.raises(ApiError) as gone:
            client.sessions.get(session_id)
        assert gone.value.status == 404
    assert hosted not in served.hosted()
    assert served.record(hosted) is None and served.record(asleep) is None
    # the others are untouched, and the room freed is used without suspending anyone
    assert client.sessions.reply(kept, "still fine")["message"]["content"].startswith("reply number")
    with pytest.raises(ApiError) as bad:
        client.sessions.delete("session-../evil")
    assert bad.value.status in (404, 422)


def test_cli_chat_delete(served: RoomApp, client: ColonyClient, tmp_path: Path, redis_url: str) -> None:
    session_id = client.sessions.start()["session_id"]
    env = {**os.environ, TOKEN_ENV: TOKEN}
    done = run_cli("chat", "--url", served.url, "--delete", session_id, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"session {session_id} deleted"
    assert keys_of(redis_url, session_id) == []
    again = run_cli("chat", "--url", served.url, "--delete", session_id, cwd=tmp_path, env=env)
    assert again.returncode == 1 and "no session" in again.stderr


class ShortRetention(RoomApp):
    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        context = ContextSettings(session_max_message_chars=500, session_idle_retention_seconds=1.5)
        self.settings = self.settings.model_copy(update={"context": context})


def test_sessions_idle_past_the_retention_are_deleted(redis_url: str) -> None:
    with ShortRetention(redis_url) as served, ColonyClient(served.url, TOKEN) as client:
        control = served.control
        assert control is not None
        old = client.sessions.start()["session_id"]
        idle = client.sessions.start()["session_id"]
        client.sessions.start()  # `old` suspended to make room
        time.sleep(1.0)
        client.sessions.reply(idle, "a turn keeps it")  # its last activity is now
        time.sleep(0.8)  # `old` idle past the retention (suspended), `idle` not
        assert served.call(control.sweep_sessions) == [old]
        assert keys_of(redis_url, old) == [] and served.record(idle) is not None
        assert served.call(control.sweep_sessions) == []  # not due again so soon
