"""Page sources: a folder or git checkout cut into pages of at most N tokens.

Pages are cut on file boundaries (several small files share a page; a large file is split on line
boundaries), binary and ignored files are skipped, and a page's id is the hash of its content, so
mapping the same tree twice gives the same pages.

A path to map comes from outside (an HTTP body, a run input), so a source reads only inside its
`allowed_roots` (`vcm.allowed_roots`): the folder, and then every file one by one, must resolve
(symlinks followed, `..` collapsed) to a place under a root; a file that resolves elsewhere (a
symlink to /etc/passwd) is skipped, and only regular files are read (a FIFO would block the walk).
A file is opened by walking down from its root one folder at a time without following symlinks, so
a folder swapped for a symlink between the check and the read (a race) makes the read fail, never
leave the roots.
No roots means nothing may be read. Caps on files and bytes bound what one request can make the
server read and store. The walk reads every file, so `PageSource.open` runs it in a thread.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import itertools
import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from colony.config import VcmSettings
from colony.errors import InvalidArgument, PathNotAllowed, SourceTooLarge
from colony.vcm.page import Page
from colony.wire.input_check import is_utf8

FILES_LOOKED_AT = 10  # x vcm.max_files_per_source: files of any kind a source lists and probes
GIT_READS = ("index", "HEAD", "config", "commondir")  # what `git ls-files` opens in the git folder
GIT_SECONDS = 10.0  # for `git ls-files` (then the folder is walked)
DEFAULT_IGNORES = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "node_modules",
    ".venv",
    "venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "dist",
    "build",
    "*.pyc",
    "*.so",
    "*.o",
    "*.a",
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.gif",
    "*.pdf",
    "*.zip",
    "*.gz",
    "*.tar",
    "*.whl",
    "*.gguf",
    "*.bin",
    "*.lock",
)
_DEFAULTS = VcmSettings()
NO_ROOTS = (
    "mapping folders is off: vcm.allowed_roots is empty. Set it to the folders page sources may read "
    "(config file `vcm: {allowed_roots: [/path/to/code]}` or "
    "COLONY_VCM__ALLOWED_ROOTS='[\"/path/to/code\"]'; "
    "`colony up` uses the folder it was started in)"
)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 4 characters a token) used to size pages."""
    return estimate_chars(len(text))


