"""Run a command as another uid, seeing the files a root-owned CI machine keeps under /root: as the
shipped images run Colony, as an unprivileged uid (tests/test_sandbox_as_uid1000.py).

Started as root inside a new mount namespace (`unshare --mount -- python uid_view.py UID -- CMD`):
`/root` (mode 0700 on such machines, holding the Python installation the venv points at) is
replaced, in this namespace only, by a 0755 tmpfs into which each of its entries is bound back with
its own mode, so what was readable by everyone under /root is reachable again and what was private
stays private. Then the groups, gid and uid are dropped to UID (no capability is kept) and CMD runs
with a HOME of its own. Nothing outside the namespace changes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ORIGINAL = Path("/tmp/.uid-view-root")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def open_root() -> None:
    mount("--make-rprivate", "/")
    ORIGINAL.mkdir(exist_ok=True)
    mount("--bind", "/root", str(ORIGINAL))
    mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", "/root")
    for entry in sorted(ORIGINAL.iterdir()):
        target = Path("/root") / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            target.mkdir()
        else:
            target.touch()
        mount("--bind", str(entry), str(target))


def main(argv: list[str]) -> int:
    uid, _, command = int(argv[0]), argv[1], argv[2:]
    if os.geteuid() != 0 or not command:
        print("usage (as root): unshare --mount -- python uid_view.py UID -- CMD...", file=sys.stderr)
        return 2
    open_root()
    home = tempfile.mkdtemp(prefix=f"uid-view-home-{uid}-")  # a home of its own (not /tmp)
    os.chown(home, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.execvpe(command[0], command, {**os.environ, "HOME": home, "USER": str(uid)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
