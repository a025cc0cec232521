"""HTTP routes of context management: agent export and import (docs/transfer.md).

`GET /v1/agents/{id}/export` answers the export document (colony.system.transfer); `POST
/v1/agents/{id}/import` takes one as its body and registers the agent here, suspended, to be resumed by
the resumption monitor. The API acts on Redis alone (no replica is asked): an export reads the
agent's stored state, which is complete whenever the agent is not RUNNING (409 then).

Errors (colony.api.errors): AgentNotFound 404; AgentStateConflict 409 (running; the id is live here);
ImportRejected 422 (malformed, too large, duplicate block labels, unknown fields, junk state, a
blueprint this colony cannot trust: the message names the field); a body over
`api.max_import_bytes` 413 (colony.api.limits). A refused or failed import leaves no key.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from colony.api.access import principal_of
from colony.api.deps import GUARDED, Context, settings_of
from colony.api.params import AgentId
from colony.api.schemas import ErrorBody
from colony.api.tenancy import making_agent, within_bytes
from colony.errors import ImportRejected
from colony.system.export_document import AgentExport, json_bytes
from colony.system.transfer import export_agent, import_agent
from colony.wire.ids import ID_PATTERN

Catalog = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=128,
        pattern=ID_PATTERN,
        description="the catalog agent (GET /v1/agents/catalog) whose factory builds the imported agent's "
        "blueprint here; absent: the document's catalog name, else its signed blueprint if this "
        "colony's secret verifies it",
    ),
]
Replace = Annotated[
    bool,
    Query(description="overwrite a suspended (not hosted) agent of that id, and its blocks"),
]
router = APIRouter(dependencies=[*GUARDED, Depends(within_bytes)])  # 429 past a tenant's bytes


def _errors(**described: str) -> dict[int | str, dict[str, Any]]:
    """Error responses (the API's error body) by status (`s409="..."`)."""
    return {int(k[1:]): {"model": ErrorBody, "description": v} for k, v in described.items()}


COMMON = {
    "s401": "missing or wrong bearer token",
    "s422": "a parameter or the document is invalid (malformed, too large, a blueprint not trusted here)",
    "s503": "Redis is unavailable; retry later",
}
EXPORT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the export document",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    **_errors(
        **COMMON,
        s400="the document would be over context.max_export_bytes",
        s404="no agent of that id",
        s409="the agent is running a step: wait for its run to end, or suspend it",
    ),
}
IMPORT = _errors(
    **COMMON,
    s400="the stored state of the agent of that id here is unreadable",
    s409="an agent of that id is live here (or suspended, or has blocks) and replace is not set",
    s413="the document is over api.max_import_bytes",
)


@router.get("/v1/agents/{agent_id}/export", responses=EXPORT)
async def export_agent_document(agent_id: AgentId, ctx: Context) -> Response:
    """The agent's persisted state as one JSON document (format `colony-agent-export`, version 1):
    state entries, context and checkpoint rings, action log, capability states, the blocks it
    owns and the entries of its own memory scopes. The agent must not be RUNNING (409)."""
    services = await ctx.services()
    document = await export_agent(
        services.runs.api_board,
        agent_id,
        settings=settings_of(services),
        tenant_id=services.runs.tenant_id,
        colony_id=services.runs.colony_id,
    )
    return Response(content=json_bytes(document), media_type="application/json")


# under the agent's id, not `/v1/agents/import`: GET /v1/agents/{id} would serve that path too
# (an agent named "import"), and its `Allow` would name a GET the route does not have
@router.post("/v1/agents/{agent_id}/import", status_code=201, responses=IMPORT)
async def import_agent_document(
    agent_id: AgentId,
    document: Annotated[AgentExport, Body(description="an export document (GET /v1/agents/{id}/export)")],
    ctx: Context,
    request: Request,
    catalog: Catalog = None,
    replace: Replace = False,
) -> dict[str, Any]:
    """Write the exported agent into this colony, registered SUSPENDED with an IMMEDIATE
    resumption condition: the resumption monitor resumes it on a replica, at the step it had
    reached. Its blueprint comes from this colony's catalog or a signature this colony verifies,
    never from the document's code alone (422)."""
    if document.agent_id != agent_id:
        raise ImportRejected(
            f"the document is agent {document.agent_id}'s, not {agent_id}'s: import it at "
            f"/v1/agents/{document.agent_id}/import (an agent keeps its id)"
        )
    services = await ctx.services()
    settings = settings_of(services)
    if (services.runs.tenant_id, services.runs.colony_id) != (settings.tenant_id, settings.colony_id):
        settings = settings.model_copy(
            update={"tenant_id": services.runs.tenant_id, "colony_id": services.runs.colony_id}
        )
    new = await services.registry.get(agent_id) is None  # a new agent of another tenant: its quota
    async with making_agent(ctx, principal_of(request) if new else None):
        return await import_agent(
            services.runs.api_board,
            document.model_dump(mode="json"),
            settings=settings,
            registry=services.registry,
            catalog=catalog,
            replace=replace,
        )
