"""Page-bound sessions (docs/sessions.md, "Sessions about pages"): `POST /v1/sessions {"pages"}`
places a VCM_BOUND session agent whose turns start with its pages, faulted in on the replica that
hosts it. Served over HTTP on a real Redis with a ReplicaHost behind it: the scripted engine where
the model's words do not matter, the embedded model where the page slot's KV reuse is the point."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_api_sessions import TOKEN, SessionApp

from colony.client import ColonyClient
from colony.config import EngineSettings
from colony.errors import ApiError
from colony.inference import InferenceEngine
from colony.inference.scripted import ScriptedEngine

FACT = "The lighthouse keeper's parrot is named Captain Biscuit."


def page_session_app(redis_url: str, root: Path, engine: InferenceEngine, slots: int = 2) -> SessionApp:
    """tests/test_api_sessions.py's app (a ReplicaHost and a control plane behind the API) with
    `root` mappable and `slots` page slots."""
    return SessionApp(redis_url, engine, vcm={"allowed_roots": [str(root)]}, engine={"page_slots": slots})


def mapped_pages(client: ColonyClient, root: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (root / name).write_text(text)
    mapped = client._api.call("POST", "/v1/vcm/sources", json={"path": str(root), "page_tokens": 200})
    return [page["page_id"] for page in mapped["pages"]]


class TwoSlotScripted(ScriptedEngine):
    """The scripted engine holding at most 2 pages at once, as `engine.page_slots: 2` says."""

    def page_capacity(self) -> int | None:
        return 2


@pytest.fixture
def scripted(redis_url: str, tmp_path: Path) -> Iterator[tuple[SessionApp, ColonyClient]]:
    engine = TwoSlotScripted(lambda request: f"seen {len(request.messages)} messages")
    with page_session_app(redis_url, tmp_path, engine) as served, ColonyClient(served.url, TOKEN) as client:
        yield served, client


def test_a_page_bound_session_is_placed_with_its_pages_and_every_turn_starts_with_them(
    scripted: tuple[SessionApp, ColonyClient], tmp_path: Path
) -> None:
    served, client = scripted
    (page_id,) = mapped_pages(client, tmp_path, {"notes.txt": FACT})
    sid = client.sessions.start(pages=[page_id])["session_id"]
    record = client._api.call("GET", f"/v1/agents/{sid}")
    assert record["agent_type"] == "vcm_bound" and record["replica"] == "ra"
    assert served.host is not None and served.host.runtime is not None
    assert served.host.runtime.get(sid).metadata.bound_pages == [page_id]
    assert client.sessions.reply(sid, "What is the parrot called?")["message"]["content"]
    engine = served.engine
    assert isinstance(engine, ScriptedEngine)
    turn = engine.requests[-1]
    assert turn.page_ids == [page_id]
    assert page_id in engine.resident_pages()  # prefetched when placed, or faulted by the turn
    # evicted between turns: the next turn faults it back in, and still names it
    host = served.host
    assert host is not None
    served.call(lambda: host.paging.evict(page_id))
    faults = host.paging.counts["faults"]
    client.sessions.reply(sid, "And the keeper?")
    assert engine.requests[-1].page_ids == [page_id]
    assert host.paging.counts["faults"] == faults + 1
    assert page_id in engine.resident_pages()
    # a plain session still names no page
    plain = client.sessions.start()["session_id"]
    client.sessions.reply(plain, "hello")
    assert engine.requests[-1].page_ids == []
    assert client._api.call("GET", f"/v1/agents/{plain}")["agent_type"] == "service"


@pytest.mark.parametrize(
    ("pages", "names"),
    [
        (["pg-0000000000000000"], "pages[0]"),  # well formed, not mapped
        (["../../etc/passwd"], "pages"),  # not a page id at all
        ([f"pg-{i:016x}" for i in range(9)], "pages"),  # more than a session may name
        ([f"pg-{i:016x}" for i in range(3)], "page_slots"),  # more than an engine holds (2)
    ],
)
def test_hostile_page_lists_are_refused_with_the_field_named(
    scripted: tuple[SessionApp, ColonyClient], pages: list[str], names: str
) -> None:
    _served, client = scripted
    with pytest.raises(ApiError) as refused:
        client.sessions.start(pages=pages)
    assert refused.value.status == 422 and names in str(refused.value)
    with pytest.raises(ApiError) as wrong_type:
        client._api.call("POST", "/v1/sessions", json={"pages": "pg-0000000000000000"})
    assert wrong_type.value.status == 422


@pytest.mark.slow
def test_the_embedded_model_answers_from_the_page_and_reuses_its_kv_cache_on_the_next_turn(
    redis_url: str, tmp_path: Path
) -> None:
    from colony.inference import EmbeddedEngine

    engine = EmbeddedEngine(EngineSettings(page_slots=2, slot_context_tokens=1024, threads=2))
    with page_session_app(redis_url, tmp_path, engine) as served, ColonyClient(served.url, TOKEN) as client:
        (page_id,) = mapped_pages(client, tmp_path, {"notes.txt": FACT + "\n" * 3})
        sid = client.sessions.start(pages=[page_id])["session_id"]
        first = client.sessions.reply(sid, "What is the name of the parrot?")["message"]["content"]
        assert "Biscuit" in first  # the page reached the model
        page_tokens = engine.stats().prompt_tokens  # nothing but this turn so far
        before = engine.stats()
        client.sessions.reply(sid, "Who owns the parrot?")
        after = engine.stats()
        prompt = after.prompt_tokens - before.prompt_tokens
        cached = after.cached_tokens - before.cached_tokens
        # the second turn prefilled only what followed the page and the first turn: the page (and
        # the earlier turn) came from the page slot's KV cache
        assert cached >= page_tokens - 8 and prompt - cached < prompt // 2
        assert served.host is not None and served.host.paging.counts["faults"] == 0


def test_colony_chat_page_starts_a_session_about_the_page(
    scripted: tuple[SessionApp, ColonyClient], tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    from colony.wire.token import TOKEN_ENV

    served, client = scripted
    (page_id,) = mapped_pages(client, tmp_path, {"notes.txt": FACT})

    def chat(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "colony.cli", "chat", "--url", served.url, *extra],
            input="what is the parrot called?\n/quit\n",
            capture_output=True,
            text=True,
            env={**os.environ, TOKEN_ENV: TOKEN},
            cwd=tmp_path,
            timeout=120,
        )

    done = chat("--page", page_id)
    assert done.returncode == 0, done.stderr
    assert "seen" in done.stdout  # the scripted reply came back
    engine = served.engine
    assert isinstance(engine, ScriptedEngine) and engine.requests[-1].page_ids == [page_id]
    both = chat("--page", page_id, "--session", "session-0123456789abcdef")
    assert both.returncode == 2 and "--page starts a new session" in both.stderr
    unknown = chat("--page", "pg-ffffffffffffffff")
    assert unknown.returncode == 1 and "pages[0]" in unknown.stderr


def test_a_session_run_submitted_directly_is_held_to_the_same_page_rules(
    scripted: tuple[SessionApp, ColonyClient],
) -> None:
    """`POST /v1/runs` to the `session` agent skips the route's checks: the starter checks again."""
    _served, client = scripted
    for pages, says in (
        (["pg-0000000000000000"], "pages[0]"),
        ([f"pg-{i:016x}" for i in range(3)], "at most 2"),
        ("pg-0000000000000000", "pages"),  # not a list: the parameter check refuses it
    ):
        run = client.run("session", {"pages": pages})
        assert run["status"] == "failed" and says in run["error"], run


