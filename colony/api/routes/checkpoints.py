"""HTTP routes of context management: checkpoints, undo, restore (docs/checkpoints.md).

- `GET /v1/agents/{id}/checkpoints`: the kept checkpoints, oldest first (step, run, time, size,
  the calls of the step and the effects they declare; no bodies). Read from Redis alone.
- `POST /v1/agents/{id}/undo`: back to the checkpoint before the newest.
- `POST /v1/agents/{id}/checkpoints/{n}/restore` (body `{"mode": "reexecute"|"replay", "run_id"}`):
  back to checkpoint `n` (the newest of that step, or of `run_id`'s).

Undo and restore go through the control plane (the agent may live in a replica): 404 for an
unknown agent or checkpoint, 409 for a running agent (wait for its run to end or suspend it), for
nothing to undo, or for an agent that is stopped or failed; 422 for a bad body.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from colony.agents.state.checkpoints import CheckpointInfo, RestoreReport, list_checkpoints
from colony.api.deps import GUARDED, Context, agent_board
from colony.api.params import AgentId, Step
from colony.api.schemas import CONTROL, READ_ONE, ErrorBody
from colony.api.tenancy import within_bytes
from colony.errors import AgentNotFound
from colony.system.registry import AgentRecord
from colony.wire.ids import ID_PATTERN

router = APIRouter(dependencies=[*GUARDED, Depends(within_bytes)])  # 429 past a tenant's bytes


class CheckpointList(BaseModel):
    agent_id: str
    checkpoints: list[CheckpointInfo] = Field(description="the kept checkpoints, oldest first")


class RestoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["reexecute", "replay"] = Field(
        "reexecute",
        description="reexecute: the steps after the checkpoint call the model and run their actions "
        "again; replay: they reuse the results the action log recorded for them (no model calls)",
    )
    run_id: str | None = Field(
        None,
        max_length=128,
        pattern=ID_PATTERN,
        description="the run whose checkpoint (default: the newest of that step)",
    )


class RestoreOutcome(RestoreReport):
    record: AgentRecord | None = Field(None, description="the agent's registry record afterwards")


@router.get("/v1/agents/{agent_id}/checkpoints", response_model=CheckpointList, responses=READ_ONE)
async def get_checkpoints(agent_id: AgentId, ctx: Context) -> CheckpointList:
    """The agent's kept checkpoints (`context.checkpoints_kept`, one per step), oldest first."""
    services = await ctx.services()
    if await services.registry.get(agent_id) is None:
        raise AgentNotFound(f"no agent named {agent_id!r}; GET /v1/agents lists them")
    return CheckpointList(
        agent_id=agent_id, checkpoints=await list_checkpoints(agent_board(services, agent_id))
    )


@router.post("/v1/agents/{agent_id}/undo", response_model=RestoreOutcome, responses=CONTROL)
async def undo_agent(agent_id: AgentId, ctx: Context) -> RestoreOutcome:
    """Back to the checkpoint before the newest; the later one is discarded. Lists the effects
    of the discarded step that are not undone."""
    return RestoreOutcome.model_validate(await (await ctx.control()).undo(agent_id))


@router.post(
    "/v1/agents/{agent_id}/checkpoints/{step}/restore",
    response_model=RestoreOutcome,
    responses={
        **CONTROL,
        400: {"model": ErrorBody, "description": "a body that is not JSON (e.g. not UTF-8)"},
        422: {"model": ErrorBody, "description": "a bad body (mode, run_id)"},
    },
)
async def restore_agent(
    agent_id: AgentId, step: Step, ctx: Context, body: RestoreBody | None = None
) -> RestoreOutcome:
    """Back to checkpoint `step`; the later ones are discarded. Lists the effects of the
    discarded steps that are not undone."""
    body = body or RestoreBody()
    extra = {"run_id": body.run_id} if body.run_id else {}
    return RestoreOutcome.model_validate(
        await (await ctx.control()).restore(agent_id, step, body.mode, **extra)
    )
