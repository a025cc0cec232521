"""The web console's files (issue 38): served at /ui/ without a token, only the files shipped,
only to reads, each under a Content-Security-Policy without unsafe-inline/unsafe-eval; the
scripts never parse data as HTML. The browser tests are in tests/test_console_browser.py."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from colony.api.app import create_app
from colony.api.deps import ApiServices
from colony.api.routes.console import CONSOLE_DIR, CSP, FILES


def client() -> TestClient:
    # the console's routes touch no service: an empty one stands in
    return TestClient(create_app(ApiServices.__new__(ApiServices), token="secret-token"))


def test_the_console_is_served_without_a_token_under_its_policy() -> None:
    http = client()
    moved = http.get("/ui", follow_redirects=False)
    assert moved.status_code == 308 and moved.headers["location"] == "ui/"
    page = http.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="./app.js">' in page.text
    for name in ("app.js", "api.js", "dom.js", "console.css", "views/run.js"):
        served = http.get(f"/ui/{name}")
        assert served.status_code == 200 and served.content == (CONSOLE_DIR / name).read_bytes()
        assert served.headers["content-security-policy"] == CSP
        assert served.headers["x-content-type-options"] == "nosniff"
    assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP and "script-src 'self'" in CSP
    assert "frame-ancestors 'none'" in CSP and "default-src 'none'" in CSP


def test_only_shipped_files_and_only_reads_are_open() -> None:
    http = client()
    for path in ("/ui/nothing.js", "/ui/views/../app.js.map", "/ui/%2e%2e/pyproject.toml", "/ui/.hidden"):
        assert http.get(path).status_code in (401, 404), path
    assert http.get("/ui/../pyproject.toml").status_code == 401  # normalised to /pyproject.toml
    assert http.post("/ui/").status_code == 401 and http.put("/ui/app.js").status_code == 401
    head = http.head("/ui/app.js")
    assert head.status_code == 200 and head.headers["content-security-policy"] == CSP
    assert http.get("/v1/agents").status_code == 401  # the API still needs the token
    assert set(FILES) >= {"index.html", "app.js", "api.js", "dom.js", "console.css"}


def test_scripts_put_data_in_as_text_only() -> None:
    """No HTML parsing of anything: no innerHTML/outerHTML/insertAdjacentHTML/document.write, no
    eval or Function, no inline handlers or styles in the page."""
    forbidden = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function")
    for name, (body, _) in FILES.items():
        text = body.decode()
        assert not forbidden.search(text), name
        if name.endswith(".html"):
            assert not re.search(r"\son[a-z]+=|style=|<script>", text), name


async def test_a_path_under_ui_never_reaches_an_api_route_without_the_token() -> None:
    """The guard opens reads under /ui/ without a token; a path that climbs out (not normalised
    by a proxy in front) must still land on the console's file route, never on an API route."""
    app = create_app(ApiServices.__new__(ApiServices), token="secret-token")

    async def status(path: str) -> int:
        sent: list[dict] = []
        scope = {
            "type": "http",
            "method": "GET",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "headers": [],
            "query_string": b"",
            "scheme": "http",
            "server": ("x", 80),
            "client": ("y", 1),
            "http_version": "1.1",
            "asgi": {"version": "3.0"},
        }

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return int(sent[0]["status"])

    for path in ("/ui/../v1/agents", "/ui/..%2fv1/agents", "/ui//v1/agents", "/ui/%2e%2e/v1/replicas"):
        assert await status(path) == 404, path
    assert await status("/v1/agents") == 401
