"""CPU per Redis round trip in this process: the blackboard's client with its pipelined connection
(`blackboard.pipelined_connection`, the default; colony/blackboard/multiplexed.py) beside the same
client on redis-py's connection pool (the baseline, what every command used before), measured side
by side in one run on an embedded redis-server.

Three shapes, each with 1 and --concurrency callers at once: a script call (EVALSHA, as every
blackboard write is), a read of an entry (HGETALL), and a pipeline of four script calls in one
round trip (`run_scripts`). Prints microseconds of this process's CPU per round trip for each, the
redis-server's CPU per round trip, and the ratio. Timings on a shared machine vary: compare the
columns of one run.

Usage: python benchmarks/redis_lane.py [--calls 20000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable

import psutil

from colony.blackboard import create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.blackboard.script_calls import run_scripts
from colony.config import BlackboardSettings, EmbeddedRedisSettings


async def measure(
    call: Callable[[], Awaitable[object]], calls: int, concurrency: int, server: psutil.Process
) -> tuple[float, float]:
    """(client us, server us) of CPU per call."""
    for _ in range(50):
        await call()
    each = calls // concurrency

    async def caller() -> None:
        for _ in range(each):
            await call()

    client0, server0 = time.process_time(), sum(server.cpu_times()[:2])
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    done = each * concurrency
    client = (time.process_time() - client0) / done * 1e6
    return client, (sum(server.cpu_times()[:2]) - server0) / done * 1e6


async def run(url: str, calls: int, concurrency: int, server: psutil.Process) -> None:
    clients = {
        "lane": create_redis(url, BlackboardSettings(pipelined_connection=True)),
        "pool": create_redis(url, BlackboardSettings(pipelined_connection=False)),
    }
    await clients["pool"].hset("bench:entry", mapping={f"f{n}": "x" * 40 for n in range(8)})
    print(f"{calls} calls per figure; us of CPU per round trip (client / redis-server)")
    print(f"  {'shape':<34} {'lane':>16} {'pool (baseline)':>18} {'pool/lane':>10}")
    try:
        for shape in ("script", "read", "pipeline of 4 scripts"):
            for callers in (1, concurrency):
                row: dict[str, tuple[float, float]] = {}
                for name, client in clients.items():
                    script = client.register_script("return redis.call('HGET', KEYS[1], ARGV[1])")
                    await script(keys=["bench:entry"], args=["f1"])
                    if shape == "script":

                        def call(s=script) -> Awaitable[object]:  # type: ignore[no-untyped-def]
                            return s(keys=["bench:entry"], args=["f1"])
                    elif shape == "read":

                        def call(c=client) -> Awaitable[object]:  # type: ignore[no-untyped-def]
                            return c.hgetall("bench:entry")
                    else:
                        batch = [(script, ["bench:entry"], [f"f{n}"]) for n in range(4)]

                        def call(c=client, b=batch) -> Awaitable[object]:  # type: ignore[no-untyped-def]
                            return run_scripts(c, b)

                    row[name] = await measure(
                        call, calls if shape != "pipeline of 4 scripts" else calls // 4, callers, server
                    )
                lane, pool = row["lane"], row["pool"]
                label = f"{shape}, {callers} caller{'s' if callers > 1 else ''}"
                print(
                    f"  {label:<34} {lane[0]:7.1f} / {lane[1]:5.1f}   {pool[0]:8.1f} / {pool[1]:5.1f}   "
                    f"{pool[0] / lane[0]:8.2f}x"
                )
    finally:
        for client in clients.values():
            await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    redis = EmbeddedRedis(tempfile.mkdtemp(prefix="colony-lane-"), EmbeddedRedisSettings(appendonly=False))
    info = redis.start()
    try:
        asyncio.run(run(info.url, args.calls, args.concurrency, psutil.Process(info.pid)))
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
