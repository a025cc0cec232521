"""An agent's runs submitted over HTTP, newest first (`GET /v1/runs?agent=`, the console's agent
view). Each run record carries its agent's tag (`ApiRunProtocol.agent_tag`), written with the
record, so listing costs submits nothing; a listing reads the tag's set (at most MOST_READ
members, pruning those whose record was retired), dates them without reading values, and reads
the status of the newest `limit` as `GET /v1/runs/{id}` does."""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, Field, ValidationError

from colony.blackboard.protocol import ApiRunProtocol
from colony.blackboard.query import newest_tagged
from colony.errors import RunNotFound
from colony.system.runs import RunService, RunStatusName

MOST_READ = 20_000  # run records of one agent compared at most (then: the newest among them)
MAX_LIMIT = 200
log = logging.getLogger(__name__)


class RunSummary(BaseModel):
    run_id: str
    agent: str
    status: RunStatusName
    error: str | None = None
    created_at: float
    updated_at: float


class RunList(BaseModel):
    agent: str
    runs: list[RunSummary] = Field(description="newest first")
    total: int = Field(description="run records of the agent still kept (retention: runs.retention_seconds)")
    truncated: bool = Field(
        description=f"over {MOST_READ} records: the newest among {MOST_READ} of them are listed, which "
        "may miss newer ones"
    )
    unreadable: int = Field(0, description="records left out because they do not validate")


def _run_id(key: str) -> str | None:
    found = ApiRunProtocol.identify(key)
    return found[1]["run_id"] if found is not None and found[0] == "run" else None


async def runs_of(service: RunService, agent: str, limit: int) -> RunList:
    board = service.api_board
    async with board.guard("newest_tagged"):
        keys, total, truncated = await newest_tagged(
            board,
            ApiRunProtocol.agent_tag(agent),
            min(limit, MAX_LIMIT),
            MOST_READ,
            lambda k: _run_id(k) is not None,
        )
    run_ids = [run_id for key in keys if (run_id := _run_id(key)) is not None]
    views = await asyncio.gather(*(service.get(run_id) for run_id in run_ids), return_exceptions=True)
    runs, unreadable = [], 0
    for run_id, view in zip(run_ids, views, strict=True):
        if isinstance(view, RunNotFound):  # RunRetired too: retired between the listing and its read
            continue
        if isinstance(view, ValidationError | ValueError):  # a record Redis holds that is no run's
            log.warning("run %s of agent %s is left out of its listing: %s", run_id, agent, view)
            unreadable += 1
            continue
        if isinstance(view, BaseException):
            raise view
        runs.append(RunSummary.model_validate(view.model_dump(exclude={"output"})))
    return RunList(agent=agent, runs=runs, total=total, truncated=truncated, unreadable=unreadable)
