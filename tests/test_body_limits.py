"""One body-limit table (issue 34, deliverable 5): docs/api.md, Body limits, lists every route of the
API with the setting that bounds its request body, and is the table `colony.api.limits` renders
from the app's routes (a route added, or a limit changed, without the docs fails here); the guard
enforces each row (413 past the route's own limit, not before), the import route included."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from colony.api.app import create_app
from colony.api.limits import (
    DEFAULT_LIMIT,
    IMPORT_LIMIT,
    TABLE_BEGIN,
    TABLE_END,
    body_limit,
    body_limit_table,
)
from colony.config import ApiSettings
from colony.errors import BlackboardUnavailable

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
TOKEN = "limits-token"


async def no_services() -> object:
    raise BlackboardUnavailable("services", "redis://none")  # a request past the guard answers 503


def routes_of(app: object) -> list[tuple[str, str]]:
    """Every route of the app as (methods, path), HEAD left out (it follows GET)."""
    found = []
    for route in app.routes:  # type: ignore[attr-defined]
        methods = sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"})
        if methods:
            found.append((", ".join(methods), route.path))
    return found


def limits_of(api: ApiSettings) -> dict[str, int]:
    return {DEFAULT_LIMIT: api.max_body_bytes, IMPORT_LIMIT: api.max_import_bytes}


def test_the_docs_body_limit_table_is_the_one_the_code_renders() -> None:
    api = ApiSettings()
    app = create_app(no_services, token=TOKEN, api=api)
    expected = body_limit_table(routes_of(app), limits_of(api))
    text = DOC.read_text()
    assert TABLE_BEGIN in text and TABLE_END in text, f"docs/api.md has no body-limit table:\n{expected}"
    documented = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    assert documented == expected, f"docs/api.md, Body limits, differs from the code; it is:\n{expected}"
    rows = expected.splitlines()[2:]
    assert len(rows) == len(routes_of(app)) > 20
    imports = [r for r in rows if "/import`" in r]
    assert imports == [f"| `POST /v1/agents/{{agent_id}}/import` | `{IMPORT_LIMIT}` | 16777216 (16 MiB) |"]


@pytest.mark.parametrize("declared", [10 * 1024 * 1024, None])
async def test_the_guard_enforces_each_routes_limit(declared: int | None) -> None:
    """Small limits (2 KiB, 8 KiB for the import): a 4 KiB body is refused on every route but the
    import; a 16 KiB body on every route, whether announced (Content-Length) or streamed."""
    api = ApiSettings(max_body_bytes=2048, max_import_bytes=8192)
    app = create_app(no_services, token=TOKEN, api=api, max_import_bytes=declared)
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://colony") as client:
        for methods, path in routes_of(app):
            concrete = path.replace("{agent_id}", "a1").replace("{", "").replace("}", "")
            for method in methods.split(", "):
                middle = await client.request(method, concrete, content=b" " * 4096, headers=headers)
                big = await client.request(method, concrete, content=b" " * 16384, headers=headers)
                own = limits_of(api)[body_limit(concrete)]
                assert (middle.status_code == 413) == (own < 4096), (method, path, middle.status_code)
                assert big.status_code == 413, (method, path)
                assert str(own) in big.json()["error"]["message"]


def test_the_import_limit_never_exceeds_the_export_limit() -> None:
    api = ApiSettings(max_body_bytes=2048, max_import_bytes=8192)
    app = create_app(no_services, token=TOKEN, api=api, max_import_bytes=4096)  # context.max_export_bytes
    guard = app.build_middleware_stack()
    while guard is not None and type(guard).__name__ != "GuardMiddleware":
        guard = getattr(guard, "app", None)
    assert guard is not None and guard.import_body_bytes == 4096  # type: ignore[attr-defined]
