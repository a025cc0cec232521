"""Facts about a page's code, extracted without a model: what an `analyze` section starts from.

A small model asked to "summarise this code" describes whatever program it finds likely, not the
one it read. So each section is built from facts taken from the text itself: per file (or part of a
split file) its line count, the module docstring's first line, its leading comments, its
definitions with their signatures (and their docstrings' first lines), and which of the other
mapped files it imports. Python is read with `ast` when the piece parses (a whole file nearly
always does); anything else (other languages, a file split mid-definition) with line patterns.
The model is then asked to summarise these facts, and what it says is checked against them
(`colony.system.analyze_check`); when it cannot be trusted, `extractive_summary` says the same
from the facts alone.

Page text is untrusted and may be hostile: every line pattern below runs on at most MAX_LINE
characters of a line with quantifiers that cannot backtrack into one another (so its time is
linear in the page), `ast` failing in any way (a MemoryError on a deeply nested expression
included) falls back to the line patterns for that piece, and every text a fact carries is
`clean` (no terminal escapes, bidi overrides or zero-width characters reach a report).

A page's text is what `colony.vcm.pages.PageSource` wrote: pieces `### {path} (lines a-b)` then
the lines, joined by blank lines; the page record's spans say where each piece is, so a line of a
file that happens to look like a header is never taken for one.
"""

from __future__ import annotations

import ast
import posixpath
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEFINITIONS = 24  # per file piece: a prompt stays small, an outline stays readable
MAX_SIGNATURE = 100  # characters of one signature
MAX_DOC = 160  # characters of one docstring line or comment
MAX_COMMENTS = 3  # leading comment lines kept
MAX_LINE = 2000  # characters of one line the line patterns read (a longer line is cut)

