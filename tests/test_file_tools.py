"""File tools over mapped folders (issue 37, deliverable 2), on a real redis-server: a folder mapped
into pages is read back file by file exactly as it is on disk; agents list files, read windows of
lines, search (literal, or a checked regular expression) and find definitions, each answer citing
path and line; hostile patterns, paths and sources are refused. The standard library's `email`
package (code the project did not write) is mapped and searched as a user's folder would be."""

from __future__ import annotations

import email
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import assert_failed

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.context.code_index import CodeIndex
from colony.context.file_tools import FileToolsCapability
from colony.errors import InvalidArgument
from colony.vcm import PageSource, PageTable, mapped_files
from colony.vcm.mapped_files import MappedFiles, compile_pattern

CODE = {
    "pkg/core.py": "import os\n\n\nclass Parser:\n    def parse(self, text):\n"
    "        return text.split()\n\n\nasync def fetch(url):\n    return url\n\nLIMIT = 10\nLIMIT == 3\n",
    "web/app.js": "export function render(node) {\n  return node;\n}\nconst store = {};\n",
    "go/main.go": "package main\n\nfunc (s *Server) Serve() error {\n\treturn nil\n}\n",
    "rs/lib.rs": "pub fn serve() {}\npub(crate) struct Server;\n",
    "empty.txt": "",
    "notes.md": "# Notes\n\nThe parser splits on whitespace.\n",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name, text in CODE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    long = "".join(f"line {n} of a long file with some words in it\n" for n in range(1, 401))
    (root / "big.txt").write_text(long)
    return root


def read_tree(folder: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(folder)): p.read_text().splitlines() for p in folder.rglob("*") if p.is_file()}


class Kit:
    def __init__(self, bb: Blackboard, tmp_path: Path) -> None:
        self.colony_id = f"f{uuid.uuid4().hex[:10]}"
        self.settings = ColonySettings(data_dir=tmp_path, colony_id=self.colony_id)
        self.table = PageTable(bb, settings=self.settings)
        self.runtime = LocalAgentRuntime(
            bb, colony_id=self.colony_id, settings=self.settings, pages=self.table
        )

    async def map(self, root: Path, allowed: Path, page_tokens: int = 128) -> str:
        source = PageSource(root, allowed_roots=[allowed], page_tokens=page_tokens)
        return (await self.table.map_source(source)).source_id

    async def agent(self, agent_id: str, **options: Any) -> Agent:
        capability = FileToolsCapability.bind(**options)
        return await self.runtime.spawn(
            AgentBlueprint(
                agent_class=Agent, metadata=AgentMetadata(agent_id=agent_id), capabilities=[capability]
            )
        )


@pytest.fixture
async def kit(bb: Blackboard, tmp_path: Path) -> AsyncIterator[Kit]:
    made = Kit(bb, tmp_path)
    yield made
    await made.runtime.shutdown()


