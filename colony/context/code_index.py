"""A lexical index of the definitions in a mapped folder: where in the code a question is answered.

Every function, class, method and module constant becomes one small document: its name (split at
`_` and case changes), the class it belongs to, its docstring, its parameters, the names and words
its body uses, and its file's name. A question is scored against them with BM25 over weighted
fields; a question word also matches a name that contains it (`date` in `parsedate`), since
identifiers run words together. Python files are read with `ast`; other files (or Python that does
not parse) by their definition lines only.

Given an embedder (the memory's packaged MiniLM: colony.system.research_worker.definition_embedder),
the index also reads each definition's gist (its kind, its name's words and its docstring's first
line) as a vector, and a question's score is (1 - VECTOR_WEIGHT) x its BM25 (the best = 1) +
VECTOR_WEIGHT x the cosine of question and gist; the VECTOR_POOL definitions nearest the question
are scored beside those sharing a word with it, so a question in other words than the code's can
still find it. Without an embedder the index ranks by words alone.

The index knows nothing of the questions it will be asked: its weights were set on a development
set of questions over other packages (the first 30 of benchmarks/research_questions/dev.json),
never on the test set (docs/research.md).
"""

from __future__ import annotations

import ast
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

MAX_DOC_CHARS = 800  # of a docstring indexed
MAX_BODY_WORDS = 200  # words of a body indexed
MAX_DEFINITIONS = 50_000  # of one folder indexed (a bigger folder's rest is not indexed)
MAX_FILE_CHARS = 2_000_000  # a file longer than this is indexed by its definition lines only
MAX_BLOCK_DEPTH = 16  # nested `if`/`try`/`with` blocks read by `ast` (deeper: the file by its lines)
MAX_TERMS = 64  # distinct words of a question scored (a longer question's rest is not)
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z][a-z0-9]*|[0-9]+")  # HTTPSConnection: HTTPS, Connection
DEFINITION_LINE = re.compile(
    r"^\ufeff?\s*(?:(?:async\s+)?def|class|(?:export\s+)?(?:async\s+)?function|func|fn|struct|interface)\s+"
    r"([A-Za-z_][A-Za-z0-9_]{0,127})"
)
# words that say nothing about what a piece of code does
STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "without",
        "you",
        "your",
        "code",
        "function",
        "functions",
        "class",
        "classes",
        "method",
        "methods",
        "module",
        "python",
        "package",
        "file",
        "files",
        "defined",
        "define",
        "defines",
        "implemented",
        "implement",
        "implements",
        "used",
        "use",
        "uses",
        "using",
        "handle",
        "handles",
        "handled",
        "handling",
        "find",
        "self",
        "cls",
        "def",
        "return",
        "returns",
        "none",
        "true",
        "false",
        "get",
        "set",
        "value",
        "values",
        "object",
        "objects",
        "one",
        "given",
        "called",
        "call",
        "calls",
        "thing",
        "things",
        "part",
        "parts",
        "actually",
    ]
)
FIELDS = {"name": 3.0, "owner": 1.0, "doc": 2.0, "params": 0.5, "body": 0.8, "path": 0.8}
K1, B = 1.2, 0.75
PUBLIC_BONUS = 1.1  # a public name is likelier the answer than a private helper of the same words
# The cosine's share of a score beside BM25, set on the development set (75 questions: 39 right
# at 0.4, 36 by words alone; 0.3 and 0.5 gave 38). MAX_EMBEDDED bounds the embedding work of
# building a folder's index (~250-400 definitions/s on one core); a definition past it is
# embedded when a question's words reach it (LATE_PER_SEARCH at most a search, the best by BM25
# first, kept for the next), so a late file is not ranked below an early one for want of a vector.
VECTOR_WEIGHT = 0.4
VECTOR_POOL = 100  # definitions nearest the question scored beside those sharing a word with it
MAX_EMBEDDED = 10_000
LATE_PER_SEARCH = 200
MAX_QUESTION_CHARS = 2_000  # of a question embedded
Embed = Callable[[Sequence[str]], np.ndarray]  # texts -> unit-length rows