# a definition line in any common language (the fallback where `ast` cannot read the piece)
DEFINITION = re.compile(
    r"^(?P<indent>\s*)(?:export\s+)?(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:static\s+)?"
    r"(?P<kind>async\s+def|def|class|function|fn|func|interface|struct|enum|trait|type)\s+"
    r"(?P<name>[A-Za-z_]\w*)(?P<rest>.*)$"
)
# possessive quantifiers (`*+`, `++`): no backtracking, so hostile lines cost linear time
_JS_IMPORT = re.compile(r"""^\s*+(?P<kw>import|export)\b(?P<mid>[^'"]*+)['"](?P<module>[^'"]++)['"]""")
_JS_REQUIRE = re.compile(r"""\brequire\(\s*+['"]([^'"]++)['"]\s*+\)""")
_C_INCLUDE = re.compile(r'^\s*+#\s*+include\s++"([^"]++)"')
_PY_IMPORT = re.compile(r"^\s*+(?:from\s++(\.*+[\w.]*+)\s++import\s++([\w., ()*]++)|import\s++([\w., ]++))")
_COMMENT = re.compile(r"^\s*+(?:#(?!!)|//|--|;)\s?(.*)$")
# characters a terminal or an editor acts on rather than shows: controls, bidi overrides, zero-width
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def clean(text: str) -> str:
    """`text` without C0/C1 control characters, Unicode format characters (bidi overrides,
    zero-width) and line/paragraph separators: whitespace among them becomes a space, the rest
    is dropped. Facts are copied into headings, summaries and the overview shown on a terminal,
    so a file name or docstring of a hostile page must not carry escape sequences there."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        (" " if ch.isspace() else "") if unicodedata.category(ch) in _HIDDEN_CATEGORIES else ch for ch in text
    )


@dataclass
class FileFacts:
    """What one file (or one part of a split file) of a page shows."""

    path: str
    start_line: int
    end_line: int
    doc: str = ""  # first line of the module docstring (or of the leading comment)
    comments: list[str] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)  # signatures, e.g. "def f(a, b)"
    names: list[str] = field(default_factory=list)  # the top-level defined names, in order
    imports: list[str] = field(default_factory=list)  # other mapped files this one imports
    parsed: bool = False  # read with `ast` (else line patterns)

    @property
    def lines(self) -> int:
        return self.end_line - self.start_line + 1

    @property
    def span(self) -> str:
        return f"{self.path}:{self.start_line}-{self.end_line}"

    def cleaned(self) -> FileFacts:
        """These facts with every text field `clean` (the path included: it is shown)."""
        self.path = clean(self.path)
        self.doc = clean(self.doc)
        self.comments = [clean(c) for c in self.comments]
        self.definitions = [clean(d) for d in self.definitions]
        self.names = [clean(n) for n in self.names]
        self.imports = [clean(i) for i in self.imports]
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "span": self.span,
            "lines": self.lines,
            "doc": self.doc,
            "comments": self.comments,
            "definitions": self.definitions,
            "names": self.names,
            "imports": self.imports,
        }


def split_page(text: str, spans: Sequence[Any]) -> list[tuple[Any, str]]:
    """(span, lines of that piece) for each span of a page record, found by their headers in order.
    A span whose header is missing (a page text not cut by PageSource) gets no lines."""
    pieces: list[tuple[Any, str]] = []
    lines = text.splitlines()
    cursor = 0
    for span in spans:
        header = f"### {span.path} (lines {span.start_line}-{span.end_line})"
        try:
            at = lines.index(header, cursor)
        except ValueError:
            pieces.append((span, ""))
            continue
        count = max(0, span.end_line - span.start_line + 1)
        body = lines[at + 1 : at + 1 + count]
        pieces.append((span, "\n".join(body)))
        cursor = at + 1 + len(body)
    return pieces


def _first_line(text: str | None) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()[:MAX_DOC]
    return ""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_SIGNATURE else text[: MAX_SIGNATURE - 3] + "..."


def parseable_part(body: str, tries: int = 8) -> tuple[ast.Module, str, str] | None:
    """The longest run of whole top-level statements of a Python piece that `ast` reads, as
    (tree, the skipped head, the cut tail): a piece of a split file starts or ends inside a
    definition, which is skipped (the head up to the first line at column 0) or cut off (the tail
    from the last top-level line before the syntax error). None when nothing parses."""
    lines = body.splitlines()
    start = 0
    if lines and lines[0][:1].isspace():
        start = next((i for i, line in enumerate(lines) if line and not line[0].isspace()), len(lines))
        if start == len(lines):
            return None  # all of it inside one definition: line patterns read it
    end = len(lines)
    for _ in range(tries):
        try:
            tree = ast.parse("\n".join(lines[start:end]))
        except SyntaxError as exc:
            bad = start + max(0, (exc.lineno or 1) - 1)
            cut = max(
                (i for i in range(start, min(bad, end)) if lines[i] and not lines[i][0].isspace()),
                default=None,
            )
            if cut is None or cut == start:
                return None
            end = cut
            continue
        except Exception:  # MemoryError/RecursionError (deep nesting), ValueError (NUL bytes)...
            return None  # ...: line patterns read the piece
        return tree, "\n".join(lines[:start]), "\n".join(lines[end:])
    return None


def _python_facts(facts: FileFacts, body: str) -> list[tuple[int, str | None]]:
    """Fill `facts` from the part of a piece `ast` can read (line patterns for what it cannot);
    returns its imports as (level, module) pairs. SyntaxError when no part of it parses."""
    parsed = parseable_part(body)
    if parsed is None:
        raise SyntaxError(f"no part of {facts.path} parses")
    tree, head, tail = parsed
    imports: list[tuple[int, str | None]] = _pattern_facts(facts, head) if head else []
    if facts.start_line == 1 and not head:  # a module docstring only where the piece starts the file
        facts.doc = _first_line(ast.get_docstring(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imports.append((node.level, node.module))
            imports.extend(
                (node.level, f"{node.module}.{a.name}" if node.module else a.name) for a in node.names
            )
        elif isinstance(node, ast.Import):
            imports.extend((0, a.name) for a in node.names)

    def add(node: ast.AST, prefix: str = "") -> None:
        if len(facts.definitions) >= MAX_DEFINITIONS:
            return
        if isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            signature = f"class {prefix}{node.name}" + (f"({bases})" if bases else "")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            signature = f"{kind} {prefix}{node.name}({ast.unparse(node.args)}){returns}"
        else:
            return
        doc = _first_line(ast.get_docstring(node))
        facts.definitions.append(_short(signature) + (f": {doc}" if doc else ""))
        if not prefix:  # the outline: top-level names (members show in `definitions`)
            facts.names.append(node.name)
        if isinstance(node, ast.ClassDef) and not prefix:
            for child in node.body:
                add(child, f"{node.name}.")

    for node in tree.body:
        add(node)
    facts.parsed = True
    if tail:  # definitions past the cut (a split file's last, unfinished one among them)
        imports.extend(_pattern_facts(facts, tail))
    return imports


def _pattern_facts(facts: FileFacts, body: str) -> list[tuple[int, str | None]]:
    """Fill `facts` with line patterns (any language, or Python `ast` could not read)."""
    imports: list[tuple[int, str | None]] = []
    for whole in body.splitlines():
        line = whole[:MAX_LINE]
        match = DEFINITION.match(line)
        if match and len(facts.definitions) < MAX_DEFINITIONS and len(match.group("indent")) <= 4:
            kind = " ".join(match.group("kind").split())
            rest = match.group("rest").strip().removesuffix("{").strip().removesuffix(":")
            facts.definitions.append(_short(f"{kind} {match.group('name')}{rest}"))
            if match.group("name") not in facts.names:
                facts.names.append(match.group("name"))
        py = _PY_IMPORT.match(line)
        if py:
            if py.group(1) is not None:
                dots = len(py.group(1)) - len(py.group(1).lstrip("."))
                module = py.group(1).lstrip(".") or None
                imports.append((dots, module))
                for name in re.findall(r"\w+", py.group(2)):
                    imports.append((dots, f"{module}.{name}" if module else name))
            else:
                imports.extend((0, m.strip()) for m in py.group(3).split(",") if m.strip())
        js = _JS_IMPORT.match(line)
        if js and (js.group("mid").rstrip().endswith("from") or js.group("mid").strip() == ""):
            imports.append((-1, js.group("module")))  # `import x from './x'`, `import './x'`
        imports.extend((-1, module) for module in _JS_REQUIRE.findall(line))
        include = _C_INCLUDE.match(line)
        if include:
            imports.append((-1, include.group(1)))
    return imports


def _leading_comments(body: str) -> list[str]:
    """The comment lines at the top of the piece (a shebang and blank lines skipped)."""
    found: list[str] = []
    for whole in body.splitlines():
        line = whole[:MAX_LINE]
        if not line.strip() or line.startswith("#!"):
            if found:
                break
            continue
        match = _COMMENT.match(line)
        if match is None:
            break
        if match.group(1).strip():
            found.append(match.group(1).strip()[:MAX_DOC])
        if len(found) >= MAX_COMMENTS:
            break
    return found


def resolve_import(
    importer: str, level: int, module: str | None, mapped: set[str], root_parts: Sequence[str]
) -> str | None:
    """The mapped file an import names, or None (a library, or a file outside the mapped folder).

    `level` > 0: a Python relative import (dots), resolved from the importer's folder. 0: an
    absolute Python module, matched against each mapped file's dotted name under the mapped
    folder's own path (so `colony.vcm.pages` finds `pages.py` when `colony/vcm` was mapped, and
    `models` of another package does not). -1: a path (JS/TS import, C include) relative to the
    importer."""
    if not module and level <= 0:
        return None
    folder = posixpath.dirname(importer)
    if level == -1:
        assert module is not None
        if not module.startswith("."):
            candidates = [module]
        else:
            base = posixpath.normpath(posixpath.join(folder, module))
            candidates = [base] + [base + ext for ext in (".ts", ".tsx", ".js", ".jsx", ".mjs")]
            candidates += [posixpath.join(base, "index" + ext) for ext in (".ts", ".js")]
        if not module.startswith("."):
            candidates.append(posixpath.normpath(posixpath.join(folder, module)))
        return next((c for c in candidates if c in mapped), None)
    parts = module.split(".") if module else []
    if level > 0:
        base = folder.split("/") if folder else []
        up = level - 1
        if up > len(base):
            return None
        base = base[: len(base) - up] if up else base
        relative = "/".join([*base, *parts])
        for candidate in (f"{relative}.py", f"{relative}/__init__.py"):
            if candidate.lstrip("/") in mapped:
                return candidate.lstrip("/")
        return None
    for path in mapped:
        if not path.endswith(".py"):
            continue
        stem = path[: -len(".py")].split("/")
        if stem[-1] == "__init__":
            stem = stem[:-1]
        if _dotted_match([*root_parts, *stem], parts):
            return path
    return None


def _dotted_match(full: list[str], parts: list[str]) -> bool:
    """Whether `parts` (an import's module path) is the tail of `full` (a file's dotted name)."""
    return len(parts) <= len(full) and full[len(full) - len(parts) :] == parts


def extract_facts(
    text: str, spans: Sequence[Any], *, mapped_files: Iterable[str] = (), root: str | None = None
) -> list[FileFacts]:
    """Facts of every piece of a page (`spans`: the page record's `files`). `mapped_files`: every
    file of the mapped folder (imports are resolved against them); `root`: the folder's path."""
    mapped = set(mapped_files)
    root_parts = [p for p in (root or "").replace("\\", "/").split("/") if p]
    result: list[FileFacts] = []
    for span, body in split_page(text, spans):
        facts = FileFacts(path=span.path, start_line=span.start_line, end_line=span.end_line)
        imports: list[tuple[int, str | None]]
        try:
            if not span.path.endswith((".py", ".pyi")):
                raise SyntaxError("not Python")
            imports = _python_facts(facts, body)
        except Exception:  # whatever `ast` raised on a hostile piece: line patterns read it
            facts.definitions, facts.names, facts.doc, facts.parsed = [], [], "", False
            imports = _pattern_facts(facts, body)
        facts.comments = _leading_comments(body)
        if not facts.doc and facts.start_line == 1 and facts.comments:
            facts.doc = facts.comments[0]
        if not facts.doc and span.path.endswith((".md", ".rst", ".txt")):
            facts.doc = next(
                (line.strip("# ").strip()[:MAX_DOC] for line in body.splitlines() if line.strip()), ""
            )
        for level, module in imports:
            found = resolve_import(span.path, level, module, mapped, root_parts)
            if found is not None and found != span.path and found not in facts.imports:
                facts.imports.append(found)
        result.append(facts.cleaned())
    return result


def facts_text(facts: Sequence[FileFacts]) -> str:
    """The facts as the plain text the model is asked to summarise (and that its summary is
    checked against)."""
    out: list[str] = []
    for f in facts:
        out.append(f"File {f.path} (lines {f.start_line}-{f.end_line}, {f.lines} lines)")
        if f.doc:
            out.append(f"  Purpose: {f.doc}")
        out.extend(f"  Comment: {c}" for c in f.comments if c != f.doc)
        out.extend(f"  Defines: {d}" for d in f.definitions)
        if f.imports:
            out.append(f"  Imports the mapped files: {', '.join(f.imports)}")
    return "\n".join(out)


def extractive_summary(facts: Sequence[FileFacts], limit: int = 6) -> str:
    """A summary said with the facts' own words (no model): per file its purpose line and its main
    definitions. (The mapped files it imports are on the section's own `Imports:` line: their
    names are facts, not words of the page.)"""
    sentences: list[str] = []
    for f in facts:
        head = (
            f"{f.path} ({f.lines} lines)"
            if f.start_line == 1
            else f"{f.path} lines {f.start_line}-{f.end_line}"
        )
        if not (f.doc or f.names or f.comments) and f.start_line > 1:
            head = (
                f"{f.path} lines {f.start_line}-{f.end_line} "
                "(continued from the part before; no definition begins here)"
            )
        parts = [f"{head}: {f.doc.rstrip('.')}" if f.doc else head]
        top = f.names[:limit]
        if top:
            more = len(f.names) - len(top)
            parts.append("defines " + ", ".join(top) + (f" and {more} more" if more > 0 else ""))
        sentences.append("; ".join(parts) + ".")
    return " ".join(sentences)


def import_graph(files: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """{file: mapped files it imports} from sections' per-file facts (`FileFacts.to_dict`), the
    parts of a split file merged."""
    graph: dict[str, list[str]] = {}
    for f in files:
        targets = graph.setdefault(str(f.get("path")), [])
        for target in f.get("imports") or []:
            if isinstance(target, str) and target not in targets:
                targets.append(target)
    return graph


def overview_paragraph(files: Iterable[dict[str, Any]]) -> str:
    """The overview's deterministic part: each file's role (its purpose line) and the imports
    between the mapped files, from the sections' facts only."""
    facts = list(files)
    roles: dict[str, str] = {}
    for f in facts:
        path, doc = str(f.get("path")), str(f.get("doc") or "")
        if doc and path not in roles:
            roles[path] = doc.rstrip(".")
    graph = import_graph(facts)
    out: list[str] = []
    if roles:
        out.append(
            "Roles, from the files' own docstrings and comments: "
            + "; ".join(f"{p}: {d}" for p, d in roles.items())
            + "."
        )
    undocumented = sorted(set(graph) - set(roles))
    if undocumented:
        out.append(f"Without a docstring or leading comment: {', '.join(undocumented)}.")
    edges = {p: t for p, t in graph.items() if t}
    if edges:
        used: dict[str, int] = {}
        for targets in edges.values():
            for t in targets:
                used[t] = used.get(t, 0) + 1
        out.append(
            "Imports between the files: "
            + "; ".join(f"{p} imports {', '.join(t)}" for p, t in edges.items())
            + "."
        )
        most = max(used.items(), key=lambda item: (item[1], item[0]))
        if most[1] > 1:
            out.append(f"The most imported file is {most[0]} ({most[1]} importers).")
    elif graph:
        out.append("The files do not import one another.")
    return " ".join(out)
