"""Page sources: a folder or git checkout cut into pages of at most N tokens.

Pages are cut on file boundaries (several small files share a page; a large file is split on line
boundaries), binary and ignored files are skipped, and a page's id is the hash of its content, so
mapping the same tree twice gives the same pages.
"""

from __future__ import annotations

import fnmatch
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from colony.errors import InvalidArgument
from colony.inference.models import Page

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


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 4 characters a token) used to size pages."""
    return max(1, (len(text) + 3) // 4)


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


class PageSource:
    """A folder (or a git checkout: tracked files only) as pages of at most `page_tokens` tokens."""

    def __init__(
        self,
        path: str | Path,
        *,
        page_tokens: int = 2048,
        ignore: tuple[str, ...] = DEFAULT_IGNORES,
        count_tokens: Callable[[str], int] = estimate_tokens,
    ) -> None:
        self.root = Path(path).expanduser().resolve()
        if not self.root.is_dir():
            raise InvalidArgument(f"page source {self.root} is not a directory")
        if page_tokens < 64:
            raise InvalidArgument(f"page_tokens must be at least 64, got {page_tokens}")
        self.page_tokens = page_tokens
        self.ignore = ignore
        self.count_tokens = count_tokens
        self.source_id = "src-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    def files(self) -> list[Path]:
        """Text files to map, in a stable order."""
        tracked = self._git_files()
        candidates = tracked if tracked is not None else [p for p in self.root.rglob("*") if p.is_file()]
        return sorted(p for p in candidates if not self._ignored(p) and _is_text(p))

    def _git_files(self) -> list[Path] | None:
        if not (self.root / ".git").exists():
            return None
        try:
            listed = subprocess.run(
                ["git", "-C", str(self.root), "ls-files", "-z"], capture_output=True, check=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return [
            self.root / name for name in listed.decode().split("\0") if name and (self.root / name).is_file()
        ]

    def _ignored(self, path: Path) -> bool:
        parts = path.relative_to(self.root).parts
        return any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in self.ignore)

    def pages(self) -> Iterator[tuple[PageInfo, Page]]:
        """(description, page) pairs, in file order."""
        chunk: list[tuple[FileSpan, str]] = []
        used = 0
        for path in self.files():
            relative = str(path.relative_to(self.root))
            for span, text in self._pieces(relative, path.read_text(errors="replace")):
                tokens = self.count_tokens(text) + 1  # + the separator between pieces
                if chunk and used + tokens > self.page_tokens:
                    yield self._page(chunk)
                    chunk, used = [], 0
                chunk.append((span, text))
                used += tokens
        if chunk:
            yield self._page(chunk)

    def _pieces(self, relative: str, content: str) -> Iterator[tuple[FileSpan, str]]:
        """The file whole, or split on line boundaries into pieces that each fit a page."""
        lines = content.splitlines()
        start, piece = 0, []
        budget = self.page_tokens - 32  # room for the header
        for number, line in enumerate(lines):
            piece.append(line)
            if self.count_tokens("\n".join(piece)) > budget and len(piece) > 1:
                piece.pop()
                yield self._piece(relative, start, number - 1, piece)
                start, piece = number, [line]
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


def _is_text(path: Path, probe: int = 4096) -> bool:
    try:
        with open(path, "rb") as handle:
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
