"""The web console: static files shipped in the package (colony/api/console), served at `/ui/`
without a token (they hold no data: every view fetches the API with the token the user typed,
kept in the tab's sessionStorage), under a Content-Security-Policy that allows only the
console's own scripts, styles and API calls (no inline script or style, no eval, no framing).

A file is served only when its name is one of the files shipped (a fixed list read at import);
nothing a request names is joined onto a path."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from colony.api.limits import error_body

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# every file of the console, by its path under /ui/ (read once: the package does not change)
FILES: dict[str, tuple[bytes, str]] = {
    str(p.relative_to(CONSOLE_DIR)): (p.read_bytes(), TYPES[p.suffix])
    for p in sorted(CONSOLE_DIR.rglob("*"))
    if p.is_file() and p.suffix in TYPES
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
router = APIRouter(include_in_schema=False)


@router.api_route("/ui", methods=["GET", "HEAD"])
async def console_root() -> RedirectResponse:
    """`/ui` -> `/ui/` (the console's files and API calls are relative to it)."""
    return RedirectResponse("ui/", status_code=308, headers=HEADERS)


@router.api_route("/ui/{name:path}", methods=["GET", "HEAD"])
async def console_file(name: str) -> Response:
    """A file of the console (`index.html` for `/ui/`)."""
    held = FILES.get(name or "index.html")
    if held is None:
        body = error_body("not_found", "no such console file; the console is at /ui/")
        return Response(body, status_code=404, media_type="application/json", headers=HEADERS)
    body, media_type = held
    return Response(body, media_type=media_type, headers=HEADERS)