def estimate_chars(chars: int) -> int:
    """`estimate_tokens` of a text of `chars` characters."""
    return max(1, (chars + 3) // 4)


def _resolve(path: str | Path) -> Path | None:
    """The real path (`~` expanded, symlinks followed, `..` collapsed); None when it cannot be
    resolved (a symlink loop, an unknown user's `~`, a name the OS refuses)."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def resolve_roots(roots: Iterable[str | Path]) -> list[Path]:
    """The allowed roots as real paths (a root that is itself a symlink counts as its target; one
    that cannot be resolved allows nothing)."""
    return [resolved for resolved in map(_resolve, roots) if resolved is not None]


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether a resolved path lies in (or is) one of the resolved roots."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def check_allowed(path: str | Path, roots: Sequence[Path]) -> Path:
    """The resolved folder if it lies under a root, else PathNotAllowed (checked before the folder's
    existence, so the answer tells nothing about paths outside the roots)."""
    if not roots:
        raise PathNotAllowed(NO_ROOTS)
    if "\0" in str(path):
        raise InvalidArgument("a page source path cannot contain a NUL character")
    resolved = _resolve(path)
    if resolved is None or not inside(resolved, roots):
        raise PathNotAllowed(
            f"{str(path)[:200]!r} is outside the folders page sources may read (vcm.allowed_roots, "
            "symlinks resolved); map a folder under one of them or add it to vcm.allowed_roots"
        )
    return resolved


class FileSpan(BaseModel):
    path: str
    start_line: int
    end_line: int


class PageInfo(BaseModel):
    """A page's description (its text is stored apart)."""

    page_id: str
    source_id: str
    tokens: int
    files: list[FileSpan] = Field(default_factory=list)


@dataclass(frozen=True)
class _Entry:
    relative: str  # the name inside the source (what the pages show)
    real: Path  # where it resolves (what is read)
    size: int
    root: Path  # the allowed root `real` lies under (the read walks down from it)


class PageSource:
    """A folder (or a git checkout: tracked files only) as pages of at most `page_tokens` tokens,
    reading only under `allowed_roots`, at most `max_files` files and `max_bytes` bytes."""

    def __init__(
        self,
        path: str | Path,
        *,
        allowed_roots: Iterable[str | Path],
        page_tokens: int = 2048,
        max_files: int = _DEFAULTS.max_files_per_source,
        max_bytes: int = _DEFAULTS.max_bytes_per_source,
        ignore: tuple[str, ...] = DEFAULT_IGNORES,
        count_tokens: Callable[[str], int] = estimate_tokens,
    ) -> None:
        self.roots = resolve_roots(allowed_roots)
        self.root = check_allowed(path, self.roots)
        if not self.root.is_dir():
            raise InvalidArgument(f"page source {str(self.root)!r} is not a directory")
        if page_tokens < 64:
            raise InvalidArgument(f"page_tokens must be at least 64, got {page_tokens}")
        self.page_tokens = page_tokens
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.ignore = ignore
        self.count_tokens = count_tokens
        self.source_id = "src-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.skipped: list[str] = []  # files that resolve outside the roots or are not regular files
        self._cut: list[tuple[PageInfo, Page]] | None = None

    @classmethod
    def from_settings(cls, path: str | Path, vcm: VcmSettings, *, page_tokens: int = 2048) -> PageSource:
        return cls(
            path,
            allowed_roots=vcm.allowed_roots,
            page_tokens=page_tokens,
            max_files=vcm.max_files_per_source,
            max_bytes=vcm.max_bytes_per_source,
        )

    @classmethod
    async def open(cls, path: str | Path, vcm: VcmSettings, *, page_tokens: int = 2048) -> PageSource:
        """Check the path and cut the pages in a worker thread (the walk reads every file; on the
        event loop it would stall every request of the process); `pages()` then only replays them."""

        def build() -> PageSource:
            source = cls.from_settings(path, vcm, page_tokens=page_tokens)
            source._cut = list(source._pages())
            return source

        return await asyncio.to_thread(build)

    def files(self) -> list[Path]:
        """Text files to map, in a stable order (SourceTooLarge past the caps)."""
        return [self.root / entry.relative for entry in self._entries()]

    def _entries(self) -> list[_Entry]:
        tracked = self._git_files()
        looked_at = self.max_files * FILES_LOOKED_AT
        candidates = sorted(itertools.islice(tracked if tracked is not None else self._walk(), looked_at + 1))
        if len(candidates) > looked_at:  # found by review: binary files were probed without a bound
            raise SourceTooLarge(
                f"{self.root} holds more than {looked_at} files, binary ones included ({FILES_LOOKED_AT} x "
                "vcm.max_files_per_source are looked at); map a smaller folder or raise the setting"
            )
        self.skipped = []
        entries: list[_Entry] = []
        total = 0
        for relative in candidates:
            if self._ignored(relative):
                continue
            if not is_utf8(relative):  # found by review: no page header or key holds such a name
                self.skipped.append(relative.encode("utf-8", "backslashreplace").decode())
                continue
            real = _resolve(self.root / relative)
            info = _regular_file(real) if real is not None else None
            root = _root_of(real, self.roots) if real is not None else None
            if real is None or info is None or root is None:
                self.skipped.append(relative)
                continue
            if not _is_text(real, root):
                continue
            entries.append(_Entry(relative, real, info.st_size, root))
            total += info.st_size
            if len(entries) > self.max_files:
                raise SourceTooLarge(
                    f"{self.root} holds more than {self.max_files} text files (vcm.max_files_per_source); "
                    "map a smaller folder or raise the setting"
                )
            if total > self.max_bytes:
                raise SourceTooLarge(
                    f"{self.root} holds more than {self.max_bytes} bytes of text (vcm.max_bytes_per_source); "
                    "map a smaller folder or raise the setting"
                )
        return entries

    def _walk(self) -> Iterator[str]:
        """Relative names of the files under the root; ignored folders are not entered and
        symlinked folders not followed (a file symlink is listed and checked like any file)."""
        for folder, dirs, names in os.walk(self.root, followlinks=False):
            dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, pattern) for pattern in self.ignore)]
            base = Path(folder).relative_to(self.root)
            yield from (str(base / name) for name in names)

    def _git_files(self) -> list[str] | None:
        if not _git_listable(self.root):
            return None
        try:
            listed = subprocess.run(
                # a hostile checkout's config could name an fsmonitor program for git to run
                ["git", "-c", "core.fsmonitor=false", "-C", str(self.root), "ls-files", "-z"],
                capture_output=True,
                check=True,
                timeout=GIT_SECONDS,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return [name for name in listed.decode(errors="replace").split("\0") if name]

    def _ignored(self, relative: str) -> bool:
        parts = Path(relative).parts
        return any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in self.ignore)

    def pages(self) -> Iterator[tuple[PageInfo, Page]]:
        """(description, page) pairs, in file order (replayed when `open` cut them already)."""
        return iter(self._cut) if self._cut is not None else self._pages()

    def _pages(self) -> Iterator[tuple[PageInfo, Page]]:
        chunk: list[tuple[FileSpan, str]] = []
        used = 0
        for entry in self._entries():
            content = _read(entry)
            if content is None:  # it could not be opened under its root any more (swapped, removed)
                self.skipped.append(entry.relative)
                continue
            for span, text in self._pieces(entry.relative, content):
                tokens = self.count_tokens(text) + 1  # + the separator between pieces
                if chunk and used + tokens > self.page_tokens:
                    yield self._page(chunk)
                    chunk, used = [], 0
                chunk.append((span, text))
                used += tokens
        if chunk:
            yield self._page(chunk)

    def _pieces(self, relative: str, content: str) -> Iterator[tuple[FileSpan, str]]:
        """The file whole, or split on line boundaries into pieces that each fit a page. The piece's
        size grows by each line (found by review: recounting the whole piece at every line made a
        file of short lines cost lines x page size): in characters for the default estimate (the
        same count as the joined piece's), else the lines' tokens and one a line break."""
        lines = file_lines(content)
        start, piece, size = 0, [], 0
        budget = self.page_tokens - 32  # room for the header
        by_chars = self.count_tokens is estimate_tokens

        def measure(line: str) -> int:
            return len(line) if by_chars else self.count_tokens(line)

        for number, line in enumerate(lines):
            grown = size + measure(line) + (1 if piece else 0)
            piece.append(line)
            if (estimate_chars(grown) if by_chars else grown) > budget and len(piece) > 1:
                piece.pop()
                yield self._piece(relative, start, number - 1, piece)
                start, piece, grown = number, [line], measure(line)
            size = grown
        if piece or not lines:
            yield self._piece(relative, start, max(start, len(lines) - 1), piece)

    @staticmethod
    def _piece(relative: str, start: int, end: int, lines: list[str]) -> tuple[FileSpan, str]:
        header = f"### {relative} (lines {start + 1}-{end + 1})"
        return FileSpan(path=relative, start_line=start + 1, end_line=end + 1), header + "\n" + "\n".join(
            lines
        )

    def _page(self, chunk: list[tuple[FileSpan, str]]) -> tuple[PageInfo, Page]:
        text = "\n\n".join(t for _, t in chunk)
        page_id = "pg-" + hashlib.sha256(text.encode()).hexdigest()[:16]
        info = PageInfo(
            page_id=page_id,
            source_id=self.source_id,
            tokens=self.count_tokens(text),
            files=[span for span, _ in chunk],
        )
        return info, Page(page_id=page_id, text=text, metadata={"source_id": self.source_id})