def stem(word: str) -> str:
    """A light suffix stripper (`parsing`, `parses`, `parsed` -> `pars`): question words meet the
    forms code uses."""
    for suffix in ("ations", "ation", "ings", "ing", "ers", "ies", "ied", "ed", "es", "er", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
    return word[:-1] if word.endswith("e") and len(word) > 4 else word  # parse: pars, as parsed


def words(text: str) -> list[str]:
    """The stemmed words of `text`: identifiers split at `_` and case changes, stop words left out."""
    out = []
    for token in WORD.findall(text):
        lowered = token.lower()
        if lowered not in STOP and len(lowered) > 1:
            out.append(stem(lowered))
    return out


@dataclass
class Definition:
    """One definition: where it is (path and 1-based line), what it is and its indexed words."""

    path: str
    line: int
    name: str  # qualified: `Class.method`
    kind: str  # "function", "class", "method", "constant", "definition"
    text: str  # its first line
    doc: str = ""  # its docstring's first line
    fields: dict[str, Counter[str]] = field(default_factory=dict)
    length: float = 0.0

    def cite(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "text": self.text.strip()[:400], "name": self.name}

    def gist(self) -> str:
        """What the embedder reads of it: its kind, its name's words and its docstring's first line."""
        return f"{self.kind} {' '.join(words(self.name.replace('.', ' ')))}: {self.doc}".strip()


@dataclass
class Scored:
    definition: Definition
    score: float


class CodeIndex:
    """Definitions of a folder's files, scored against a question (BM25 over weighted fields, and
    the cosine of question and gist when given an embedder)."""

    def __init__(self, files: dict[str, list[str]], embed: Embed | None = None) -> None:
        self.definitions: list[Definition] = []
        for path in sorted(files):
            if len(self.definitions) >= MAX_DEFINITIONS:
                break
            self.definitions.extend(definitions_of(path, files[path]))
        del self.definitions[MAX_DEFINITIONS:]
        for definition in self.definitions:
            definition.length = sum(
                FIELDS[name] * sum(counts.values()) for name, counts in definition.fields.items()
            )
        total = len(self.definitions) or 1
        self.average = sum(d.length for d in self.definitions) / total or 1.0
        frequency: Counter[str] = Counter()
        for definition in self.definitions:
            frequency.update({w for counts in definition.fields.values() for w in counts})
        self.idf = {w: math.log(1 + (total - n + 0.5) / (n + 0.5)) for w, n in frequency.items()}
        self.names = {w for d in self.definitions for w in d.fields.get("name", ())}
        self.total = total
        # word -> the definitions holding it (in any field; in their name): only those are scored
        self.postings: dict[str, list[int]] = {}
        self.named: dict[str, list[int]] = {}
        for number, definition in enumerate(self.definitions):
            for word in {w for counts in definition.fields.values() for w in counts}:
                self.postings.setdefault(word, []).append(number)
            for word in definition.fields.get("name", ()):
                self.named.setdefault(word, []).append(number)
        self.embed = embed
        self.vectors: np.ndarray | None = None
        self.late: dict[int, np.ndarray] = {}  # definitions past MAX_EMBEDDED, embedded on demand
        if embed is not None and self.definitions:
            gists = [d.gist() for d in self.definitions[:MAX_EMBEDDED]]
            self.vectors = _embedded(embed, gists, "the folder's definitions")

    def _idf(self, word: str) -> float:
        return self.idf.get(word, math.log(1 + (self.total + 0.5) / 0.5))

    def _name_matches(self, term: str) -> list[str]:
        """Name words a question word matches: itself, and names that contain it (4+ letters)."""
        if len(term) < 4:
            return [term] if term in self.names else []
        return [n for n in self.names if term in n]

    def search(self, question: str, *, limit: int = 20, paths: Iterable[str] | None = None) -> list[Scored]:
        """The definitions best matching `question`, best first (those of `paths` only, if given)."""
        within = set(paths) if paths is not None else None
        terms = list(dict.fromkeys(words(question)))[:MAX_TERMS]
        if not terms:  # nothing the question says to look for (only stop words)
            return []
        by_words = self._by_words(terms, within)
        scored = self._fused(question, within, by_words) if self.vectors is not None else None
        if scored is None:
            scored = [Scored(self.definitions[n], score) for n, score in by_words.items()]
        scored.sort(key=lambda s: (-s.score, s.definition.path, s.definition.line))
        return scored[:limit]

    def _fused(
        self, question: str, within: set[str] | None, by_words: dict[int, float]
    ) -> list[Scored] | None:
        """(1 - VECTOR_WEIGHT) x BM25 (the best = 1) + VECTOR_WEIGHT x cosine, over the definitions
        sharing a word with the question and the VECTOR_POOL nearest it; None when the question
        cannot be embedded (the caller ranks by words alone)."""
        assert self.vectors is not None and self.embed is not None
        asked = _embedded(self.embed, [question[:MAX_QUESTION_CHARS]], "the question", self.vectors.shape[1])
        if asked is None:
            return None
        cosines = self.vectors @ asked[0]
        if within is not None:
            allowed = np.array([d.path in within for d in self.definitions[: len(cosines)]], dtype=bool)
            cosines = np.where(allowed, cosines, -np.inf)
        pool = min(VECTOR_POOL, len(cosines))
        nearest = np.argpartition(-cosines, pool - 1)[:pool] if pool else []
        late = self._late_cosines(asked[0], by_words, len(cosines))
        top = max(by_words.values(), default=0.0) or 1.0
        scored = []
        for number in set(by_words) | {int(n) for n in nearest if np.isfinite(cosines[n])}:
            cosine = float(cosines[number]) if number < len(cosines) else late.get(number, 0.0)
            score = (1 - VECTOR_WEIGHT) * by_words.get(number, 0.0) / top + VECTOR_WEIGHT * cosine
            if score > 0 or number in by_words:  # a word match stays, however far in meaning
                scored.append(Scored(self.definitions[number], score))
        return scored

    def _late_cosines(self, asked: np.ndarray, by_words: dict[int, float], embedded: int) -> dict[int, float]:
        """Cosines of the word-matched definitions past MAX_EMBEDDED: the LATE_PER_SEARCH best by
        BM25 are embedded now if they were not before (and kept); any others count 0."""
        assert self.embed is not None
        late = sorted((n for n in by_words if n >= embedded), key=lambda n: -by_words[n])[:LATE_PER_SEARCH]
        missing = [n for n in late if n not in self.late]
        if missing:
            vectors = _embedded(
                self.embed, [self.definitions[n].gist() for n in missing], "late definitions", len(asked)
            )
            for number, vector in zip(missing, vectors if vectors is not None else [], strict=False):
                self.late[number] = vector
        return {n: float(self.late[n] @ asked) for n in late if n in self.late}

    def _by_words(self, terms: list[str], within: set[str] | None) -> dict[int, float]:
        """BM25 of the definitions holding one of the question's `terms` (or a name containing one)."""
        # per question word: the definitions whose name runs it into others (`date` in `parsedate`)
        inside: dict[str, set[int]] = {}
        holding: set[int] = set()
        for term in terms:
            inside[term] = {n for name in self._name_matches(term) for n in self.named.get(name, ())}
            holding.update(self.postings.get(term, ()))
            holding.update(inside[term])
        scored: dict[int, float] = {}
        for number in sorted(holding):
            definition = self.definitions[number]
            if within is not None and definition.path not in within:
                continue
            score = self._score(number, definition, terms, inside)
            if score > 0:
                scored[number] = score
        return scored

    def _score(
        self, number: int, definition: Definition, terms: list[str], inside: dict[str, set[int]]
    ) -> float:
        norm = K1 * (1 - B + B * definition.length / self.average)
        names = definition.fields.get("name", Counter())
        score = 0.0
        for term in terms:
            tf = 0.0
            for name, counts in definition.fields.items():
                tf += FIELDS[name] * counts.get(term, 0)
            if not names.get(term) and number in inside[term]:  # counted once
                tf += FIELDS["name"] * 0.7
            if tf:
                score += self._idf(term) * tf * (K1 + 1) / (tf + norm)
        if score and not definition.name.rsplit(".", 1)[-1].startswith("_"):
            score *= PUBLIC_BONUS
        return score

    def files(self, question: str, *, limit: int = 8) -> list[tuple[str, float, list[Definition]]]:
        """Files by how well their best definitions match: (path, score, its best definitions)."""
        best: dict[str, list[Scored]] = {}
        for hit in self.search(question, limit=200):
            best.setdefault(hit.definition.path, []).append(hit)
        ranked = [
            (path, hits[0].score + 0.25 * sum(h.score for h in hits[1:3]), [h.definition for h in hits[:3]])
            for path, hits in best.items()
        ]
        ranked.sort(key=lambda r: (-r[1], r[0]))
        return ranked[:limit]


def _embedded(embed: Embed, texts: list[str], what: str, width: int | None = None) -> np.ndarray | None:
    """`embed(texts)` checked: one finite row per text (of `width` columns, if given); None, logged,
    when the embedder fails or answers otherwise (the index then ranks by words alone)."""
    try:
        rows = np.asarray(embed(texts), dtype=np.float32)
    except Exception as exc:  # an aid to ranking: never the reason a search fails
        log.warning("code index: could not embed %s (%r); ranking by words alone", what, exc)
        return None
    if rows.ndim != 2 or len(rows) != len(texts) or (width is not None and rows.shape[1] != width):
        log.warning(
            "code index: the embedder answered %s rows for %d texts; ranking by words alone",
            rows.shape,
            len(texts),
        )
        return None
    if not np.isfinite(rows).all():
        log.warning(
            "code index: the embedder answered non-finite values for %s; ranking by words alone", what
        )
        return None
    return rows


def definitions_of(path: str, lines: list[str]) -> list[Definition]:
    """The definitions of one file: by `ast` for Python that parses, else by definition lines."""
    # a lone \r is a line break to Python's tokenizer but not to the page table,
    # whose numbers a citation gives (found by review: a `\r` in a comment shifted every line
    # after it), and a BOM is not a character to `ast`
    text = "\n".join(lines).removeprefix("\ufeff").replace("\r", " ")
    if path.endswith((".py", ".pyi")) and len(text) <= MAX_FILE_CHARS:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        if tree is not None:
            try:
                return _python_definitions(path, lines, tree)
            except RecursionError:  # e.g. a chain of a thousand `elif`s: by its lines instead
                return _line_definitions(path, lines)
    return _line_definitions(path, lines)


def _line_definitions(path: str, lines: list[str]) -> list[Definition]:
    out = []
    for number, line in enumerate(lines, 1):
        match = DEFINITION_LINE.match(line[:1000])
        if match:
            name = match.group(1)
            out.append(_made(path, number, name, "definition", line, "", [], [], ""))
    return out


def _python_definitions(path: str, lines: list[str], tree: ast.Module) -> list[Definition]:
    out: list[Definition] = []

    def visit(body: list[ast.stmt], owner: str, depth: int = 0) -> None:
        if depth > MAX_BLOCK_DEPTH:
            raise RecursionError("blocks nested too deep to index by `ast`")
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node, clean=True) or ""
                if isinstance(node, ast.ClassDef):
                    inner = [
                        n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                    ]
                    params = [_dotted(b) for b in node.bases]
                    kind, used = "class", inner
                else:
                    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
                    kind, used = ("method" if owner else "function"), _used(node)
                qualified = f"{owner}.{node.name}" if owner else node.name
                line = lines[node.lineno - 1] if node.lineno <= len(lines) else node.name
                out.append(_made(path, node.lineno, qualified, kind, line, doc, params, used, owner))
                if isinstance(node, ast.ClassDef) and not owner:
                    visit(node.body, node.name, depth + 1)
            elif isinstance(node, ast.Assign | ast.AnnAssign) and not owner:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id.isupper():
                        line = lines[node.lineno - 1] if node.lineno <= len(lines) else target.id
                        out.append(_made(path, node.lineno, target.id, "constant", line, "", [], [], ""))
            elif isinstance(node, ast.If | ast.Try | ast.With):  # `try: import ssl ... else: class ...`
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, None) or [], owner, depth + 1)
                for handler in getattr(node, "handlers", None) or []:
                    visit(handler.body, owner, depth + 1)

    visit(tree.body, "")
    return out


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _used(node: ast.AST) -> list[str]:
    """Names, attributes and words of short strings a body uses (bounded)."""
    found: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.append(child.id)
        elif isinstance(child, ast.Attribute):
            found.append(child.attr)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str) and len(child.value) < 80:
            found.append(child.value)
        if len(found) >= MAX_BODY_WORDS:
            break
    return found


def _made(
    path: str,
    line: int,
    name: str,
    kind: str,
    text: str,
    doc: str,
    params: list[str],
    used: list[str],
    owner: str,
) -> Definition:
    short = name.rsplit(".", 1)[-1]
    stem_of_path = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    fields = {
        "name": Counter(words(short)),
        "owner": Counter(words(owner)),
        "doc": Counter(words(doc[:MAX_DOC_CHARS])),
        "params": Counter(words(" ".join(params))),
        "body": Counter(words(" ".join(used))[:MAX_BODY_WORDS]),
        "path": Counter(
            words(path.replace("/", " ")) + ([stem(stem_of_path.lower())] if stem_of_path else [])
        ),
    }
    first_doc = doc.strip().split("\n", 1)[0][:200] if doc else ""
    return Definition(path, line, name, kind, text, first_doc, fields)
