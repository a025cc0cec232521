"""Who may call what: the verb each route needs, the agents a scoped token may act on, and the
audit of every state-changing call. Applied by the guard (colony.api.limits.GuardMiddleware)
before a route reads the body; routes whose agent is named in the body or found through another
id (a run's) check the principal the guard left in the request's state (`principal_of`).

Verbs (colony.system.access_tokens): every GET needs `read` unless listed below; every other
method needs the verb listed for its route (a route missing from the table needs `admin`: a new
route is never open to a narrower token by mistake; tests/test_access_tokens.py checks that every
route of the app is listed). A token restricted to agents reaches the routes of those agents only
(any other agent id, or session id, in the path: 404, as for an agent that does not exist) and no
state-changing route that is not about one agent (colony blocks, shared memory, mapping a folder,
starting a session, tokens): 403.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.routing import BaseRoute, Match

from colony.errors import AgentNotFound
from colony.system.access_tokens import Principal, TokenStore
from colony.system.audit import AuditTrail
from colony.system.registry import AgentRecord

log = logging.getLogger(__name__)

READ_METHODS = frozenset({"GET", "HEAD"})
AGENT_PARAMS = ("agent_id", "session_id")  # path parameters that name an agent (a session is one)

# the verb of every route that is not a plain read (GET: `read`), by (method, route template)
ROUTE_VERBS: dict[tuple[str, str], str] = {
    ("POST", "/v1/runs"): "run",
    ("POST", "/v1/runs/{run_id}/cancel"): "run",
    ("POST", "/v1/agents/{agent_id}/suspend"): "run",
    ("POST", "/v1/agents/{agent_id}/resume"): "run",
    ("POST", "/v1/vcm/sources"): "run",
    ("POST", "/v1/sessions"): "run",
    ("POST", "/v1/sessions/{session_id}/messages"): "run",
    ("POST", "/v1/sessions/{session_id}/turns"): "run",
    ("POST", "/v1/sessions/{session_id}/revert"): "run",
    ("POST", "/v1/sessions/{session_id}/fork"): "run",
    ("POST", "/v1/sessions/{session_id}/switch"): "run",
    ("DELETE", "/v1/sessions/{session_id}"): "run",
    ("POST", "/v1/agents/{agent_id}/memory/query"): "read",
    ("POST", "/v1/memory/shared/{name}/query"): "read",
    ("POST", "/v1/agents/{agent_id}/memory"): "write",
    ("POST", "/v1/agents/{agent_id}/memory/reindex"): "write",
    ("PUT", "/v1/memory/shared/{name}"): "write",
    ("POST", "/v1/memory/shared/{name}/entries"): "write",
    ("POST", "/v1/agents/{agent_id}/blocks"): "write",
    ("PUT", "/v1/agents/{agent_id}/blocks/{label}"): "write",
    ("PATCH", "/v1/agents/{agent_id}/blocks/{label}"): "write",
    ("DELETE", "/v1/agents/{agent_id}/blocks/{label}"): "write",
    ("POST", "/v1/agents/{agent_id}/blocks/{label}/append"): "write",
    ("POST", "/v1/agents/{agent_id}/blocks/{label}/rollback"): "write",
    ("POST", "/v1/agents/{agent_id}/blocks/{label}/undo"): "write",
    ("POST", "/v1/colony/blocks"): "write",
    ("PUT", "/v1/colony/blocks/{label}"): "write",
    ("PATCH", "/v1/colony/blocks/{label}"): "write",
    ("DELETE", "/v1/colony/blocks/{label}"): "write",
    ("POST", "/v1/colony/blocks/{label}/append"): "write",
    ("POST", "/v1/colony/blocks/{label}/rollback"): "write",
    ("POST", "/v1/blocks/share"): "admin",
    ("DELETE", "/v1/blocks/share"): "admin",
    ("POST", "/v1/agents/{agent_id}/undo"): "admin",
    ("POST", "/v1/agents/{agent_id}/checkpoints/{step}/restore"): "admin",
    ("GET", "/v1/agents/{agent_id}/export"): "admin",
    ("POST", "/v1/agents/{agent_id}/import"): "admin",
    ("GET", "/v1/tokens"): "admin",
    ("POST", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    ("GET", "/v1/audit"): "admin",
    ("GET", "/v1/token"): "any",  # what the token may do: every token may ask
    ("POST", "/openai/v1/chat/completions"): "run",
    # the MCP server: each tool is a call of this API with the same token, which checks its verb
    ("POST", "/mcp"): "read",
    ("DELETE", "/mcp"): "read",
}
# routes a token restricted to agents may call although no agent is in their path: those whose
# route checks the agent itself (the body's, a run's), and reading who it is
AGENT_CHECKED_IN_ROUTE = frozenset(
    {
        ("POST", "/v1/runs"),
        ("POST", "/v1/runs/{run_id}/cancel"),
        ("POST", "/openai/v1/chat/completions"),
        ("POST", "/mcp"),
    }
)


def verb_of(method: str, template: str) -> str:
    """The verb a call needs: the table's, else `read` for a GET, else `admin`."""
    method = "GET" if method == "HEAD" else method
    held = ROUTE_VERBS.get((method, template))
    if held is not None:
        return held
    return "read" if method in READ_METHODS else "admin"