def _git_listable(root: Path) -> bool:
    """Whether `git ls-files` can list the checkout without blocking: `.git` a folder (or a
    `gitdir:` file naming one) whose GIT_READS are regular files or absent. Found by review: git
    opens them without Colony's checks, and a FIFO there held every mapping of the folder until
    git's timeout. Otherwise the folder is walked."""
    dot = root / ".git"
    try:
        info = dot.lstat()
        if stat.S_ISREG(info.st_mode):  # a worktree's or submodule's pointer: a regular file never blocks
            pointer = dot.read_text(errors="replace")[:4096]
            if not pointer.startswith("gitdir:"):
                return False
            named = Path(pointer[len("gitdir:") :].strip())
            dot = named if named.is_absolute() else root / named
            info = dot.lstat()
        if not stat.S_ISDIR(info.st_mode):
            return False
        for name in GIT_READS:
            try:
                if not stat.S_ISREG((dot / name).lstat().st_mode):
                    return False
            except FileNotFoundError:
                continue
    except (OSError, ValueError):
        return False
    return True


def file_lines(content: str) -> list[str]:
    """A file's lines as editors and `grep -n` count them: split at "\n" only (a form feed or a
    lone "\r" stays inside its line), a "\r\n" ending taken whole, no last empty line."""
    lines = content.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _regular_file(path: Path) -> os.stat_result | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _root_of(path: Path, roots: Sequence[Path]) -> Path | None:
    """The root a resolved path lies under (None: outside them all)."""
    return next((root for root in roots if path == root or path.is_relative_to(root)), None)


def _open_under(root: Path, real: Path) -> int | None:
    """A read-only fd of the regular file `real`, opened by walking down from `root` one component at
    a time, each folder opened with O_NOFOLLOW|O_DIRECTORY relative to the one above: `real` was
    resolved, so any symlink met on the way was put there after the check (a folder swapped for a
    link to outside the roots) and the open fails instead of following it. None when it fails or
    the file is not regular (a FIFO swapped in would block the walk)."""
    parts = real.relative_to(root).parts
    if not parts:
        return None
    opened: list[int] = []
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        opened.append(folder)
        for part in parts[:-1]:
            folder = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            opened.append(folder)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    finally:
        for descriptor in opened:
            os.close(descriptor)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _read(entry: _Entry) -> str | None:
    """The file's text, no more than the size counted against the cap (it may have grown since), read
    through `_open_under` its root; None when that fails (a folder on the way swapped for a symlink)."""
    fd = _open_under(entry.root, entry.real)
    if fd is None:
        return None
    with open(fd, "rb") as handle:
        return handle.read(entry.size).decode("utf-8", errors="replace")


def _is_text(path: Path, root: Path, probe: int = 4096) -> bool:
    fd = _open_under(root, path)
    if fd is None:
        return False
    try:
        with open(fd, "rb") as handle:
            head = handle.read(probe)
    except OSError:
        return False
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4  # a multi-byte character cut by the probe
    return True


def default_roots_env(vcm: VcmSettings, cwd: Path | None = None) -> dict[str, str]:
    """The environment that carries the allowed roots to a daemon started from here (`colony up`):
    the configured ones, or else the folder it was started in, so a newcomer can map the code they
    are in, and nothing else, without configuring anything."""
    roots = [str(root) for root in vcm.allowed_roots] or [str((cwd or Path.cwd()).resolve())]
    return {"COLONY_VCM__ALLOWED_ROOTS": json.dumps(roots)}
