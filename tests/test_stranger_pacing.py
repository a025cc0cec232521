"""Calls with no valid token are paced when they come as a flood (colony.api.stranger_pacing): the
first 50 of a second are answered at once, the rest held until the second ends, at most 16 at
once; a mistyped token now and then is answered at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from tenant_kit import HOME, TenantApp

from colony.api import stranger_pacing
from colony.api.stranger_pacing import StrangerPacing
from colony.blackboard.redis_server import RedisServerInfo


async def _at_a_second_start() -> None:
    now = time.monotonic()
    await asyncio.sleep(int(now) + 1 - now + 0.01)


@pytest.mark.asyncio
async def test_a_flood_of_wrong_tokens_waits_for_the_next_second() -> None:
    pacing = StrangerPacing(per_second=5, max_held=3)
    await _at_a_second_start()
    began = time.monotonic()
    assert [await pacing.pace() for _ in range(5)] == [False] * 5  # the second's share: at once
    assert time.monotonic() - began < 0.5
    held = await asyncio.gather(*(pacing.pace() for _ in range(6)))
    assert sorted(held) == [False] * 3 + [True] * 3  # three held, the rest answered at once
    assert 0.5 < time.monotonic() - began < 1.5 and pacing.held == 0
    assert await pacing.pace() is False  # a new second: at once again


@pytest.mark.asyncio
async def test_a_held_401_that_is_cancelled_gives_its_place_back() -> None:
    pacing = StrangerPacing(per_second=0, max_held=1)
    await _at_a_second_start()
    waiting = asyncio.ensure_future(pacing.pace())
    await asyncio.sleep(0.05)
    assert pacing.held == 1 and await pacing.pace() is False  # (the one place is taken)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pacing.held == 0


def test_the_api_holds_a_flood_of_wrong_tokens(
    redis_server: RedisServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the API's guard: past the second's share, a wrong token's 401 waits for the next
    second; a right token is never held."""
    monkeypatch.setattr(stranger_pacing, "STRANGERS_PER_SECOND", 2)
    with TenantApp(redis_server.url, [tmp_path]) as app, httpx.Client(base_url=app.url, timeout=30) as http:
        wrong = {"Authorization": "Bearer wrong"}
        asyncio.run(_at_a_second_start())
        took = []
        for _ in range(3):
            began = time.monotonic()
            assert http.get("/v1/agents", headers=wrong).status_code == 401
            took.append(time.monotonic() - began)
        assert max(took[:2]) < 0.5 and took[2] > 0.3, took  # the third of its second waited
        began = time.monotonic()
        assert http.get("/v1/agents", headers=HOME).status_code == 200
        assert time.monotonic() - began < 0.5
