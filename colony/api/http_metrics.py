"""Request metrics as a pure ASGI middleware: `colony_http_requests_total` and
`colony_http_request_seconds` for every request answered, the ones the guard refuses (401, 413)
included, and a route that raised as 500.

Not Starlette's `BaseHTTPMiddleware` (`@app.middleware("http")`): that one runs the route in a
task of its own and copies a streaming response through a memory channel chunk by chunk, which
cost an event stream (a submit with `stream: true`) a few percent of the API's CPU for nothing.
Here the middleware only watches `send` for the response's start. The latency is measured, as
before, to the response's start (an event stream's headers), not to its end.
"""

from __future__ import annotations

import time

from colony import metrics
from colony.api.limits import ASGIApp, Message, Receive, Scope, Send


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        recorded = False

        def record(status: int) -> None:
            nonlocal recorded
            recorded = True
            # label values from fixed sets only: a route's template (never the raw path) and the method
            template = getattr(scope.get("route"), "path_format", None) or "unmatched"
            method = metrics.http_method_label(str(scope.get("method", "")))
            metrics.HTTP_REQUESTS.labels(template, method, str(status)).inc()
            metrics.HTTP_REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start" and not recorded:
                record(int(message["status"]))
            await send(message)

        # a cancelled request (the client went away, a timeout) answered nothing and is not
        # counted (CancelledError is no Exception), as a request that ended without a response
        # (a body cut off mid-way) is not
        try:
            await self.app(scope, receive, watched)
        except Exception:
            if not recorded:  # the server's error handler answers 500 (outside this middleware)
                record(500)
            raise
