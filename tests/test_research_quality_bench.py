"""The research-quality benchmark's own measures (benchmarks/research_quality.py): where an answer's
definition spans (found with `ast` there, not with the index under test), when a citation counts
as right, and that every question of its sets names a definition that exists in this Python."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import research_quality as bench

CODE = '''import ssl

try:
    import zlib
except ImportError:
    pass
else:
    class Packer:
        """Packs."""

        @staticmethod
        def pack(data):
            return data


def unpack(data):
    return data
'''


def test_spans_are_found_inside_blocks_and_classes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(CODE)
    assert bench.definition_span(tmp_path, "m.py", "Packer") == (8, 13, 8)
    assert bench.definition_span(tmp_path, "m.py", "Packer.pack") == (11, 13, 12)
    assert bench.definition_span(tmp_path, "m.py", "unpack") == (16, 17, 16)


def test_a_citation_is_right_within_the_definition_and_exact_on_its_first_lines() -> None:
    question = {"path": "m.py"}
    span = (11, 13, 12)
    assert bench.judge(question, span, {"path": "m.py", "line": 12}) == (True, True)
    assert bench.judge(question, span, {"path": "m.py", "line": 11}) == (True, True)
    assert bench.judge(question, span, {"path": "m.py", "line": 13}) == (True, False)
    assert bench.judge(question, span, {"path": "m.py", "line": 14}) == (False, False)
    assert bench.judge(question, span, {"path": "other.py", "line": 12}) == (False, False)
    assert bench.judge(question, span, {"path": "m.py", "line": "12"}) == (False, False)
    assert bench.judge(question, span, None) == (False, False)


def test_every_question_names_a_definition_of_its_file_and_the_sets_are_apart() -> None:
    folders: dict[str, set[str]] = {}
    for name in ("test", "dev"):
        questions = bench.load_questions(name, None, None)
        folders[name] = {q["folder"] for q in questions}
        assert len({q["id"] for q in questions}) == len(questions)
        for q in questions:
            root = Path(importlib.import_module(q["folder"]).__path__[0])
            first, last, line = bench.definition_span(root, q["path"], q["identifier"])
            assert first <= line <= last, q
            name = q["identifier"].rsplit(".", 1)[-1]
            looks_like_code = "_" in name.strip("_") or any(c.isupper() for c in name[1:])
            named = re.search(rf"\b{re.escape(q['identifier'])}\b", q["question"])
            assert named is None, q  # asked in other words
            assert not looks_like_code or not re.search(rf"\b{re.escape(name)}\b", q["question"]), q
    assert folders["test"] == {"email", "logging", "http"}
    assert not folders["test"] & folders["dev"]  # tuned on other packages than reported
    assert len(bench.load_questions("test", ["email"], 3)) == 3
