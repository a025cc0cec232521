"""A time limit on every call to the Chroma server.

chromadb's HTTP client waits without limit (`httpx.Client(timeout=None)`), so a server that takes
a connection and never answers (stopped, wedged, a partition that drops packets) held recall of
a whole process: the client's construction under MemoryService's lock, then every query in a
worker thread (found by review). A client is made only after the server answered its heartbeat
within the limit, and its session is then bounded by CHROMA_CALL_SECONDS; a call
past the limit raises, and recall ranks by keywords meanwhile and tries the server again later
(colony.memory.service). (chromadb accepts no client class of ours: the pinned client's session
is given the limit, and a test holds it to that.)"""

from __future__ import annotations

import logging
from typing import Any

import httpx

log = logging.getLogger(__name__)
CHROMA_CALL_SECONDS = 15.0  # one call to the Chroma server at most (its searches take milliseconds)


def bounded(client: Any) -> Any:
    """`client` (chromadb's HttpClient) with every later call bounded by CHROMA_CALL_SECONDS: its
    own session keeps its headers (auth, content type) and gets the limit."""
    session = getattr(getattr(client, "_server", None), "_session", None)
    if not isinstance(session, httpx.Client):
        log.warning("chromadb's client has no session to bound; calls to Chroma wait without a limit")
        return client
    session.timeout = httpx.Timeout(CHROMA_CALL_SECONDS)
    return client
