"""A lock in Redis held by one writer at a time across processes: a random token set only where
the key is absent, with a time to live (a holder that crashed lets go by itself), released only
by its holder (a holder that outlived its time does not release the next one's)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
POLL_SECONDS = 0.02


@contextlib.asynccontextmanager
async def redis_lock(
    redis: Any, key: str, *, hold_seconds: float, wait_seconds: float
) -> AsyncIterator[bool]:
    """Hold the lock at `key` for the block; yields whether it was taken within `wait_seconds`
    (False: another holder kept it that long, and the block runs without it: the caller decides)."""
    token, deadline = secrets.token_hex(8), time.monotonic() + wait_seconds
    while not await redis.set(key, token, nx=True, px=max(1, int(hold_seconds * 1000))):
        if time.monotonic() > deadline:
            yield False
            return
        await asyncio.sleep(POLL_SECONDS)
    try:
        yield True
    finally:
        with contextlib.suppress(Exception):  # (unreleased, it lapses after hold_seconds)
            await redis.eval(_RELEASE, 1, key, token)
