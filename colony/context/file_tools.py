"""File tools over mapped folders: an agent lists files, reads a window of lines, searches and finds
definitions, each answer citing path and line (colony.vcm.mapped_files).

Read only, and only what mapping admitted: the files are put back together from the source's pages
in Redis (mapping read them under `vcm.allowed_roots`), so an agent on any replica reads the same
text and no path an action names reaches the disk. The sources an agent may read are the ones its
blueprint names (`sources`), or, without that, every folder mapped in its colony; a source the model
names is looked up among them. Paths in answers are relative to the mapped folder.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents.actions import action_executor
from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.models import ActionType
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.errors import AgentUsageError
from colony.vcm import PageTable
from colony.vcm.mapped_files import MAX_RESULTS, MAX_WINDOW, MappedFiles

if TYPE_CHECKING:
    from colony.agents.base import Agent

CACHED_SOURCES = 2  # sources an agent keeps loaded ...
CACHED_CHARS = 16_000_000  # ... each at most this much text
MAX_LISTED = 500
SourceRef = Annotated[str, Field(max_length=200)]
PathRef = Annotated[str, Field(min_length=1, max_length=1000)]


class FileToolsCapability(AgentCapability):
    """`list_files`, `read_lines`, `search_files`, `find_definition` over mapped folders.

    `sources`: source ids (`src-...`) the agent may read; None: every mapped folder of its colony.
    A source's files are loaded from its pages once and kept (the newest CACHED_SOURCES, each at
    most CACHED_CHARS of text), again when the folder is mapped anew."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        sources: list[str] | None = None,
        pages: PageTable | None = None,
        settings: ColonySettings | None = None,
        capability_key: str = "files",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.sources = list(sources) if sources is not None else None
        self.pages = pages
        self.settings = settings
        self._loaded: OrderedDict[tuple[str, float], MappedFiles] = OrderedDict()

    def _table(self) -> PageTable:
        if self.pages is None:
            settings = self.settings or agent_settings(self)
            self.pages = PageTable(self.blackboard, settings=settings)
        return self.pages

    async def _allowed(self) -> dict[str, Any]:
        """The sources this agent may read, by id (their records)."""
        records = {r.source_id: r for r in await self._table().sources()}
        if self.sources is not None:
            records = {k: v for k, v in records.items() if k in self.sources}
        return records

    async def _files(self, source: str | None) -> MappedFiles:
        records = await self._allowed()
        if not records:
            raise AgentUsageError("no mapped folder to read (map one first: `colony run analyze --map PATH`)")
        if source is None:
            if len(records) > 1:
                raise AgentUsageError(f"name the source; mapped: {', '.join(sorted(records))}")
            record = next(iter(records.values()))
        else:
            named = [r for r in records.values() if PurePosixPath(r.path).name == source]
            if source not in records and len(named) > 1:
                ids = ", ".join(sorted(r.source_id for r in named))
                raise AgentUsageError(
                    f"{len(named)} mapped folders are named {source[:80]!r}; name one by id: {ids}"
                )
            record = records.get(source) or (named[0] if named else None)
            if record is None:
                raise AgentUsageError(
                    f"no mapped source {source[:80]!r} here; mapped: {', '.join(sorted(records))}"
                )
        key = (record.source_id, record.mapped_at)
        files = self._loaded.get(key)
        if files is None:
            files = await MappedFiles.load(self._table(), record.source_id)
            if files.chars() <= CACHED_CHARS:  # a bigger folder is read again at each call instead
                self._loaded[key] = files
                while len(self._loaded) > CACHED_SOURCES:
                    self._loaded.popitem(last=False)
        if key in self._loaded:
            self._loaded.move_to_end(key)
        return files

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def list_files(
        self,
        pattern: Annotated[str, Field(max_length=200)] | None = None,
        source: SourceRef | None = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LISTED)] = 200,
    ) -> dict[str, Any]:
        """The files of a mapped folder (paths relative to it, with their line counts); `pattern`: a
        glob such as `*.py` or `email/*`."""
        files = await self._files(source)
        names = files.paths(pattern)
        shown = [{"path": n, "lines": len(files.files[n])} for n in names[:limit]]
        return {
            "source": files.source.source_id,
            "files": shown,
            "total": len(names),
            "truncated": len(names) > limit,
        }

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def read_lines(
        self,
        path: PathRef,
        start: Annotated[int, Field(ge=1, le=10_000_000)] = 1,
        count: Annotated[int, Field(ge=1, le=MAX_WINDOW)] = 60,
        source: SourceRef | None = None,
    ) -> dict[str, Any]:
        """Lines `start` to `start + count - 1` of a file, each with its line number."""
        return (await self._files(source)).window(path, start, count)

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def search_files(
        self,
        pattern: Annotated[str, Field(min_length=1, max_length=200)],
        regex: bool = False,
        path_glob: Annotated[str, Field(max_length=200)] | None = None,
        max_results: Annotated[int, Field(ge=1, le=MAX_RESULTS)] = 30,
        source: SourceRef | None = None,
    ) -> dict[str, Any]:
        """Lines that contain `pattern` (case-insensitive text; `regex`: a regular expression
        without nested repeats), with path and line number, in files matching `path_glob`."""
        files = await self._files(source)
        return await asyncio.to_thread(
            files.search, pattern, regex=regex, path_glob=path_glob, max_results=max_results
        )

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def find_definition(
        self,
        name: Annotated[str, Field(min_length=1, max_length=200)],
        source: SourceRef | None = None,
    ) -> list[dict[str, Any]]:
        """Where a function, class, method or constant named `name` is defined (path and line)."""
        files = await self._files(source)
        return await asyncio.to_thread(files.definitions, name)
