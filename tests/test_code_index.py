"""The code index (colony.context.code_index): definitions of a folder found with `ast` (methods
under their class, definitions inside `if`/`try` blocks), scored against a question by BM25 over
weighted fields; a question word also meets names that run it into others; hostile files (deep
nesting, binary noise, huge) are indexed by their definition lines or bounded."""

from __future__ import annotations

from colony.context import code_index
from colony.context.code_index import CodeIndex, definitions_of, stem, words

FILES = {
    "mail/utils.py": [
        '"""Helpers for mail."""',
        "",
        "def parsedate_to_datetime(data):",
        '    """Turn the date of a mail header into a datetime object."""',
        "    return data",
        "",
        "def format_address(pair):",
        '    """Write a name and an address as one header value."""',
        "    return pair",
    ],
    "mail/message.py": [
        "class Message:",
        '    """A mail message: headers and a body."""',
        "",
        "    @property",
        "    def content_type(self):",
        '        """The MIME type of the body, from the Content-Type header."""',
        "        return self.ctype",
        "",
        "try:",
        "    import ssl",
        "except ImportError:",
        "    pass",
        "else:",
        "    class SecureSender:",
        '        """Sends messages over TLS."""',
        "",
        "MAX_HEADER = 998",
    ],
    "notes.md": ["# Notes", "function helper() {", "}"],
}


def test_definitions_come_with_their_owner_decorators_and_blocks() -> None:
    index = CodeIndex(FILES)
    named = {(d.path, d.name): d for d in index.definitions}
    cited = named["mail/message.py", "Message.content_type"].cite()
    assert cited["line"] == 5 and cited["text"] == "def content_type(self):"  # its `def`, not the decorator
    assert named["mail/message.py", "Message.content_type"].kind == "method"
    assert named["mail/message.py", "SecureSender"].line == 14  # inside try/else
    assert named["mail/message.py", "MAX_HEADER"].kind == "constant"
    assert named["mail/utils.py", "parsedate_to_datetime"].doc.startswith("Turn the date")
    assert ("notes.md", "helper") in named  # not Python: by its definition line


def test_questions_in_other_words_find_their_definition() -> None:
    index = CodeIndex(FILES)
    best = index.search("Where is the date of a header converted to a datetime?", limit=1)[0]
    assert (best.definition.path, best.definition.name) == ("mail/utils.py", "parsedate_to_datetime")
    best = index.search("which class sends mail over TLS", limit=1)[0]
    assert best.definition.name == "SecureSender"
    best = index.search("what is the MIME type of a message body", limit=1)[0]
    assert best.definition.name == "Message.content_type"
    ranked = index.files("the date in a mail header", limit=2)
    assert ranked[0][0] == "mail/utils.py" and ranked[0][2][0].name == "parsedate_to_datetime"
    assert index.search("the and of", limit=5) == []  # nothing but stop words
    only = index.search("date header", paths=["mail/message.py"])
    assert all(h.definition.path == "mail/message.py" for h in only)


def test_a_question_word_meets_names_that_run_it_into_others() -> None:
    index = CodeIndex({"a.py": ["def getaddresses(fields):", "    pass", "def unrelated():", "    pass"]})
    (hit,) = index.search("split the address fields", limit=5)
    assert hit.definition.name == "getaddresses"
    assert stem("parsing") == stem("parses") == stem("parsed") == "pars"
    assert words("HTTPSConnection parse_header") == ["http", "connection", "pars", "head"]


def test_hostile_files_are_indexed_by_their_lines_or_bounded(monkeypatch) -> None:
    deep = "x = " + "(" * 300_000 + ")" * 300_000  # too deep for `ast`
    found = definitions_of("deep.py", [deep, "def still_found():", "    pass"])
    assert [d.name for d in found] == ["still_found"]
    noise = definitions_of("bin.py", ["\x00\x01def\xff", "def ok(): pass"])
    assert [d.name for d in noise] == ["ok"]
    monkeypatch.setattr(code_index, "MAX_DEFINITIONS", 3)
    many = CodeIndex({f"f{i}.py": [f"def d{i}_{j}(): pass" for j in range(5)] for i in range(3)})
    assert len(many.definitions) == 3
    assert CodeIndex({}).search("anything") == []


def test_a_long_elif_chain_is_indexed_by_its_lines_not_a_recursion_error() -> None:
    chain = ["x = 1", "if x == 0:", "    pass"]
    for n in range(1, 1200):
        chain += [f"elif x == {n}:", f"    def branch_{n}(): pass"]
    found = definitions_of("chain.py", chain)
    assert len(found) == 1199 and found[0].name == "branch_1" and found[0].line == 5


def test_names_that_hold_every_question_word_cost_one_pass_per_word() -> None:
    """Found by review: 4,000 names of 60 `a`/`b` letters and a question of 200 such 8-letter
    words took 23 s (every name matched every word, summed again per definition). Now the names a
    word meets are looked up once per question word: the search scores each definition once."""
    import random

    rng = random.Random(0)
    names = ["".join(rng.choice("ab") for _ in range(60)) for _ in range(4000)]
    index = CodeIndex({"ab.py": [line for n in names for line in (f"def {n}(x):", "    return x")]})
    question = " ".join({"".join(rng.choice("ab") for _ in range(8)) for _ in range(400)})[:2000]
    calls = 0
    score = index._score

    def counted(*args):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return score(*args)

    index._score = counted  # type: ignore[method-assign]
    assert len(index.search(question, limit=5)) == 5
    assert calls <= len(index.definitions)
