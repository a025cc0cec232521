"""`colony bb write|read|query|watch`: the blackboard from the command line (straight to Redis,
not through the API)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from colony.config import load_settings


def _board(args: argparse.Namespace) -> Any:
    from colony.blackboard import Blackboard, BlackboardScope, scope_id

    settings = load_settings(args.config)
    scope = args.scope or scope_id(
        BlackboardScope.COLONY, tenant_id=settings.tenant_id, colony_id=settings.colony_id
    )
    return Blackboard.connect(scope, settings)


def _show(entry: Any) -> None:
    print(json.dumps(entry.model_dump(mode="json"), sort_keys=True))


async def _bb(args: argparse.Namespace) -> int:
    board = _board(args)
    try:
        if args.action == "write":
            try:
                value = json.loads(args.value)
            except json.JSONDecodeError:
                value = args.value  # a bare word is stored as a string
            _show(await board.write(args.key, value, tags=args.tag, ttl_seconds=args.ttl, created_by="cli"))
        elif args.action == "read":
            entry = await board.read(args.key)
            if entry is None:
                print(f"{args.key}: not found in scope {board.scope_id}", file=sys.stderr)
                return 1
            _show(entry)
        elif args.action == "query":
            tags = {"all_of": args.tag} if args.tag else None
            async for entry in board.iter_query(args.pattern, tags=tags):
                _show(entry)
        elif args.action == "watch":
            seen = 0
            async for event in board.subscribe(args.pattern, from_id=args.from_id):
                print(json.dumps(event.model_dump(mode="json"), sort_keys=True), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    break
        return 0
    finally:
        await board.close()


def cmd_bb(args: argparse.Namespace) -> int:
    return asyncio.run(_bb(args))


def add_bb_command(sub: Any) -> argparse.ArgumentParser:
    """Add `bb write|read|query|watch` to the `colony` command's subparsers."""
    bb = sub.add_parser("bb", help="read and write the blackboard")
    bb.add_argument("--scope", help="scope id (default: this colony's COLONY scope)")
    bb_sub = bb.add_subparsers(dest="action", required=True)
    write = bb_sub.add_parser("write", help="write a JSON value")
    write.add_argument("key")
    write.add_argument("value", help="JSON text (a bare word is stored as a string)")
    write.add_argument("--tag", action="append", default=[])
    write.add_argument("--ttl", type=float, default=None, help="seconds to live")
    read = bb_sub.add_parser("read", help="read one entry")
    read.add_argument("key")
    query = bb_sub.add_parser("query", help="list entries by key pattern and tags")
    query.add_argument("pattern", nargs="?", default="*")
    query.add_argument("--tag", action="append", default=[], help="entries must carry this tag (repeatable)")
    watch = bb_sub.add_parser("watch", help="print events as they happen")
    watch.add_argument("pattern", nargs="?", default="*")
    watch.add_argument("--from-id", default="$", help="resume after this event id ('0' = from the start)")
    watch.add_argument("--count", type=int, default=0, help="stop after this many events")
    bb.set_defaults(func=cmd_bb)
    return bb
