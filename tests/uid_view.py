"""Run a command as another uid, seeing the files a root-owned CI machine keeps under /root: as the
shipped images run Colony, as an unprivileged uid (tests/test_sandbox_as_uid1000.py).

Started as root inside a new mount namespace (`unshare --mount -- python uid_view.py UID -- CMD`;
it refuses to run in its parent's mount namespace, where it would change the host's mounts): `/root`
(mode 0700 on such machines, holding the Python installation the venv points at) is replaced, in
this namespace only, by a 0755 tmpfs into which each of its entries is bound back with its own mode
(from a descriptor of the original, so nothing is made on the host to hold it), so what was
readable by everyone under /root is reachable again and what was private stays private. The
command's HOME is a folder in that tmpfs. Then the groups, gid and uid are dropped to UID (no
capability is kept) and CMD runs. Nothing outside the namespace changes, and nothing is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def in_own_mount_namespace() -> bool:
    """Whether this process's mount namespace is not its parent's (`unshare --mount` made it)."""
    return os.stat("/proc/self/ns/mnt").st_ino != os.stat(f"/proc/{os.getppid()}/ns/mnt").st_ino


def open_root(uid: int) -> str:
    """The view of /root described above; returns the command's HOME."""
    mount("--make-rprivate", "/")
    original = os.open("/root", os.O_RDONLY | os.O_DIRECTORY)
    names = sorted(os.listdir(original))
    mount("-t", "tmpfs", "-o", "mode=0755,size=16m", "tmpfs", "/root")
    for name in names:
        source = f"/proc/{os.getpid()}/fd/{original}/{name}"
        target = Path("/root") / name
        if os.path.islink(source):
            target.symlink_to(os.readlink(source))
            continue
        if os.path.isdir(source):
            target.mkdir()
        else:
            target.touch()
        mount("--no-canonicalize", "--bind", source, str(target))  # (canonical: the covered path)
    os.close(original)
    home = Path("/root") / f".uid-view-home-{uid}"
    home.mkdir(exist_ok=True)
    os.chown(home, uid, uid)
    return str(home)


def main(argv: list[str]) -> int:
    uid, command = int(argv[0]), argv[2:]
    if os.geteuid() != 0 or not command or argv[1] != "--":
        print("usage (as root): unshare --mount -- python uid_view.py UID -- CMD...", file=sys.stderr)
        return 2
    if not in_own_mount_namespace():
        print("refused: run it in a mount namespace of its own (unshare --mount)", file=sys.stderr)
        return 2
    home = open_root(uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.execvpe(command[0], command, {**os.environ, "HOME": home, "USER": str(uid)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
