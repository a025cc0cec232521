"""Running the `colony` command as a user does, in a subprocess (shared by the CLI tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`colony ARGS...` with its output captured; fails the test past `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-m", "colony.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