async def test_a_mapped_folder_reads_back_file_by_file_as_on_disk(kit: Kit, folder: Path) -> None:
    source_id = await kit.map(folder, folder.parent)  # small pages: big.txt spans many
    files = await MappedFiles.load(kit.table, source_id)
    record = await kit.table.source(source_id)
    assert record is not None and len(record.page_ids) > 5
    on_disk = read_tree(folder)
    on_disk["empty.txt"] = [""]  # an empty file is one empty line, as its page shows it
    assert files.files == on_disk and files.missing_pages == []
    window = files.window("big.txt", 399, 10)
    assert window["start"] == 399 and window["end"] == 400 and window["total_lines"] == 400
    assert window["lines"] == [
        {"line": 399, "text": "line 399 of a long file with some words in it"},
        {"line": 400, "text": "line 400 of a long file with some words in it"},
    ]
    assert len(files.window("big.txt", 1, 10_000)["lines"]) == 200  # at most MAX_WINDOW
    with pytest.raises(InvalidArgument, match="has 400 lines; start at line 400 or before"):
        files.window("big.txt", 401, 10)  # found by review: an empty window said nothing
    with pytest.raises(InvalidArgument, match=r"did you mean pkg/core\.py"):
        files.lines("core.py")
    # a page gone (retention) leaves its lines out, numbering kept
    middle = record.page_ids[len(record.page_ids) // 2]
    await kit.table.board.delete("content:" + middle)
    partial = await MappedFiles.load(kit.table, source_id)
    assert partial.missing_pages == [middle] and len(partial.files["big.txt"]) == 400


async def test_search_is_literal_or_a_checked_regex_and_cites_lines(
    kit: Kit, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = await MappedFiles.load(kit.table, await kit.map(folder, folder.parent))
    found = files.search("PARSER")["results"]
    assert {(r["path"], r["line"]) for r in found} == {("pkg/core.py", 4), ("notes.md", 3)}
    assert files.search("(")["results"][0] == {
        "path": "go/main.go",
        "line": 3,
        "text": "func (s *Server) Serve() error {",
    }
    assert [
        r["line"]
        for r in files.search(r"^line 1\d\d of", regex=True, path_glob="*.txt", max_results=500)["results"]
    ] == list(range(100, 200))[:100]
    assert files.search("line", max_results=5) == {
        "results": files.search("line", max_results=5)["results"],
        "truncated": True,
    }
    for pattern, why in (
        ("(a+)+$", "repeat inside a repeat"),
        ("(x*y)*", "repeat inside a repeat"),
        ("(a|ab)+c", "alternatives inside a repeat"),
        (r"(\w)\1", "backreferences"),
        (r".*a.*b.*c", "3 repeats of variable length"),
        ("a{0,300}a{0,300}a{0,300}b", "3 repeats of variable length"),  # bounded ones count too
        (".*a?a?a?a?b", "1 repeats of variable length .* and 4 optional parts"),
        ("(?:a|.)" * 21 + "c", "21 optional parts"),  # found by review: seconds a line, never counted
        (r".*\w+(?:get|set|put|del|add)x", "3 optional parts"),
        ("[unclosed", "not a regular expression"),
        ("a" * 201, "1-200 characters"),
    ):
        with pytest.raises(InvalidArgument, match=why):
            compile_pattern(pattern, regex=True)
    # the worst allowed shapes over long lines: each line costs milliseconds, the budget stops it all
    hostile = MappedFiles(files.source, {"x.txt": ["a" * 5000] * 2000})
    monkeypatch.setattr(mapped_files, "SEARCH_SECONDS", 0.5)  # (the budget is 2 s; a test waits less)
    assert compile_pattern(r"def (get|set|load|dump)_\w+\(", regex=True)("    def load_json(")
    worst_shapes = (
        r"(.*)(.*)a?a?x",
        r"a{0,300}a{0,300}a?a?x",
        r"(.*)(.*)(?:a|.)(?:a|.)x",
        r".*.*(?:a|.|\w|\S)x",
    )
    for worst in worst_shapes:
        started = time.monotonic()
        result = hostile.search(worst, regex=True)
        assert result == {"results": [], "truncated": True} and time.monotonic() - started < 1.0


async def test_definitions_across_languages(kit: Kit, folder: Path) -> None:
    files = await MappedFiles.load(kit.table, await kit.map(folder, folder.parent))

    def where(name: str) -> list[tuple[str, int]]:
        return [(r["path"], r["line"]) for r in files.definitions(name)]

    assert where("Parser") == [("pkg/core.py", 4)]
    assert where("Parser.parse") == [("pkg/core.py", 5)]
    assert where("fetch") == [("pkg/core.py", 9)]
    assert where("LIMIT") == [("pkg/core.py", 12)]  # not the comparison on line 13
    assert where("render") == [("web/app.js", 1)] and where("store") == [("web/app.js", 4)]
    assert where("Serve") == [("go/main.go", 3)]
    assert where("serve") == [("rs/lib.rs", 1)] and where("Server") == [("rs/lib.rs", 2)]
    assert where("missing") == []
    # linear in a line (found by review: `^\s*(...|\s)*` took ~11 ms a line of 1,000 spaces)
    spaced = {"w.java": [" " * 1000] * 600, "A.java": ["  public static final class Target {"]}
    started = time.monotonic()
    assert MappedFiles(files.source, spaced).definitions("Target") == [
        {"path": "A.java", "line": 1, "text": "  public static final class Target {"}
    ]
    assert time.monotonic() - started < 1.0  # 600 such lines took 6.6 s
    with pytest.raises(InvalidArgument, match="not an identifier"):
        files.definitions("a b")


async def test_agents_read_only_their_sources_and_never_the_disk(
    kit: Kit, folder: Path, tmp_path: Path
) -> None:
    source_id = await kit.map(folder, folder.parent)
    other = tmp_path / "other"
    other.mkdir()
    (other / "secret.txt").write_text("top secret\n")
    other_id = await kit.map(other, other)
    ada = await kit.agent("ada", sources=[source_id])
    dispatch = ada.dispatcher.dispatch
    listed = await dispatch("list_files", {"pattern": "*.py"})
    assert listed.success and listed.output["files"] == [{"path": "pkg/core.py", "lines": 13}]
    read = await dispatch("read_lines", {"path": "pkg/core.py", "start": 4, "count": 2})
    assert read.output["lines"] == [
        {"line": 4, "text": "class Parser:"},
        {"line": 5, "text": "    def parse(self, text):"},
    ]
    found = await dispatch("find_definition", {"name": "fetch"})
    assert found.output == [{"path": "pkg/core.py", "line": 9, "text": "async def fetch(url):"}]
    searched = await dispatch("search_files", {"pattern": "whitespace"})
    assert searched.output["results"] == [
        {"path": "notes.md", "line": 3, "text": "The parser splits on whitespace."}
    ]
    assert_failed(await dispatch("list_files", {"source": other_id}), "no mapped source")
    for path in ("../other/secret.txt", "/etc/passwd", str(other / "secret.txt")):
        assert_failed(await dispatch("read_lines", {"path": path}), "no file")
    assert_failed(
        await dispatch("search_files", {"pattern": "(a+)+", "regex": True}), "repeat inside a repeat"
    )
    # without `sources`, every mapped folder of the colony, named when there are several
    bob = await kit.agent("bob")
    assert_failed(await bob.dispatcher.dispatch("list_files", {}), "name the source")
    named = await bob.dispatcher.dispatch("list_files", {"source": "other"})
    assert named.success and named.output["files"] == [{"path": "secret.txt", "lines": 1}]


async def test_the_standard_librarys_email_package_is_searched_like_a_users_folder(kit: Kit) -> None:
    package = Path(email.__file__).parent
    source_id = await kit.map(package, package.parent, page_tokens=2048)
    ada = await kit.agent("ada", sources=[source_id])
    found = (await ada.dispatcher.dispatch("find_definition", {"name": "parseaddr"})).output
    assert found and all(hit["text"].startswith("def parseaddr(") for hit in found), found
    line = found[0]["line"]
    shown = (
        await ada.dispatcher.dispatch("read_lines", {"path": found[0]["path"], "start": line, "count": 1})
    ).output
    assert shown["lines"][0]["text"].startswith("def parseaddr(")
    assert (package / found[0]["path"]).read_text().splitlines()[line - 1] == shown["lines"][0]["text"]


async def test_line_numbers_are_the_editors_and_odd_names_come_back(kit: Kit, tmp_path: Path) -> None:
    root = tmp_path / "odd"
    root.mkdir()
    (root / "m.py").write_bytes(b"a = 1\x0cb = 2\rc = 3\r\ndef target():\n    pass\n")
    (root / "bom.py").write_bytes(b"\xef\xbb\xbfdef first():\n    pass\n")
    (root / "a\nb.txt").write_text("first\n")  # a line break in a file name
    (root / "z.txt").write_text("last\n")
    files = await MappedFiles.load(kit.table, await kit.map(root, root, page_tokens=4000))
    assert files.definitions("target") == [{"path": "m.py", "line": 2, "text": "def target():"}]
    assert files.files["m.py"][0] == "a = 1\x0cb = 2\rc = 3"  # as `grep -n` counts: one line
    # the code index cites the same lines (found by review: it counted the lone \r as a break),
    # and a file starting with a BOM keeps its first definition, in both
    cited = {d.name: (d.path, d.line) for d in CodeIndex(files.files).definitions}
    assert cited["target"] == ("m.py", 2) and cited["first"] == ("bom.py", 1), cited
    assert [(r["path"], r["line"]) for r in files.definitions("first")] == [("bom.py", 1)]
    assert files.files["a\nb.txt"] == ["first"] and files.files["z.txt"] == ["last"]
    assert files.missing_pages == []


async def test_two_mapped_folders_of_one_name_are_named_by_id(kit: Kit, tmp_path: Path) -> None:
    ids = []
    for parent in ("one", "two"):
        folder = tmp_path / parent / "src"
        folder.mkdir(parents=True)
        (folder / f"{parent}.txt").write_text(parent + "\n")
        ids.append(await kit.map(folder, tmp_path))
    bob = await kit.agent("bob")
    assert_failed(
        await bob.dispatcher.dispatch("list_files", {"source": "src"}), "2 mapped folders are named 'src'"
    )
    by_id = await bob.dispatcher.dispatch("list_files", {"source": ids[1]})
    assert by_id.output["files"] == [{"path": "two.txt", "lines": 1}]
