"""The pipelined connection every non-blocking command of a client shares
(colony/blackboard/multiplexed.py), on real redis-servers: replies reach the right callers under
concurrency, errors are redis-py's, blocking and transactional commands keep the pool, and a lost,
stuck or password-protected server behaves as it does through redis-py's own connections."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.multiplexed import ColonyRedis, LanePipeline, _on_lane
from colony.blackboard.redis_server import EmbeddedRedis, find_redis_binary
from colony.config import BlackboardSettings


def _key() -> str:
    return f"test:lane:{uuid.uuid4().hex[:8]}"


def _busy(seconds: float) -> tuple[str, ...]:
    """A script that keeps Redis busy for `seconds` (DEBUG SLEEP is off on Colony's servers)."""
    micros = int(seconds * 1_000_000)
    return (
        "EVAL",
        "local s = redis.call('TIME') repeat local n = redis.call('TIME') "
        f"until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > {micros} return 'done'",
        "0",
    )


async def test_concurrent_callers_each_get_their_own_reply_over_one_connection(redis_url: str) -> None:
    client = create_redis(redis_url)
    assert isinstance(client, ColonyRedis) and client.lane is not None
    key = _key()
    try:
        await client.delete(key)
        values = [f"v{n}" * (1 + n % 50) for n in range(500)]  # replies of many sizes, split across reads
        await asyncio.gather(*(client.hset(key, f"f{n}", v) for n, v in enumerate(values)))
        got = await asyncio.gather(*(client.hget(key, f"f{n}") for n in range(500)))
        assert got == values
        assert await client.hgetall(key) == {f"f{n}": v for n, v in enumerate(values)}  # RESP3 map -> dict
        pool = client.connection_pool
        assert not pool._in_use_connections and not pool._available_connections  # type: ignore[attr-defined]
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_cancelled_caller_does_not_shift_the_replies_of_the_others(redis_url: str) -> None:
    client = create_redis(redis_url)
    key = _key()
    try:
        await client.set(key, "mine")
        slow = asyncio.ensure_future(client.execute_command(*_busy(0.2)))
        waiting = asyncio.ensure_future(client.get(key))  # written after the script, answered after it
        await asyncio.sleep(0.05)
        waiting.cancel()
        assert await slow == "done"
        assert await client.get(key) == "mine"  # the cancelled caller's reply went nowhere
        assert await client.incr(key + ":n") == 1
    finally:
        await client.delete(key, key + ":n")
        await client.aclose()


async def test_errors_are_redis_pys_and_a_script_flush_is_survived(redis_url: str) -> None:
    client = create_redis(redis_url)
    key = _key()
    try:
        await client.set(key, "text")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await client.hget(key, "f")
        with pytest.raises(NoScriptError):
            await client.evalsha("0" * 40, 0)
        script = client.register_script("return redis.call('GET', KEYS[1])")
        assert await script(keys=[key]) == "text"
        await client.script_flush()
        assert await script(keys=[key]) == "text"  # NOSCRIPT -> loaded again, as with redis-py's pool
        async with client.pipeline(transaction=False) as pipe:
            assert isinstance(pipe, LanePipeline)
            pipe.get(key).hget(key, "f").strlen(key)
            replies = await pipe.execute(raise_on_error=False)
        assert replies[0] == "text" and isinstance(replies[1], ResponseError) and replies[2] == 4
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(key).hget(key, "f")
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await pipe.execute()
        assert await client.get(key) == "text"  # nothing left unread on the connection
    finally:
        await client.delete(key)
        await client.aclose()


async def test_blocking_reads_and_transactions_keep_their_own_connections(redis_url: str) -> None:
    client = create_redis(redis_url)
    key = _key()
    try:
        blocked = asyncio.ensure_future(client.blpop([key], timeout=2))
        reading = asyncio.ensure_future(client.xread({key + ":s": "$"}, block=2000))
        await asyncio.sleep(0.1)
        assert await client.set(key + ":x", "1")  # not stuck behind the blocked reads
        await client.rpush(key, "item")
        await client.xadd(key + ":s", {"a": "1"})
        assert list(await asyncio.wait_for(blocked, 5)) == [key, "item"]
        assert (await asyncio.wait_for(reading, 5))[0][0] == key + ":s"
        async with client.pipeline(transaction=True) as pipe:  # MULTI/EXEC through the pool
            pipe.incr(key + ":n").incr(key + ":n")
            assert await pipe.execute() == [1, 2]
        assert len(client.connection_pool._available_connections) >= 1  # type: ignore[attr-defined]
        raw = await client.dump(key + ":x")  # NEVER_DECODE: bytes, not text
        assert isinstance(raw, bytes)
    finally:
        await client.delete(key, key + ":x", key + ":n", key + ":s")
        await client.aclose()


async def test_the_lane_can_be_turned_off(redis_url: str) -> None:
    client = create_redis(redis_url, BlackboardSettings(pipelined_connection=False))
    try:
        assert not isinstance(client, ColonyRedis)
        assert await client.ping()
    finally:
        await client.aclose()


async def test_wrong_or_missing_password_is_an_auth_error(private_redis: EmbeddedRedis) -> None:
    info = private_redis.start()
    for url in (f"redis://{info.host}:{info.port}/0", f"redis://:{'0' * 64}@{info.host}:{info.port}/0"):
        client = create_redis(url)
        with pytest.raises(AuthenticationError):
            await client.get("anything")
        await client.aclose()
    client = create_redis(info.url)
    assert await client.set("k", "v") and await client.get("k") == "v"
    await client.aclose()


async def test_a_killed_server_fails_the_waiting_callers_and_a_restarted_one_serves_again(
    private_redis: EmbeddedRedis,
) -> None:
    info = private_redis.start()
    client = create_redis(info.url, BlackboardSettings(op_timeout_seconds=3.0))
    try:
        assert await client.set("k", "before")
        waiting = asyncio.ensure_future(client.execute_command(*_busy(1.0)))
        await asyncio.sleep(0.2)
        os.kill(info.pid, signal.SIGKILL)
        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            await asyncio.wait_for(waiting, 10)
        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            await client.get("k")  # nothing listens: refused after the client's retries
        private_redis.start(port=info.port)
        assert await client.get("k") == "before"  # a new connection, found on the next call
    finally:
        await client.aclose()


async def test_a_server_that_stops_answering_times_out_and_the_next_call_reconnects(
    private_redis: EmbeddedRedis,
) -> None:
    info = private_redis.start()
    quick = BlackboardSettings(op_timeout_seconds=0.3, connect_timeout_seconds=0.3)
    client = create_redis(info.url, quick)
    other = create_redis(info.url, BlackboardSettings(pipelined_connection=False))
    try:
        await client.set("k", "v")
        await other.client_pause(3000)  # no reply to anyone for three seconds
        started = asyncio.get_running_loop().time()
        with pytest.raises(RedisTimeoutError):
            await client.get("k")
        assert asyncio.get_running_loop().time() - started < 2.5  # three tries of 0.3 s and backoff
        await other.client_unpause()
        assert await client.get("k") == "v"
    finally:
        await other.client_unpause()
        await client.aclose()
        await other.aclose()


def test_a_client_used_from_a_second_event_loop_opens_a_connection_there(redis_url: str) -> None:
    client = create_redis(redis_url)
    key = _key()
    assert asyncio.run(client.set(key, "1"))
    assert asyncio.run(client.get(key)) == "1"  # the first loop is closed: its connection is left
    asyncio.run(client.delete(key))


async def test_a_blackboard_on_the_lane_makes_one_connection_for_many_writers(redis_url: str) -> None:
    client = create_redis(redis_url)
    probe = aioredis.from_url(redis_url, decode_responses=True)
    name = f"lane-{uuid.uuid4().hex[:6]}"
    try:
        await client.client_setname(name)  # through the pool (connection state): named, not the lane
        before = await probe.client_list()
        board = Blackboard(client, scope_id=f"lane-{uuid.uuid4().hex[:6]}")
        await asyncio.gather(*(board.write(f"k{n}", {"n": n}) for n in range(200)))
        entries = await board.read_many([f"k{n}" for n in range(200)])
        assert [e.value["n"] for e in entries if e is not None] == list(range(200))
        after = await probe.client_list()
        assert len(after) - len(before) <= 1  # the lane; the 200 writers borrowed no pooled connection
    finally:
        await client.aclose()
        await probe.aclose()


def test_pub_sub_and_blocking_forms_never_share_the_lane() -> None:
    """Under RESP3 (un)subscribe replies are pushes, no caller's reply: sent on the lane they would
    hand every later caller the previous one's reply."""
    for command in ("UNSUBSCRIBE", "punsubscribe", "SUNSUBSCRIBE", "SUBSCRIBE", "CLIENT SETNAME", "MULTI"):
        assert not _on_lane((command, "x"))
    assert not _on_lane(("XREAD", "Block", 10, "STREAMS", "s", "0"))
    assert not _on_lane((b"XREADGROUP", b"GROUP", b"g", b"c", b"block", 10, b"STREAMS", b"s", b">"))
    assert _on_lane(("XREAD", "COUNT", 10, "STREAMS", "s", "0")) and _on_lane(("EVALSHA", "0" * 40, 0))


async def test_a_value_that_does_not_decode_fails_only_its_own_reader(redis_url: str) -> None:
    client = create_redis(redis_url)
    raw = aioredis.from_url(redis_url)
    key = _key()
    try:
        await raw.set(key + ":bad", b"\xff\xfe not utf-8")
        await client.set(key, "fine")
        got = await asyncio.gather(
            *(client.get(key + (":bad" if n == 5 else "")) for n in range(11)), return_exceptions=True
        )
        assert isinstance(got[5], UnicodeDecodeError)
        assert got[:5] + got[6:] == ["fine"] * 10  # the others on the same connection are untouched
        lenient = create_redis(redis_url + ("&" if "?" in redis_url else "?") + "encoding_errors=replace")
        assert (await lenient.get(key + ":bad")).endswith(" not utf-8")  # the client's encoder settings
        await lenient.aclose()
    finally:
        await client.delete(key, key + ":bad")
        await client.aclose()
        await raw.aclose()


async def test_a_long_pipeline_answering_in_order_is_not_taken_for_a_stuck_connection(redis_url: str) -> None:
    """The bound is on silence, not on the whole batch: 50,000 INCRs under a 0.25 s timeout run
    once each (a timeout would have re-sent them)."""
    client = create_redis(redis_url, BlackboardSettings(op_timeout_seconds=0.25))
    key = _key()
    try:
        async with client.pipeline(transaction=False) as pipe:
            for _ in range(50_000):
                pipe.incr(key)
            replies = await pipe.execute()
        assert replies[-1] == 50_000 and await client.get(key) == "50000"
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_closed_client_serves_again_and_binary_arguments_are_taken(redis_url: str) -> None:
    client = create_redis(redis_url)
    key = _key()
    try:
        await client.set(key, bytearray(b"from a bytearray"))
        await client.aclose()  # as with redis-py's own client, a later call opens a new connection
        assert await client.get(key) == "from a bytearray"
        await client.set(key, memoryview(b"from a memoryview"))
        assert await client.get(key) == "from a memoryview"
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[Path]:
    """A password-protected redis-server listening on a Unix socket only."""
    socket_path = tmp_path / "redis.sock"
    server = subprocess.Popen(
        [str(find_redis_binary()), "--port", "0", "--unixsocket", str(socket_path), "--save", "",
         "--appendonly", "no", "--requirepass", "s3cr#t", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield socket_path
    server.terminate()
    server.wait(10)


async def test_a_unix_socket_url_serves_the_lane_and_the_pool(unix_redis: Path) -> None:
    """`unix://` URLs: lane commands and the pool's (a blocking read, a transaction) both work."""
    client = create_redis(f"unix://{unix_redis}?password=s3cr%23t&db=2")
    try:
        assert isinstance(client, ColonyRedis) and client.lane is not None
        assert await client.set("k", "v") and await client.get("k") == "v"
        await client.xadd("s", {"a": "1"})
        assert (await client.xread({"s": "0"}, block=100))[0][0] == "s"  # XREAD BLOCK: the pool
        async with client.pipeline(transaction=True) as pipe:
            assert await pipe.incr("n").incr("n").execute() == [1, 2]
    finally:
        await client.aclose()


async def test_commands_of_one_loop_iteration_share_a_write_and_a_lone_one_is_written_at_once(
    redis_url: str,
) -> None:
    client = create_redis(redis_url)
    key = _key()
    try:
        await client.set(key, "0")  # the connection is open
        wire = client.lane._wire  # type: ignore[union-attr]
        assert wire is not None and wire.transport is not None
        writes: list[int] = []
        real_write = wire.transport.write

        def counting(data: bytes) -> None:
            writes.append(len(data))
            real_write(data)

        wire.transport.write = counting  # type: ignore[method-assign]
        assert await asyncio.gather(*(client.incr(key) for _ in range(16))) == list(range(1, 17))
        assert len(writes) == 2  # the first at once (nothing owed), the other 15 together
        writes.clear()
        assert await client.get(key) == "16"
        assert len(writes) == 1 and not wire.outbox  # a lone command: written in its own call
    finally:
        await client.delete(key)
        await client.aclose()
