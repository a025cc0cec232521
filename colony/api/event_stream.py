"""A run's events over HTTP: as server-sent events, in as few response messages as they arrive
in, or waited for until the run ends (a submit with `wait_s`).

Behind Ray Serve every ASGI message a replica sends is a streaming item relayed through the
proxy, and each item costs both processes about as much CPU as a small request does. So the
stream is sent in batches: the events that arrived together (`RunService.event_batches`) go in
one message, the response's head waits briefly for the first batch to go with it, the run's
`started` event waits briefly for what follows it, and the last batch closes the response itself
(no empty closing message after the terminal event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Send

from colony.system.runs import RunRecord, RunService, RunView, event_time
from colony.wire.run_events import ended_status, is_terminal

# The head of the response waits this long for the first events (to go out in the same message);
# past it, the head goes alone and the client learns the run id without waiting for the run to start.
HEAD_WAIT_SECONDS = 0.05
# A run's `started` event waits this long at most for the events that follow it (it goes as soon
# as one comes: a first token is never held): under load, 95% of echo runs end within 20 ms of
# starting, and one message in place of two spares both the API replica and Serve's proxy an item.
STARTED_HOLD_SECONDS = 0.02


class EventStreamResponse(StreamingResponse):
    """Server-sent events from an iterator of (text, last) batches: `last` marks the batch that
    ends the stream, which closes the response in the same message; an empty text sends the
    response's head alone (no event came within HEAD_WAIT_SECONDS)."""

    media_type = "text/event-stream"

    async def stream_response(self, send: Send) -> None:
        start: dict[str, Any] | None = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        batches: AsyncIterator[tuple[str, bool]] = self.body_iterator  # type: ignore[assignment]
        try:
            async for text, last in batches:
                if start is not None:
                    await send(start)
                    start = None
                if text or last:
                    await send({"type": "http.response.body", "body": text.encode(), "more_body": not last})
                if last:
                    return
        except Exception:
            if start is not None:  # as a stream whose head went first: the client has the run id
                await send(start)
            raise
        finally:
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                await aclose()
        if start is not None:
            await send(start)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse(event_id: str, event: dict[str, Any]) -> str:
    """One event in SSE form: `id:`, `event:` (its type) and `data:` (the event as JSON)."""
    kind = event.get("event_type", "message")
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(event)}\n\n"


def event_stream(
    runs: RunService, run_id: str, last_event_id: str | None, record: RunRecord, headers: dict[str, str]
) -> EventStreamResponse:
    """The run's events as server-sent events, ending with its terminal event: what
    GET /v1/runs/{run_id}/events and a submit with `stream: true` send."""

    async def batches() -> AsyncIterator[tuple[str, bool]]:
        found = runs.event_batches(
            run_id,
            last_event_id,
            record=record,
            first_wait=HEAD_WAIT_SECONDS,
            hold_started=STARTED_HOLD_SECONDS,
        )
        async with contextlib.aclosing(found):
            async for batch in found:
                text = "".join(sse(event_id, event) for event_id, event in batch)
                yield text, bool(batch) and is_terminal(batch[-1][1])  # the stream's last

    return EventStreamResponse(batches(), headers={"Cache-Control": "no-cache", **headers})


async def wait_for_end(runs: RunService, record: RunRecord, seconds: float) -> RunView | None:
    """The run as GET /v1/runs/{run_id} shows it once ended, read off its terminal event (which
    carries the output or error its answer holds); None if it has not ended within `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            batches = runs.event_batches(record.run_id, None, record=record)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    event = batch[-1][1]
                    if is_terminal(event):
                        data = event.get("data")
                        data = data if isinstance(data, dict) else {}
                        error = data.get("error")
                        return RunView(
                            run_id=record.run_id,
                            agent=record.agent,
                            status=ended_status(event.get("event_type")),
                            output=data.get("output"),
                            error=error if isinstance(error, str) or error is None else str(error),
                            created_at=record.created_at,
                            updated_at=max(record.created_at, event_time(event)),
                        )
    except TimeoutError:
        return None
    return None
