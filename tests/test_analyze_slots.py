"""More page workers than page slots on one replica take turns: a worker whose page cannot get a
slot within `vcm.page_wait_seconds` (every slot held by its siblings) waits on, up to
SLOT_WAIT_SECONDS, instead of giving its page up as not analysed (seen on colony/planning: 7 of
10 pages lost to 'every page slot holds a page in use')."""

from __future__ import annotations

from typing import Any

import pytest

from colony.errors import PageSlotsBusy, ResourceExhausted
from colony.system import analyze_worker
from colony.system.analyze_worker import generate_when_a_slot_frees


class BusyReplica:
    replica_id = "r1"

    def __init__(self, busy: int, error: type[Exception] = PageSlotsBusy) -> None:
        self.busy, self.calls, self.error = busy, 0, error

    async def generate(self, request: dict[str, Any], page_ids: list[str], holder: str | None = None) -> Any:
        self.calls += 1
        if self.calls <= self.busy:
            raise self.error("every page slot holds a page in use (pinned)")
        return {"text": "ok", "usage": {"cached_tokens": 0}}


async def test_a_worker_waits_its_turn_for_a_slot() -> None:
    replica = BusyReplica(busy=3)
    answer = await generate_when_a_slot_frees(replica, {"messages": []}, "p1", "w0")  # type: ignore[arg-type]
    assert answer["text"] == "ok" and replica.calls == 4


async def test_it_gives_up_after_the_total_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analyze_worker, "SLOT_WAIT_SECONDS", 0.0)
    with pytest.raises(PageSlotsBusy):
        await generate_when_a_slot_frees(BusyReplica(busy=10), {"messages": []}, "p1", "w0")  # type: ignore[arg-type]


async def test_a_request_that_can_never_fit_is_not_retried() -> None:
    replica = BusyReplica(busy=10, error=ResourceExhausted)
    with pytest.raises(ResourceExhausted):
        await generate_when_a_slot_frees(replica, {"messages": []}, "p1", "w0")  # type: ignore[arg-type]
    assert replica.calls == 1
