"""Memory blocks over HTTP: an agent's blocks (`/v1/agents/{id}/blocks*`), sharing
(`/v1/blocks/share`) and colony-wide blocks (`/v1/colony/blocks*`).

Under `/v1/agents/{id}/...` the API acts *as agent {id}*: the token holder (the operator) speaks
for that agent and gets exactly that agent's access, no more (its own blocks, blocks shared with it
at their access level, colony blocks at theirs). So an operator tool cannot be used to read a block
the agent could not read, and an edit made here is recorded in the block's history with the agent
as its author and `via: http`. Sharing and colony blocks are operator acts (the principal
OPERATOR); colony blocks are owned by `COLONY`.

Every path goes through the BlockStore (colony.memory.blocks), which enforces access and bounds
and builds every Redis key: labels reach it only through the path pattern and its check_label,
agent ids through ID_PATTERN and its check_agent. A block is created for, and shared with, only an
agent the colony knows (its registry record or its state in Redis) or has reserved: 404 naming the
agent otherwise, unless the request asks to pre-provision it (`?provision=true`) for an id that can
name an agent, which then starts with it (colony.memory.blocks.agents).

Errors (colony.api.errors): BlockNotFound 404, BlockAccessDenied 403, BlockExists 409,
BlockVersionConflict 409 `version_conflict` with `current_version` (only when `base_version` was
sent: concurrent edits without it merge), BlockEditRejected and any other refused argument 422.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from colony.api.access import check_agent, principal_of
from colony.api.deps import GUARDED, ApiContext, Context, settings_of
from colony.api.idempotency import effect_key
from colony.api.params import AgentId, Label, Version
from colony.api.schemas import (
    BLOCK_CREATE,
    BLOCK_EDIT,
    BLOCK_READ,
    BLOCK_SHARE,
    BlockAppend,
    BlockCreate,
    BlockListItem,
    BlockPatch,
    BlockPut,
    BlockRollback,
    BlockShareBody,
    BlockUndo,
    BlockUnshareBody,
    ColonyBlockCreate,
    Unshared,
)
from colony.api.tenancy import within_bytes
from colony.errors import BlockAccessDenied, BlockExists, BlockNotFound, InvalidArgument
from colony.memory.blocks import (
    COLONY,
    OPERATOR,
    BlockHistory,
    BlockInfo,
    BlockStore,
    BlockView,
    EditOutcome,
    NewBlock,
    Share,
    SharedAccess,
    templates,
)
from colony.wire.ids import ID_PATTERN
from colony.wire.input_check import check_input
from colony.wire.tenants import tenant_of

Owner = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=128,
        pattern=ID_PATTERN,
        description="the block's owner (another agent's block shared with this one); absent: the "
        "agent's view (own, then shared, then colony)",
    ),
]
AtVersion = Annotated[
    int | None, Query(ge=1, le=2**31, description="a historical version (read-only view, head false)")
]
Limit = Annotated[int, Query(ge=1, le=10_000, description="the newest this many versions")]
Provision = Annotated[
    bool,
    Query(
        description="pre-provision: allowed for an agent id the colony does not know yet (that agent "
        "starts with it; importing that id then needs replace=true); without it, an unknown agent is "
        "a 404"
    ),
]
VIA = "http"
router = APIRouter(dependencies=[*GUARDED, Depends(within_bytes)])  # 429 past a tenant's bytes


def _new_block(body: BlockCreate, max_depth: int) -> NewBlock:
    """The store's NewBlock; with `template`, made by colony.memory.blocks.templates (the packaged
    templates): the template's defaults, overridden by the fields the body sets, and the content
    rendered from `fields` (validated against the template's schema, 422 naming the field)."""
    extra = {"access", "fields", "template_schema"}
    if body.template is None:
        if body.fields is not None or body.template_schema is not None:
            raise InvalidArgument(
                "fields and template_schema go with a template: name one (persona, human, ...)"
            )
        return NewBlock(**body.model_dump(exclude=extra))
    try:
        check_input([body.fields, body.template_schema], max_depth, "template")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    overrides = {
        name: getattr(body, name)
        for name in body.model_fields_set & set(templates.OVERRIDABLE)
        if getattr(body, name) is not None
    }
    return templates.apply_template(
        body.template, body.fields, body.label, schema=body.template_schema, **overrides
    )


async def _item(store: BlockStore, principal: str, info: BlockInfo, access: SharedAccess) -> BlockListItem:
    try:
        view = await store.read(principal, info.label, owner=info.owner)
        chars = view.chars
    except BlockNotFound:  # deleted between the listing and the read
        chars = 0
    return BlockListItem(
        label=info.label,
        owner=info.owner,
        block_type=info.block_type.value,
        description=info.description,
        chars=chars,
        char_limit=info.char_limit,
        access=access.value,
        read_only=info.read_only,
        swapped_out=info.swapped_out,
        colony=info.is_colony,
        updated_at=info.updated_at,
    )


def _options(owner: str | None, body: BaseModel | None, request: Request) -> dict[str, Any]:
    """The store's edit options from a request: whose block, the channel, the note, the base, and
    the request's Idempotency-Key (as `effect_key`): the edit's id derives from it, so a retry of
    a keyed edit whose first try answered 5xx after the edit landed finds it made (its outcome
    again), never edits twice."""
    return {
        "owner": owner,
        "via": VIA,
        "message": getattr(body, "message", None) or "",
        "base_version": getattr(body, "base_version", None),
        "idempotency_key": effect_key(request),
    }


async def _update_info(
    store: BlockStore, principal: str, label: str, owner: str | None, body: BlockPatch
) -> BlockInfo:
    return await store.update_info(principal, label, owner=owner, **body.model_dump(exclude_none=True))


async def agent_store(ctx: ApiContext, agent_id: str) -> BlockStore:
    """The block store holding `agent_id`'s blocks: its tenant's (colony.wire.tenants)."""
    home = settings_of(await ctx.services()).tenant_id
    return await ctx.blocks(tenant_of(agent_id, home))


async def tenant_store(ctx: ApiContext, request: Request) -> BlockStore:
    """The block store of the request's tenant (its colony blocks, the blocks it shares)."""
    principal = principal_of(request)
    return await ctx.blocks(principal.tenant if principal is not None else None)


# -- an agent's blocks ----------------------------------------------------------------------


@router.get(
    "/v1/agents/{agent_id}/blocks",
    response_model=list[BlockListItem],
    responses=BLOCK_READ,
)
async def list_blocks(agent_id: AgentId, ctx: Context) -> list[BlockListItem]:
    """Every block the agent sees: its own, then those shared with it, then colony blocks, with
    its access to each and the characters used of the limit."""
    store = await agent_store(ctx, agent_id)
    return [await _item(store, agent_id, info, access) for info, access in await store.list_for(agent_id)]


@router.post(
    "/v1/agents/{agent_id}/blocks",
    status_code=201,
    response_model=BlockInfo,
    responses=BLOCK_CREATE,
)
async def create_block(
    agent_id: AgentId, body: BlockCreate, ctx: Context, provision: Provision = False
) -> BlockInfo:
    """Create a block owned by the agent; 404 when the colony does not know the agent (unless
    `provision`); 409 when its view already has that label (its own, a shared one or a colony
    block: the new one would hide it)."""
    store = await agent_store(ctx, agent_id)
    new = _new_block(body, ctx.api.max_input_depth)
    await store.check_known(agent_id, provision=provision, what="blocks are made")
    if await store.info_of(store.block_id(COLONY, new.label)) is not None:
        raise BlockExists(f"{agent_id} already sees the colony block {new.label!r}; pick another label")
    return await store.create(agent_id, new, created_by=agent_id)


@router.get(
    "/v1/agents/{agent_id}/blocks/{label}",
    response_model=BlockView,
    responses=BLOCK_READ,
)
async def read_block(
    agent_id: AgentId, label: Label, ctx: Context, owner: Owner = None, version: AtVersion = None
) -> BlockView:
    """The block as the agent sees it (its access included); with `version`, that version's
    content (`head` false: a view, nothing changes)."""
    return await (await agent_store(ctx, agent_id)).read(agent_id, label, owner=owner, version=version)


@router.put(
    "/v1/agents/{agent_id}/blocks/{label}",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def put_block(
    agent_id: AgentId, label: Label, body: BlockPut, ctx: Context, request: Request, owner: Owner = None
) -> EditOutcome:
    """Rewrite the content as the agent (read-only: 403; append-only: 403 unless the new content
    only adds text). Without `base_version` a concurrent edit merges; with it, 409 when the
    block moved on."""
    return await (await agent_store(ctx, agent_id)).set_content(
        agent_id, label, body.content, op="put", **_options(owner, body, request)
    )


@router.patch(
    "/v1/agents/{agent_id}/blocks/{label}",
    response_model=BlockInfo,
    responses=BLOCK_SHARE,
)
async def patch_block(agent_id: AgentId, label: Label, body: BlockPatch, ctx: Context) -> BlockInfo:
    """Change the description, char limit or swapped-out state (the owner only: 403 otherwise)."""
    return await _update_info(await agent_store(ctx, agent_id), agent_id, label, None, body)


@router.delete(
    "/v1/agents/{agent_id}/blocks/{label}",
    status_code=204,
    response_class=Response,
    responses=BLOCK_READ,
)
async def delete_block(agent_id: AgentId, label: Label, ctx: Context) -> Response:
    """Delete one of the agent's own blocks with its history and shares (another owner's
    block it sees: 403)."""
    store = await agent_store(ctx, agent_id)
    info, _ = await store.resolve(agent_id, label)
    if info.owner != agent_id:
        raise BlockAccessDenied(f"{agent_id} does not own block {label!r} (its owner is {info.owner})")
    await store.delete(agent_id, agent_id, label)
    return Response(status_code=204)


@router.post(
    "/v1/agents/{agent_id}/blocks/{label}/append",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def append_block(
    agent_id: AgentId, label: Label, body: BlockAppend, ctx: Context, request: Request, owner: Owner = None
) -> EditOutcome:
    """Add text at the end (read-only: 403). Appends without `base_version` never conflict."""
    return await (await agent_store(ctx, agent_id)).append(
        agent_id, label, body.text, **_options(owner, body, request)
    )


@router.get(
    "/v1/agents/{agent_id}/blocks/{label}/history",
    response_model=BlockHistory,
    responses=BLOCK_READ,
)
async def block_history(
    agent_id: AgentId, label: Label, ctx: Context, owner: Owner = None, limit: Limit = 100
) -> BlockHistory:
    """The block's versions, oldest first (each with author, via, op and message)."""
    return await (await agent_store(ctx, agent_id)).history(agent_id, label, owner=owner, limit=limit)


@router.get(
    "/v1/agents/{agent_id}/blocks/{label}/versions/{version}",
    response_model=BlockView,
    responses=BLOCK_READ,
)
async def block_version(
    agent_id: AgentId, label: Label, version: Version, ctx: Context, owner: Owner = None
) -> BlockView:
    """The block at `version` (404 when that version is not viewable: past the head, or folded
    into a shallow snapshot)."""
    return await (await agent_store(ctx, agent_id)).read(agent_id, label, owner=owner, version=version)


@router.post(
    "/v1/agents/{agent_id}/blocks/{label}/rollback",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def rollback_block(
    agent_id: AgentId, label: Label, body: BlockRollback, ctx: Context, request: Request, owner: Owner = None
) -> EditOutcome:
    """A new version holding `version`'s content (history kept; needs read-write access)."""
    options = _options(owner, body, request)
    return await (await agent_store(ctx, agent_id)).rollback(agent_id, label, body.version, **options)


@router.post(
    "/v1/agents/{agent_id}/blocks/{label}/undo",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def undo_block(
    agent_id: AgentId,
    label: Label,
    ctx: Context,
    request: Request,
    body: BlockUndo | None = None,
    owner: Owner = None,
) -> EditOutcome:
    """Undo the agent's own latest edit of the block, keeping every other agent's edits (422
    when it has none left to undo)."""
    return await (await agent_store(ctx, agent_id)).undo(agent_id, label, **_options(owner, None, request))


@router.get(
    "/v1/agents/{agent_id}/blocks/{label}/shares",
    response_model=list[Share],
    responses=BLOCK_READ,
)
async def block_shares(agent_id: AgentId, label: Label, ctx: Context) -> list[Share]:
    """The grants of one of the agent's own blocks."""
    store = await agent_store(ctx, agent_id)
    info, _ = await store.resolve(agent_id, label, owner=agent_id)
    grants = await store.shares_of(agent_id, label)
    return [
        Share(block_id=info.block_id, owner=agent_id, label=label, agent_id=agent, access=access)
        for agent, access in sorted(grants.items())
    ]


# -- sharing (the operator) ---------------------------------------------------------------------


@router.post("/v1/blocks/share", response_model=Share, responses=BLOCK_SHARE)
async def share_block(
    body: BlockShareBody, ctx: Context, request: Request, provision: Provision = False
) -> Share:
    """Give `agent_id` `access` to `owner`'s block (again: the access is changed). 404 when the
    colony does not know `agent_id` (unless `provision`); 409 when that agent already sees
    another block with the label."""
    _check_both(request, body.owner, body.agent_id)  # within the caller's tenant only (404 else)
    store = await tenant_store(ctx, request)
    await store.check_known(body.agent_id, provision=provision, what="blocks are shared")
    return await store.share(OPERATOR, body.owner, body.label, body.agent_id, SharedAccess(body.access))


@router.delete("/v1/blocks/share", response_model=Unshared, responses=BLOCK_SHARE)
async def unshare_block(body: BlockUnshareBody, ctx: Context, request: Request) -> Unshared:
    """Take `agent_id`'s access to `owner`'s block away (`removed` false: it had none)."""
    _check_both(request, body.owner, body.agent_id)
    store = await tenant_store(ctx, request)
    removed = await store.unshare(OPERATOR, body.owner, body.label, body.agent_id)
    return Unshared(removed=removed)


def _check_both(request: Request, owner: str, agent_id: str) -> None:
    """AgentNotFound (404) unless the request's token sees both agents of a share (the owner may be
    its tenant's colony blocks)."""
    if owner != COLONY:
        check_agent(request, owner)
    check_agent(request, agent_id)


# -- colony-wide blocks (the operator) --------------------------------------------------------


@router.get("/v1/colony/blocks", response_model=list[BlockListItem], responses=BLOCK_READ)
async def list_colony_blocks(ctx: Context, request: Request) -> list[BlockListItem]:
    """Every colony block, with the access every agent has to it."""
    store = await tenant_store(ctx, request)
    found = []
    for info in await store.list_owned(COLONY):
        access = info.colony_access or SharedAccess.READ_ONLY
        if info.read_only or info.block_type.value == "log":
            access = SharedAccess.READ_ONLY
        found.append(await _item(store, OPERATOR, info, access))
    return found


@router.post(
    "/v1/colony/blocks",
    status_code=201,
    response_model=BlockInfo,
    responses=BLOCK_CREATE,
)
async def create_colony_block(body: ColonyBlockCreate, ctx: Context, request: Request) -> BlockInfo:
    """A block every agent, present and future, sees with `access` (its own block of the same
    label hides it from that agent)."""
    return await (await tenant_store(ctx, request)).create_colony_block(
        _new_block(body, ctx.api.max_input_depth), SharedAccess(body.access)
    )


@router.get("/v1/colony/blocks/{label}", response_model=BlockView, responses=BLOCK_READ)
async def read_colony_block(
    label: Label, ctx: Context, request: Request, version: AtVersion = None
) -> BlockView:
    return await (await tenant_store(ctx, request)).read(OPERATOR, label, owner=COLONY, version=version)


@router.put("/v1/colony/blocks/{label}", response_model=EditOutcome, responses=BLOCK_EDIT)
async def put_colony_block(label: Label, body: BlockPut, ctx: Context, request: Request) -> EditOutcome:
    return await (await tenant_store(ctx, request)).set_content(
        OPERATOR, label, body.content, op="put", **_options(COLONY, body, request)
    )


@router.patch("/v1/colony/blocks/{label}", response_model=BlockInfo, responses=BLOCK_SHARE)
async def patch_colony_block(label: Label, body: BlockPatch, ctx: Context, request: Request) -> BlockInfo:
    return await _update_info(await tenant_store(ctx, request), OPERATOR, label, COLONY, body)


@router.delete(
    "/v1/colony/blocks/{label}",
    status_code=204,
    response_class=Response,
    responses=BLOCK_READ,
)
async def delete_colony_block(label: Label, ctx: Context, request: Request) -> Response:
    store = await tenant_store(ctx, request)
    await store.resolve(OPERATOR, label, owner=COLONY)  # 404 when there is none
    await store.delete(OPERATOR, COLONY, label)
    return Response(status_code=204)


@router.post(
    "/v1/colony/blocks/{label}/append",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def append_colony_block(label: Label, body: BlockAppend, ctx: Context, request: Request) -> EditOutcome:
    return await (await tenant_store(ctx, request)).append(
        OPERATOR, label, body.text, **_options(COLONY, body, request)
    )


@router.get(
    "/v1/colony/blocks/{label}/history",
    response_model=BlockHistory,
    responses=BLOCK_READ,
)
async def colony_block_history(
    label: Label, ctx: Context, request: Request, limit: Limit = 100
) -> BlockHistory:
    return await (await tenant_store(ctx, request)).history(OPERATOR, label, owner=COLONY, limit=limit)


@router.post(
    "/v1/colony/blocks/{label}/rollback",
    response_model=EditOutcome,
    responses=BLOCK_EDIT,
)
async def rollback_colony_block(
    label: Label, body: BlockRollback, ctx: Context, request: Request
) -> EditOutcome:
    options = _options(COLONY, body, request)
    return await (await tenant_store(ctx, request)).rollback(OPERATOR, label, body.version, **options)
