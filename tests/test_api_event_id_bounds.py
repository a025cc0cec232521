"""A Last-Event-ID whose parts exceed 64 bits is a 400 even when the run's stream is gone (the check
against the newest event cannot run then): passed on, it would reach the process's shared event
reader, whose XREAD Redis refuses, failing every other live event stream of the API process."""

from __future__ import annotations

import asyncio

from test_api import AUTH, api, wait_done  # noqa: F401 - `api` is a fixture

from colony.blackboard import Blackboard
from colony.config import load_settings
from colony.system.runs import RunService


async def test_a_last_event_id_beyond_64_bits_is_a_400_when_the_runs_stream_is_gone(
    api,  # noqa: F811
    bb: Blackboard,
) -> None:
    client, host = api
    run_id = (await client.post("/v1/runs", json={"agent": "echo", "input": 1}, headers=AUTH)).json()[
        "run_id"
    ]
    await wait_done(client, run_id)
    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=host.settings.colony_id, settings=load_settings())
    board = runs.run_board(await runs.record(run_id))
    await bb.redis.delete(board.keyspace.events_key)  # expired, or not written yet
    assert await board.last_generated_event_id() is None
    for last_event_id in ("99999999999999999999-0", "0-18446744073709551616"):
        async with asyncio.timeout(10):
            response = await client.get(
                f"/v1/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": last_event_id}
            )
        assert response.status_code == 400, response.text
        assert "Last-Event-ID" in response.json()["error"]["message"]
    # the largest id Redis takes is not refused for its size (it is past the run's events: 400 or a stream)
    async with asyncio.timeout(10):
        ok = await client.get(
            f"/v1/runs/{run_id}/events", headers={**AUTH, "Last-Event-ID": "18446744073709551615-0"}
        )
    assert ok.status_code in (200, 400)
