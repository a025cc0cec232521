"""An agent's runs submitted over HTTP, newest first (`GET /v1/runs?agent=`, the console's agent
view). Each run record carries its agent's tag (`ApiRunProtocol.agent_tag`), written with the
record, so listing costs submits nothing; a listing reads the tag's set (at most MOST_READ
members, pruning those whose record was retired), dates them without reading values, and reads
the status of the newest `limit` as `GET /v1/runs/{id}` does."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from colony.blackboard.protocol import ApiRunProtocol
from colony.errors import RunNotFound, RunRetired
from colony.system.runs import RunService, RunStatusName

MOST_READ = 5000  # run records of one agent compared at most (the newest among them are listed)
MAX_LIMIT = 200


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
    truncated: bool = Field(description=f"over {MOST_READ} records: the newest among those read are listed")


async def runs_of(service: RunService, agent: str, limit: int) -> RunList:
    keys, total, truncated = await service.api_board.newest_tagged(
        ApiRunProtocol.agent_tag(agent), min(limit, MAX_LIMIT), MOST_READ
    )
    run_ids = [
        found[1]["run_id"] for key in keys if (found := ApiRunProtocol.identify(key)) and found[0] == "run"
    ]
    views = await asyncio.gather(*(service.get(run_id) for run_id in run_ids), return_exceptions=True)
    runs = []
    for view in views:
        if isinstance(view, RunNotFound | RunRetired):
            continue  # retired between the listing and its read
        if isinstance(view, BaseException):
            raise view
        runs.append(RunSummary.model_validate(view.model_dump(exclude={"output"})))
    return RunList(agent=agent, runs=runs, total=total, truncated=truncated)
