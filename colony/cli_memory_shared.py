"""`colony memory shared ls|show|define|write|query`: the colony's shared memory from the command line.

Shared scopes (`global`, `collective:NAME`, `task:NAME`) are defined by the operator with the
agents that may read and write them (docs/memory.md, "Shared memory"). Every subcommand is a call to
the HTTP API like the rest of `colony memory`; server text is printed without control characters.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from colony.cli_memory import call, remote_options, render_entries, render_written
from colony.cli_target import ApiTarget
from colony.cli_target import server_text as _text
from colony.errors import ColonyError
from colony.memory.shared import SHARED_NAME_RULE, check_name


def _agents(value: str | None) -> list[str] | None:
    """`a,b,c` as a list (`""`: nobody); None when the option was not given."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _name(value: str) -> str:
    try:
        return check_name(value)
    except ColonyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _who(agents: Sequence[Any]) -> str:
    shown = [_text(a, 128) for a in agents]
    if not shown:
        return "nobody"
    return "every agent" if shown == ["*"] else ", ".join(shown)


def render_scope(info: dict[str, Any]) -> str:
    """One shared scope: name, entries/cap, TTL, who reads and writes, what feeds it."""
    cap = info.get("max_entries")
    ttl = info.get("ttl_seconds")
    lines = [
        f"{_text(info.get('name'), 80)}: {info.get('entry_count', 0)}/{cap if cap else '-'} entries, "
        f"TTL {f'{ttl:g}s' if isinstance(ttl, int | float) else '-'}",
        f"  readers: {_who(info.get('readers') or [])}",
        f"  writers: {_who(info.get('writers') or [])}",
    ]
    if info.get("purpose"):
        lines.append(f"  purpose: {_text(info.get('purpose'), 200)}")
    feeds = info.get("subscribed_to") or []
    if feeds:
        lines.append(f"  fed by: {', '.join(_text(s, 300) for s in feeds)}")
    return "\n".join(lines)


def _print(args: argparse.Namespace, value: Any, text: str) -> int:
    print(json.dumps(value, indent=2) if args.json else text)
    return 0


def cmd_shared_ls(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        scopes = client.memory.shared()
        text = (
            "\n".join(render_scope(s) for s in scopes)
            or "no shared memory (define one: colony memory shared define)"
        )
        return _print(args, scopes, text)

    return call(args, work)


def cmd_shared_show(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        info = client.memory.shared_scope(args.name)
        return _print(args, info, render_scope(info))

    return call(args, work)


def cmd_shared_define(args: argparse.Namespace) -> int:
    fields = {"purpose": args.purpose, "ttl_seconds": args.ttl, "max_entries": args.max_entries}
    readers, writers = _agents(args.readers), _agents(args.writers)

    def work(client: Any, _: ApiTarget) -> int:
        info = client.memory.define_shared(args.name, readers=readers, writers=writers, **fields)
        return _print(args, info, "defined " + render_scope(info))

    return call(args, work)


def cmd_shared_write(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        written = client.memory.share(args.name, args.text, tags=args.tag or None, kind=args.kind)
        return _print(args, written, render_written(written))

    return call(args, work)


def cmd_shared_query(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"max_results": args.n, "min_relevance": args.min_relevance, "mode": args.mode}
    if args.tag:
        fields["tag_filter"] = {"all_of": args.tag}

    def work(client: Any, _: ApiTarget) -> int:
        entries = client.memory.recall_shared(args.name, args.text, **fields)
        return _print(args, entries, render_entries(entries).rstrip("\n"))

    return call(args, work)


def add_shared_commands(actions: Any, parents: Sequence[argparse.ArgumentParser] | None) -> None:
    """Add `shared ls|show|define|write|query` under `colony memory` (`actions`: its subparsers;
    `parents`: as add_memory_commands')."""
    shared = actions.add_parser(
        "shared", help="the colony's shared memory: collective, task and global scopes"
    )
    verbs = shared.add_subparsers(dest="shared_action", required=True)

    def leaf(name: str, help_text: str, *, named: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = verbs.add_parser(name, help=help_text, parents=list(parents or []))
        if parents is None:
            remote_options(parser)
        if named:
            parser.add_argument("name", type=_name, help=SHARED_NAME_RULE)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    leaf("ls", "every shared scope: entries, readers, writers", named=False).set_defaults(func=cmd_shared_ls)
    leaf("show", "one shared scope").set_defaults(func=cmd_shared_show)
    define = leaf(
        "define", "define a shared scope, or change what the options give (the rest and the entries stay)"
    )
    define.add_argument(
        "--readers", help="agent ids that may read, comma-separated ('*': every agent; default '*')"
    )
    define.add_argument("--writers", help="agent ids that may write ('*': every agent; default: none)")
    define.add_argument("--purpose", default=None, help="what the scope is for (default: its type's)")
    define.add_argument("--ttl", type=float, default=None, help="entries' default seconds to live (0: none)")
    define.add_argument(
        "--max-entries", type=int, default=None, help="cap (default memory.default_max_entries)"
    )
    define.set_defaults(func=cmd_shared_define)
    write = leaf("write", "store an entry in a shared scope (as the operator)")
    write.add_argument("text", help="the entry's text")
    write.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    write.add_argument("--kind", default=None, help="entry kind, e.g. fact")
    write.set_defaults(func=cmd_shared_write)
    query = leaf("query", "recall from a shared scope, most relevant first")
    query.add_argument("text", nargs="?", default=None, help="what to look for")
    query.add_argument("--tag", action="append", default=[], help="entries must carry this tag (repeatable)")
    query.add_argument("-n", type=int, default=10, help="at most this many entries (default 10)")
    query.add_argument("--min-relevance", type=float, default=0.0, help="drop entries below this (0-1)")
    query.add_argument("--mode", choices=["hybrid", "vector", "keyword"], default="hybrid")
    query.set_defaults(func=cmd_shared_query)
