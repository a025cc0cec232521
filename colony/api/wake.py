"""Room on demand, the API's half: a request (a session's message, a run) for an agent that was
suspended to make room resumes it first (`ControlPlane.resume`, which suspends an idle agent in
its turn when no replica has room), waiting at most WAKE_SECONDS. When the agent is not back by
then (nothing could be suspended: every agent busy or more important), the request is answered
503 with Retry-After (`AgentNotResumed`) at once, rather than stored for an agent that does not
serve it (which left a chat message without a reply and without an error for a minute).

Only a suspension for room is lifted so (the record's `waits`: `on_demand`, `resource_available`,
or unknown for a record written before it was kept). An agent suspended by request
(`POST /v1/agents/{id}/suspend`), or waiting for its children or pages, stays so: a run for it
waits in its queue as before, and a session's message is refused (409, `strict`) rather than
left without a reply.
"""

from __future__ import annotations

import asyncio
import logging

from colony.api.deps import ApiContext
from colony.api.errors import AgentNotResumed
from colony.errors import AgentStateConflict
from colony.system.registry import ON_DEMAND, AgentRecord

log = logging.getLogger(__name__)

WAKE_SECONDS = 15.0  # how long a request waits for its suspended agent to be resumed
RETRY_AFTER_SECONDS = 2.0  # what the 503 tells the client to wait before trying again
# what a record suspended for room says it waits for (None: a record written before it said so)
FOR_ROOM = frozenset({ON_DEMAND, "resource_available", None})


async def wake(ctx: ApiContext, record: AgentRecord | None, *, strict: bool = False) -> None:
    """Resume the agent of `record` if it was suspended for room; AgentNotResumed (503,
    Retry-After) when it is not back within WAKE_SECONDS. One suspended for another reason is
    left so, or (`strict`) refused with AgentStateConflict (409). A record that is not suspended
    (or None: the submit says what is unknown) costs nothing more."""
    if record is None or record.state != "suspended":
        return
    agent_id = record.agent_id
    if record.waits not in FOR_ROOM:
        if strict:
            raise AgentStateConflict(
                f"agent {agent_id!r} is suspended until {record.waits} (not for room, e.g. by "
                f"POST /v1/agents/{agent_id}/suspend); resume it (POST /v1/agents/{agent_id}/resume) "
                "and send again"
            )
        return
    services = await ctx.services()
    if services.control is None:
        raise AgentNotResumed(
            f"agent {agent_id!r} is suspended and this deployment has no control plane to resume it; "
            "resume it where it runs, then retry",
            RETRY_AFTER_SECONDS,
        )
    try:
        async with asyncio.timeout(WAKE_SECONDS):
            resumed = AgentRecord.model_validate(await services.control.resume(agent_id))
    except AgentStateConflict:
        return  # not suspended any more: another request (or the monitor) resumed it meanwhile
    except TimeoutError:
        raise AgentNotResumed(
            f"agent {agent_id!r} is suspended and was not resumed within {WAKE_SECONDS:.0f} s; "
            f"retry after {RETRY_AFTER_SECONDS:.0f} s",
            RETRY_AFTER_SECONDS,
        ) from None
    if resumed.state == "suspended":
        raise AgentNotResumed(
            f"agent {agent_id!r} is suspended and no replica has room for it now (every agent there "
            "is busy or more important); retry after the Retry-After delay, or add replicas "
            "(serve.max_agents_per_replica)",
            RETRY_AFTER_SECONDS,
        )
    log.debug("agent %s resumed for a request (replica %s)", agent_id, resumed.replica)


async def wake_agent(ctx: ApiContext, agent_id: str) -> None:
    """`wake` for an agent named by a request (one registry read)."""
    await wake(ctx, await (await ctx.services()).registry.get(agent_id))
