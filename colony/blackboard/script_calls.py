"""The blackboard's Lua scripts as registered on a Redis client, and how several of them go to
Redis in one round trip (`run_scripts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from colony.blackboard import scripts


class _Scripts(NamedTuple):
    """The Lua scripts registered on one client (a sha1 of each script's text is computed when it
    is registered: done once per client, not for every `Blackboard`/`scoped()` made)."""

    write: AsyncScript
    write_batch: AsyncScript
    delete: AsyncScript
    commit: AsyncScript
    prune_tag_index: AsyncScript
    expire: AsyncScript
    expire_key: AsyncScript
    claim_oldest: AsyncScript
    extend_key: AsyncScript


_SCRIPTS_ATTR = "_colony_scripts"


ScriptCall = tuple[AsyncScript, list[str], list[Any]]  # a registered script, its keys, its arguments


async def run_scripts(
    redis: aioredis.Redis, calls: Sequence[ScriptCall], *, idempotent_after: int | None = None
) -> list[Any]:
    """Run script calls in order, pipelined in one round trip, by SHA. redis-py's own pipeline of
    scripts asks Redis whether they exist (SCRIPT EXISTS) before every batch, a second round trip
    each time; here a call Redis answers NOSCRIPT (its scripts flushed: a restart, a failover) is
    run again once its script is loaded, in order with the others it failed beside. Only calls
    that failed so are repeated (nothing Redis applied runs twice), except that the calls from
    index `idempotent_after` on (ones that are safe to apply twice, e.g. expiries that never
    extend) are run again after a missing call before them, so they still follow it. Raises the
    first error."""
    replies = await _evalsha_pipeline(redis, calls)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
            await redis.script_load(script.script)  # the same text: the same SHA
        if idempotent_after is not None and missing[0] < idempotent_after:
            missing = sorted({*missing, *range(idempotent_after, len(calls))})
        again = await _evalsha_pipeline(redis, [calls[i] for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def _evalsha_pipeline(redis: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    async with redis.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


def scripts_of(redis: aioredis.Redis) -> _Scripts:
    """The client's registered scripts, kept on the client itself: a module registry keyed by the
    client would keep every client alive (each script refers back to its client)."""
    found: _Scripts | None = getattr(redis, _SCRIPTS_ATTR, None)
    if found is None:
        found = _Scripts(
            *(
                redis.register_script(text)
                for text in (
                    scripts.WRITE,
                    scripts.WRITE_BATCH,
                    scripts.DELETE,
                    scripts.COMMIT,
                    scripts.PRUNE_TAG_INDEX,
                    scripts.EXPIRE,
                    scripts.EXPIRE_KEY,
                    scripts.CLAIM_OLDEST,
                    scripts.EXTEND_KEY,
                )
            )
        )
        setattr(redis, _SCRIPTS_ATTR, found)
    return found
