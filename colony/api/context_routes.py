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

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from colony.agents.state.checkpoints import CheckpointInfo, RestoreReport, list_checkpoints
from colony.api.schemas import CONTROL, READ_ONE
from colony.config import ApiSettings
from colony.errors import AgentNotFound
from colony.system.registry import AgentRecord
from colony.wire.ids import ID_PATTERN

if TYPE_CHECKING:
    from colony.api.app import AgentControl, ApiServices

AgentId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="agent id")]
Step = Annotated[
    int, Path(ge=0, le=10_000_000, description="the step of a kept checkpoint (0: a run's beginning)")
]


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


def add_context_routes(
    router: FastAPI | APIRouter,
    services: Callable[[], Awaitable[ApiServices]],
    authorized: Any,
    api: ApiSettings,
) -> None:
    """Declare the routes on `router` (the app itself). Auth and the body limit: colony.api.limits."""
    guarded = [Depends(authorized)]

    async def control() -> AgentControl:
        svc = await services()
        if svc.control is None:
            raise StarletteHTTPException(404, "this deployment has no control plane")
        return svc.control

    @router.get(
        "/v1/agents/{agent_id}/checkpoints",
        response_model=CheckpointList,
        dependencies=guarded,
        responses=READ_ONE,
    )
    async def get_checkpoints(agent_id: AgentId) -> CheckpointList:
        """The agent's kept checkpoints (`context.checkpoints_kept`, one per step), oldest first."""
        svc = await services()
        if await svc.registry.get(agent_id) is None:
            raise AgentNotFound(f"no agent named {agent_id!r}; GET /v1/agents lists them")
        board = svc.runs.api_board.scoped(svc.runs.agent_scope(agent_id))
        return CheckpointList(agent_id=agent_id, checkpoints=await list_checkpoints(board))

    @router.post(
        "/v1/agents/{agent_id}/undo",
        response_model=RestoreOutcome,
        dependencies=guarded,
        responses=CONTROL,
    )
    async def undo_agent(agent_id: AgentId) -> RestoreOutcome:
        """Back to the checkpoint before the newest; the later one is discarded. Lists the effects
        of the discarded step that are not undone."""
        return RestoreOutcome.model_validate(await (await control()).undo(agent_id))

    @router.post(
        "/v1/agents/{agent_id}/checkpoints/{step}/restore",
        response_model=RestoreOutcome,
        dependencies=guarded,
        responses={**CONTROL, 422: {"description": "a bad body (mode, run_id)"}},
    )
    async def restore_agent(agent_id: AgentId, step: Step, body: RestoreBody | None = None) -> RestoreOutcome:
        """Back to checkpoint `step`; the later ones are discarded. Lists the effects of the
        discarded steps that are not undone."""
        body = body or RestoreBody()
        extra = {"run_id": body.run_id} if body.run_id else {}
        return RestoreOutcome.model_validate(
            await (await control()).restore(agent_id, step, body.mode, **extra)
        )
