"""The API's routes, one module per resource, each with its `router`.

`ROUTERS` is the order `create_app` includes them in, which is the order requests are matched in:
`GET /v1/agents/catalog` (agents) comes before `GET /v1/agents/{agent_id}`, and the OpenAPI
document lists the paths in this order.
"""

from __future__ import annotations

from fastapi import APIRouter

from colony.api.routes import (
    access,
    agent_views,
    agents,
    blocks,
    checkpoints,
    console,
    health,
    memory,
    openai_compat,
    pages,
    runs,
    sessions,
    shared_memory,
    transfer,
)

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    runs.router,
    agents.router,
    agent_views.router,
    pages.router,
    memory.router,
    shared_memory.router,
    blocks.router,
    checkpoints.router,
    transfer.router,
    sessions.router,
    access.router,
    openai_compat.router,
    console.router,
)
