"""`colony token create|ls|revoke` and `colony audit`: scoped API tokens and the audit trail, over
the API with an admin token (docs/api.md, Scoped tokens, Audit trail)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from colony.cli_memory import call, remote_options
from colony.cli_target import ApiTarget
from colony.cli_target import server_text as _text
from colony.system.access_tokens import VERBS


def _when(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _verbs(text: str) -> list[str]:
    verbs = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in verbs if v not in VERBS]
    if not verbs or unknown:
        raise argparse.ArgumentTypeError(f"verbs are some of {','.join(VERBS)} (got {text!r})")
    return verbs


def _agents(text: str) -> list[str]:
    agents = [a.strip() for a in text.split(",") if a.strip()]
    if not agents:
        raise argparse.ArgumentTypeError("--agents names no agent (leave it out for every agent)")
    return agents


def cmd_token_create(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        made = client.access.create_token(
            args.verbs, agents=args.agents, ttl_seconds=args.ttl, note=args.note, tenant=args.tenant
        )
        if args.json:
            print(json.dumps(made, indent=2))
            return 0
        print(
            f"token {_text(made.get('id'), 32)}: tenant {_text(made.get('tenant'), 128)}, "
            f"verbs {_text(','.join(made.get('verbs') or []), 64)}"
        )
        if made.get("agents") is not None:
            print(f"  agents: {_text(', '.join(made['agents']), 2000)}")
        if made.get("expires_at"):
            print(f"  expires: {_when(made['expires_at'])}")
        print(_text(made.get("token"), 128))
        print("(shown once: only a digest of it is kept)", file=sys.stderr)
        return 0

    return call(args, work)


def cmd_token_ls(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        tokens = client.access.tokens(args.tenant)
        if args.json:
            print(json.dumps(tokens, indent=2))
            return 0
        if not tokens:
            print("no scoped tokens (the deployment's API token is not listed: it is not revocable here)")
        for t in tokens:
            agents = "every agent" if t.get("agents") is None else ", ".join(t["agents"])
            print(
                f"{_text(t.get('id'), 32)}  {_text(','.join(t.get('verbs') or []), 64)}  "
                f"tenant {_text(t.get('tenant'), 128)}  {_text(agents, 400)}  "
                f"made {_when(t.get('created_at'))}  expires {_when(t.get('expires_at'))}  "
                f"{_text(t.get('note'), 200)}"
            )
        return 0

    return call(args, work)


def cmd_token_revoke(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        client.access.revoke_token(args.token_id)
        print(f"revoked {args.token_id} (refused everywhere within a second)")
        return 0

    return call(args, work)


def render_audit(entries: list[dict[str, Any]]) -> str:
    lines = []
    for e in entries:
        ids = " ".join(f"{_text(k, 64)}={_text(v, 200)}" for k, v in (e.get("ids") or {}).items())
        lines.append(
            f"{_when(e.get('at'))}  {_text(e.get('token'), 32)}  {_text(e.get('method'), 8)} "
            f"{_text(e.get('route'), 300)}  {_text(e.get('status'), 3)}  {ids}".rstrip()
        )
    return "\n".join(lines)


def cmd_audit(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        page = client.access.audit(limit=args.limit, before=args.before, refused=args.refused)
        if args.json:
            print(json.dumps(page, indent=2))
        elif page.get("entries"):
            print(render_audit(page["entries"]))
            if page.get("next_before"):
                print(f"(older: colony audit --before {_text(page['next_before'], 48)})", file=sys.stderr)
        else:
            print("no audit entries")
        return 0

    return call(args, work)


def add_access_commands(subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None) -> None:
    """Add `token create|ls|revoke` and `audit` to the `colony` command's subparsers."""
    shared = list(parents or [])

    def with_remote(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        if parents is None:
            remote_options(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    token = subparsers.add_parser("token", help="scoped API tokens (an admin token is needed)")
    actions = token.add_subparsers(dest="token_action", required=True)
    create = with_remote(actions.add_parser("create", help="make a token; prints it once", parents=shared))
    create.add_argument("--tenant", help="its tenant (default: the colony's own)")
    create.add_argument("--verbs", type=_verbs, required=True, help=f"comma-separated: {','.join(VERBS)}")
    create.add_argument("--agents", type=_agents, help="comma-separated agent ids it is restricted to")
    create.add_argument("--ttl", type=float, help="seconds until it expires (default: never)")
    create.add_argument("--note", default="", help="what it is for (listed with it)")
    create.set_defaults(func=cmd_token_create)
    listing = with_remote(actions.add_parser("ls", help="the tokens kept (no secrets)", parents=shared))
    listing.add_argument("--tenant", help="another tenant's (with a token of the colony's own tenant)")
    listing.set_defaults(func=cmd_token_ls)
    revoke = with_remote(actions.add_parser("revoke", help="revoke a token by its id", parents=shared))
    revoke.add_argument("token_id", help="the id `colony token ls` lists")
    revoke.set_defaults(func=cmd_token_revoke)
    audit = with_remote(subparsers.add_parser("audit", help="the audit trail, newest first", parents=shared))
    audit.add_argument("--limit", type=int, default=100, help="entries (1-1000, default 100)")
    audit.add_argument("--before", help="older than this entry id (what the last page printed)")
    audit.add_argument("--refused", action="store_true", help="the calls refused for lack of a verb or agent")
    audit.set_defaults(func=cmd_audit)