@dataclass(frozen=True)
class Matched:
    template: str
    params: dict[str, str]


def match_route(routes: Iterable[BaseRoute], scope: MutableMapping[str, Any]) -> Matched | None:
    """The route the router will pick for this request (its template and path parameters), matched
    as the router matches (a route that matches the path but not the method is no match)."""
    for route in routes:
        found, child = route.matches(scope)
        if found is Match.FULL:
            params = {k: str(v) for k, v in (child.get("path_params") or {}).items()}
            return Matched(str(getattr(route, "path", "")), params)
    return None


def refusal(principal: Principal, method: str, matched: Matched | None) -> tuple[int, str, str] | None:
    """Why `principal` may not make this call: (status, code, message); None when it may."""
    if matched is None:
        return None  # the router answers (404, 405)
    verb = verb_of(method, matched.template)
    if verb != "any" and not principal.may(verb):
        return (
            403,
            "forbidden",
            f"this token may not {verb} (it may: {', '.join(sorted(principal.verbs))}); "
            f"{method} {matched.template} needs a token with {verb!r}",
        )
    named = [matched.params[p] for p in AGENT_PARAMS if p in matched.params]
    if any(not principal.sees(agent) for agent in named):  # another tenant's, or not given it
        return 404, "not_found", "no such agent"  # as for an agent that does not exist
    if principal.agents is None:
        return None
    if not named and verb == "admin":  # tokens, the audit: about every agent
        return (
            403,
            "forbidden",
            f"this token may act only on its agents; {method} {matched.template} is about all",
        )
    if not named and method not in READ_METHODS and (method, matched.template) not in AGENT_CHECKED_IN_ROUTE:
        return (
            403,
            "forbidden",
            f"this token may act only on its agents ({len(principal.agents)}); {method} "
            f"{matched.template} is not about one agent",
        )
    return None


def request_tenant(request: Request, home: str) -> str:
    """The tenant a request acts for: its token's, or `home` (the colony's own: the deployment's
    token, or an app built without the guard)."""
    principal = principal_of(request)
    return (principal.tenant if principal is not None else "") or home


def principal_of(request: Request) -> Principal | None:
    """The principal the guard found for this request (None: an app built without the guard)."""
    state = request.scope.get("state") or {}
    held = state.get("principal")
    return held if isinstance(held, Principal) else None


@dataclass
class AccessServices:
    """The scoped tokens of the API's colony (every tenant's) and the audit trail of each tenant;
    `tenant`: the colony's own."""

    tokens: TokenStore
    tenant: str
    trail_of: Callable[[str], AuditTrail]

    def trail(self, principal: Principal) -> AuditTrail:
        """The audit trail of the principal's tenant."""
        return self.trail_of(principal.tenant or self.tenant)


_pending: set[asyncio.Task[None]] = set()  # audit appends in flight (held: a task is not collected)


def audit_later(
    access: Callable[[], Awaitable[AccessServices]],
    principal: Principal,
    method: str,
    matched: Matched | None,
    status: int,
    *,
    refused: bool = False,
) -> None:
    """Append the call to the audit trail in the background (the answer does not wait for it; a
    failure is logged, never the request's); `refused`: to the stream of refusals."""
    route = matched.template if matched is not None else "(no route)"
    ids = matched.params if matched is not None else {}

    async def append() -> None:
        try:
            trail = (await access()).trail(principal)
            await trail.append(
                token=principal.token_id, method=method, route=route, ids=ids, status=status, refused=refused
            )
        except Exception as exc:
            log.warning("the audit entry of %s %s (%s) was not written: %r", method, route, status, exc)

    task = asyncio.get_running_loop().create_task(append())
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def check_agent(request: Request, agent_id: str) -> None:
    """AgentNotFound (404, as for an agent that does not exist) when the request's token is not
    given `agent_id` (an agent named in a body, or found through a run)."""
    principal = principal_of(request)
    if principal is not None and not principal.sees(agent_id):
        raise AgentNotFound(f"no agent named {agent_id!r}")


def visible_records(request: Request, records: list[AgentRecord]) -> list[AgentRecord]:
    """The registry records of the agents the request's token sees (of its tenant, given it)."""
    shown = visible(request, (r.agent_id for r in records))
    return records if shown is None else [r for r in records if r.agent_id in shown]


def visible(request: Request, agent_ids: Iterable[str]) -> set[str] | None:
    """The subset of `agent_ids` the request's token sees (its tenant's, and of those the ones it is
    given); None: every agent (an app built without the guard)."""
    principal = principal_of(request)
    if principal is None:
        return None
    return {a for a in agent_ids if principal.sees(a)}
