"""`colony chat`: an interactive terminal chat with a session agent (docs/sessions.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_chat_command(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `chat` to the `colony` command's subparsers."""
    return subparsers.add_parser("chat", help="chat with a session agent", parents=list(parents or []))
