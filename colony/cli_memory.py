"""`colony memory map|query|write|reindex AGENT`: an agent's memory from the command line (and
`colony memory shared ...`, the colony's shared memory: colony.cli_memory_shared).

Every subcommand is a call to the HTTP API (colony.client), like `colony run`, so `--url`/`--token`
(or $COLONY_URL / $COLONY_API_TOKEN) reach a cluster started elsewhere and the local cluster's token
never leaves it (colony.cli_target). Text that comes from the server (entries, tags, scope ids) is
printed without control characters: a stored memory cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from colony.cli_target import TOKEN_ENV, URL_ENV, ApiTarget, api_error, api_target
from colony.cli_target import server_text as _text
from colony.config import load_settings
from colony.errors import ColonyError
from colony.memory.scopes import MemoryScope

MAX_TAGS_SHOWN = 8
MAX_CONTENT_SHOWN = 400


def _scope_type(scope_id: Any) -> str:
    try:
        return MemoryScope.scope_type(scope_id) if isinstance(scope_id, str) else "?"
    except ValueError:
        return "?"


def _seconds(value: Any) -> str:
    return f"{value:g}s" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def render_map(memory_map: dict[str, Any]) -> str:
    """A MemoryMap as a table: one row per scope (type, entries/cap, TTL, pending, tags), then the
    dataflow edges and the scope ids."""
    scopes: dict[str, Any] = memory_map.get("scopes") or {}
    agent = _text(memory_map.get("agent_id"))
    lines = [
        f"agent {agent}: {len(scopes)} scope(s), {memory_map.get('total_entries', 0)} entries, "
        f"{memory_map.get('total_pending_ingestion', 0)} pending ingestion"
    ]
    if not scopes:
        lines.append("  no memory (the agent has no memory capability)")
        return "\n".join(lines) + "\n"
    rows = [("SCOPE", "ENTRIES/CAP", "TTL", "PENDING", "TAGS")]
    types: dict[str, str] = {}
    for scope_id, info in scopes.items():
        scope_type = _text(info.get("scope_type"), 40)
        types[scope_id] = scope_type
        cap = info.get("max_entries")
        tags = [_text(t, 40) for t in info.get("available_tags") or []]
        shown = ", ".join(tags[:MAX_TAGS_SHOWN]) + (
            f" (+{len(tags) - MAX_TAGS_SHOWN})" if len(tags) > MAX_TAGS_SHOWN else ""
        )
        rows.append(
            (
                scope_type,
                f"{info.get('entry_count', 0)}/{cap if cap else '-'}",
                _seconds(info.get("ttl_seconds")),
                str(info.get("pending_ingestion", 0)),
                shown or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        lines.append(
            "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
        )
    edges = memory_map.get("dataflow_edges") or []
    if edges:
        named = [f"{types.get(a, _text(a, 80))} -> {types.get(b, _text(b, 80))}" for a, b in edges]
        lines.append("  dataflow: " + "; ".join(named))
    lines.append("  scope ids:")
    lines += [f"    {types[s]}: {_text(s, 300)}" for s in scopes]
    return "\n".join(lines) + "\n"


def render_entries(entries: Sequence[dict[str, Any]]) -> str:
    """Recalled entries, most relevant first: relevance, scope type, tags, then the text."""
    if not entries:
        return "no entries\n"
    lines = []
    for n, item in enumerate(entries, 1):
        entry = item.get("entry") or {}
        scope_type = _scope_type(entry.get("scope_id"))
        tags = ", ".join(_text(t, 40) for t in sorted(entry.get("tags") or []))
        relevance = item.get("relevance")
        score = f"{relevance:.3f}" if isinstance(relevance, int | float) else "-"
        lines.append(
            f"{n}. [{score}] {_text(scope_type, 40)} {_text(entry.get('entry_id'), 140)}"
            + (f"  tags: {tags}" if tags else "")
        )
        lines.append(f"   {_text(entry.get('content'), MAX_CONTENT_SHOWN)}")
    return "\n".join(lines) + "\n"


def render_written(written: dict[str, Any]) -> str:
    """What a write did: the entry stored and where, or the entry already holding the text."""
    entry = written.get("entry") or {}
    if written.get("created"):
        return f"stored {_text(entry.get('entry_id'), 140)} in {_text(entry.get('scope_id'), 300)}"
    return f"already held as {_text(written.get('duplicate_of'), 140)}: nothing written"


def call(args: argparse.Namespace, work: Any) -> int:
    target = api_target(args, load_settings(args.config))
    from colony.client import ColonyClient

    try:
        with ColonyClient(target.url, target.token) as client:
            return int(work(client, target))
    except ColonyError as exc:
        raise api_error(target, exc) from None


def cmd_memory_map(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        memory_map = client.memory.map(args.agent)
        print(json.dumps(memory_map, indent=2) if args.json else render_map(memory_map).rstrip("\n"))
        return 0

    return call(args, work)


def cmd_memory_query(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"max_results": args.n, "min_relevance": args.min_relevance, "mode": args.mode}
    if args.tag:
        fields["tag_filter"] = {"all_of": args.tag}
    if args.scope:
        fields["scopes"] = args.scope

    def work(client: Any, _: ApiTarget) -> int:
        entries = client.memory.query(args.agent, args.text, **fields)
        print(json.dumps(entries, indent=2) if args.json else render_entries(entries).rstrip("\n"))
        return 0

    return call(args, work)


def cmd_memory_write(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"tags": args.tag or None, "ttl_seconds": args.ttl, "kind": args.kind}
    if args.data is not None:
        try:
            fields["data"] = json.loads(args.data)
        except json.JSONDecodeError as exc:
            raise ColonyError(f"--data is not valid JSON: {exc}") from None

    def work(client: Any, _: ApiTarget) -> int:
        written = client.memory.write(args.agent, args.scope, args.text, **fields)
        if args.json:
            print(json.dumps(written, indent=2))
            return 0
        print(render_written(written))
        return 0

    return call(args, work)


def cmd_memory_reindex(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        done = client.memory.reindex(args.agent)
        if args.json:
            print(json.dumps(done, indent=2))
            return 0
        scopes = done.get("scopes") or {}
        if not scopes:
            print(f"agent {_text(args.agent, 128)} has no memory scopes: nothing to reindex")
            return 0
        for scope, count in scopes.items():
            print(f"{_text(scope, 300)}: {count} entries")
        if not done.get("vector"):
            why = _text(done.get("vector_error"), 300) or "no vector index"
            print(f"vector index not rebuilt ({why}); the keyword index was")
        return 0

    return call(args, work)


def remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help=f"the API of a cluster started elsewhere (default: ${URL_ENV}, else the local cluster)"
    )
    parser.add_argument("--token", help=f"that API's token (with --url: default ${TOKEN_ENV})")


def add_memory_commands(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `memory map|query|write|reindex` to the `colony` command's subparsers. `parents`: the
    parsers holding `--url`/`--token` (cli.py's `remote`); None adds those options here."""
    memory = subparsers.add_parser(
        "memory", help="an agent's memory (map, query, write, reindex); shared memory"
    )
    actions = memory.add_subparsers(dest="memory_action", required=True)

    def leaf(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(
            name, help=help_text, parents=list(parents or [])
        )
        if parents is None:
            remote_options(parser)
        parser.add_argument("agent", help="agent name, e.g. assistant")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    map_p = leaf("map", "the agent's scopes: type, entries/cap, TTL, pending ingestion, tags")
    map_p.set_defaults(func=cmd_memory_map)

    query = leaf("query", "recall entries by meaning and filters, most relevant first")
    query.add_argument(
        "text", nargs="?", default=None, help="what to look for (none: newest, most important)"
    )
    query.add_argument("--tag", action="append", default=[], help="entries must carry this tag (repeatable)")
    query.add_argument(
        "--scope", action="append", default=[], help="a scope type (working, stm, ...) or id (repeatable)"
    )
    query.add_argument("-n", type=int, default=10, help="at most this many entries (default 10)")
    query.add_argument("--min-relevance", type=float, default=0.0, help="drop entries below this (0-1)")
    query.add_argument("--mode", choices=["hybrid", "vector", "keyword"], default="hybrid")
    query.set_defaults(func=cmd_memory_query)

    write = leaf("write", "store an entry in one of the agent's scopes (seeding, tests)")
    write.add_argument("text", help="the entry's text")
    write.add_argument("--scope", required=True, help="a scope type of the agent (working, stm, ...) or id")
    write.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")
    write.add_argument("--ttl", type=float, default=None, help="seconds to live (default: the scope's)")
    write.add_argument("--kind", default=None, help="entry kind, e.g. fact")
    write.add_argument("--data", default=None, help="a JSON payload kept with the entry")
    write.set_defaults(func=cmd_memory_write)

    reindex = leaf("reindex", "rebuild the agent's vector and keyword indexes from Redis")
    reindex.set_defaults(func=cmd_memory_reindex)
    from colony.cli_memory_shared import add_shared_commands  # (it builds on this module)

    add_shared_commands(actions, parents)
    return memory