class SmallWindow(TwoSlotScripted):
    context_window = 700


def test_pages_that_leave_no_prompt_room_are_refused_at_start(redis_url: str, tmp_path: Path) -> None:
    """A session whose pages fill the slot's prompt could never answer: refused when it starts (422
    naming the field), not 201 and then a failed turn every time."""
    with (
        page_session_app(redis_url, tmp_path, SmallWindow(lambda r: "ok")) as served,
        ColonyClient(served.url, TOKEN) as client,
    ):
        big, small = mapped_pages(client, tmp_path, {"a.txt": "word " * 1200, "b.txt": FACT})
        with pytest.raises(ApiError) as refused:
            client.sessions.start(pages=[big])
        assert (
            refused.value.status == 422
            and "pages" in str(refused.value)
            and "prompt tokens" in str(refused.value)
        )
        sid = client.sessions.start(pages=[small])["session_id"]  # a page that leaves room is fine
        assert client.sessions.reply(sid, "hi")["message"]["content"] == "ok"


def test_a_page_id_with_junk_around_it_is_a_422_naming_the_field(
    scripted: tuple[SessionApp, ColonyClient],
) -> None:
    _served, client = scripted
    for bad in ["xx pg-0123456789abcdef", "a:pg-0123456789abcdef", "pg-0123456789abcdef" + "x" * 5000]:
        with pytest.raises(ApiError) as refused:
            client.sessions.start(pages=[bad])
        assert refused.value.status == 422 and "pages" in str(refused.value), bad
