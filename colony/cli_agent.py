"""`colony agent checkpoints|undo|restore|export|import` (docs/checkpoints.md, docs/transfer.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_agent_commands(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `agent ...` to the `colony` command's subparsers."""
    agent = subparsers.add_parser("agent", help="an agent's checkpoints, undo, restore, export, import")
    agent.add_subparsers(dest="agent_action", required=True)
    return agent
