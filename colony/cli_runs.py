"""`colony runs tree RUN_ID`: a run and the runs it started (its children, theirs, ...), as a tree.

A call to `GET /v1/runs/{id}/tree` like every remote command (`--url`/`--token`); text from the
server is printed without control characters."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from colony.cli_memory import call, remote_options
from colony.cli_target import ApiTarget
from colony.cli_target import server_text as _text


def _took(node: dict[str, Any]) -> str:
    start, end = node.get("created_at"), node.get("ended_at")
    if isinstance(start, int | float) and isinstance(end, int | float):
        return f"{max(0.0, end - start):.1f}s"
    return "-"


def render_tree(tree: dict[str, Any]) -> str:
    """One line a run: indent by depth, agent, request id, state, time taken, the replica hosting
    its agent now and the error, if any."""
    nodes = tree.get("nodes")
    count = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else "?"
    lines = [f"trace {_text(tree.get('trace_id'), 140)}: {count} run(s)"]

    def walk(node: dict[str, Any], depth: int) -> None:
        error, replica = node.get("error"), node.get("replica")
        lines.append(
            f"{'  ' * depth}- {_text(node.get('agent'), 128)}  {_text(node.get('request_id'), 140)}  "
            f"{_text(node.get('status'), 20)}  {_took(node)}"
            + (f"  on {_text(replica, 128)}" if replica else "")
            + (f"  ({_text(error, 200)})" if error else "")
        )
        for child in node.get("children") or []:
            if isinstance(child, dict):
                walk(child, depth + 1)

    root = tree.get("root")
    if isinstance(root, dict):
        walk(root, 0)
    if tree.get("truncated"):
        lines.append("(more runs than shown)")
    return "\n".join(lines)


def cmd_runs_tree(args: argparse.Namespace) -> int:
    def work(client: Any, _: ApiTarget) -> int:
        tree = client.tree(args.run_id)
        print(json.dumps(tree, indent=2) if args.json else render_tree(tree))
        return 0

    return call(args, work)


def add_runs_commands(subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None) -> None:
    """Add `runs tree RUN_ID` to the `colony` command's subparsers."""
    runs = subparsers.add_parser("runs", help="runs submitted over HTTP: the tree of a job's runs")
    actions = runs.add_subparsers(dest="runs_action", required=True)
    tree = actions.add_parser(
        "tree", help="a run and the runs it started, with states and times", parents=list(parents or [])
    )
    if parents is None:
        remote_options(tree)
    tree.add_argument("run_id", help="the run's id (what `colony run` and POST /v1/runs answered)")
    tree.add_argument("--json", action="store_true", help="machine-readable output")
    tree.set_defaults(func=cmd_runs_tree)
