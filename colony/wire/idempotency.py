"""The `Idempotency-Key` header as client and server both read it: its name, what a key may be, and
a fresh one. The server's side (what a key does) is colony.api.idempotency; the client's
(send one per write, retry with it) is colony.client_http."""

from __future__ import annotations

import re
import uuid

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on an answer replayed from the first request's
MAX_KEY_CHARS = 128
KEY_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:+/=-]{{0,{MAX_KEY_CHARS - 1}}}")
KEY_RULE = (
    f"1-{MAX_KEY_CHARS} characters of A-Z a-z 0-9 . _ : + / = -, starting with a letter or a digit "
    "(a UUID is one)"
)
# the methods that change state: a key is honoured on these (on GET and HEAD it is ignored)
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# POST routes that change nothing (a read with a body): the server ignores a key sent to them (no
# answer is kept), the client sends none and retries them as reads. Paths as the app routes them.
READ_ONLY_POSTS = (re.compile(r"/v1/agents/[^/]+/memory/query"),)
# Routes that derive what they create from the key (colony.api.idempotency.effect_key): running
# one of them again finds its effect made, so the claim of one whose process stopped is taken over
# by its retry (run again) instead of answered "outcome unknown". (method, path as the app routes it)
_BLOCK = r"/v1/(?:agents/[^/]+|colony)/blocks/[^/]+"
EFFECT_KEYED = (
    ("POST", re.compile(r"/v1/runs")),
    ("POST", re.compile(r"/v1/sessions")),
    ("POST", re.compile(r"/v1/sessions/[^/]+/messages")),
    ("POST", re.compile(r"/v1/sessions/[^/]+/turns")),
    ("POST", re.compile(r"/v1/agents/[^/]+/memory")),
    ("PUT", re.compile(_BLOCK)),
    ("POST", re.compile(_BLOCK + r"/(?:append|rollback|undo)")),
)
# the `error.code` of the answers the key itself gives (not the route's)
IN_FLIGHT = "idempotency_in_flight"  # 409 + Retry-After: the first request is still running
KEY_REUSED = "idempotency_key_reused"  # 422: the key was sent with another request
OUTCOME_UNKNOWN = "idempotency_outcome_unknown"  # 409: the first request stopped without an answer


def new_key() -> str:
    """A key for one logical request (every retry of it sends the same)."""
    return str(uuid.uuid4())


def takes_key(method: str, path: str) -> bool:
    """Whether a request to `path` with `method` is a write a key is honoured on (and so sent with
    one and retried as a write): a state-changing method, not one of READ_ONLY_POSTS."""
    if method.upper() not in STATE_CHANGING:
        return False
    route = path.partition("?")[0]
    return not (method.upper() == "POST" and any(p.fullmatch(route) for p in READ_ONLY_POSTS))


def key_problem(value: str) -> str | None:
    """Why `value` is not a key (a message naming the header), or None."""
    if KEY_PATTERN.fullmatch(value):
        return None
    shown = value[:40] + ("..." if len(value) > 40 else "")
    return f"{HEADER}: {shown!r} ({len(value)} characters) is not a key: {KEY_RULE}"


def effect_keyed(method: str, path: str) -> bool:
    """Whether the route derives its effects from the key (EFFECT_KEYED): safe to run again."""
    route, verb = path.partition("?")[0], method.upper()
    return any(verb == m and p.fullmatch(route) for m, p in EFFECT_KEYED)
