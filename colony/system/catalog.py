"""The built-in agents every colony starts with, by name."""

from __future__ import annotations

from collections.abc import Callable

from colony.agents import AgentBlueprint
from colony.system.analyze import analyze_blueprint
from colony.system.builtin import ask_blueprint, echo_blueprint

BUILTIN_AGENTS: dict[str, Callable[[str], AgentBlueprint]] = {
    "echo": echo_blueprint,
    "ask": ask_blueprint,
    "analyze": analyze_blueprint,
}
