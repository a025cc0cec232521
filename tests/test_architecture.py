"""The package layering of docs/architecture.md holds: no import goes up or sideways (imports inside
functions count), the HTTP client loads no runtime, and modules, functions and classes stay small."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layering_kit import LAYERS, judge, unit_of, violations

ROOT = Path(__file__).resolve().parent.parent / "colony"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_CLASS_METHODS = 30  # counting the methods of its mixins defined in colony/


def test_no_import_breaks_the_layering():
    found = violations(ROOT)
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(map(str, found))


def test_every_unit_of_colony_has_a_layer():
    """A new package or top-level module must be placed in LAYERS (else the rule skips it)."""
    placed = {unit for units in LAYERS for unit in units}
    units = {unit_of(f"colony.{p.stem if p.is_file() else p.name}") for p in ROOT.iterdir()}
    units -= {""}
    units = {u for u in units if not u.startswith("py") and u != "__pycache__"}
    assert units <= placed, f"units without a layer: {sorted(units - placed)}"


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        # a lower layer reaching up, in a function (hidden from a module-level reading)
        (
            "colony/blackboard/blackboard.py",
            "    from colony.system.registry import AgentRegistry\n",
            "imports up",
        ),
        # siblings of one layer
        ("colony/planning/compaction.py", "from colony.memory.blocks.tools import MemoryBlocksCapability\n",
         "sibling"),
        # the client reaching into the runtime
        ("colony/client.py", "from colony.agents.handle import AgentHandle\n", "may import only"),
        # a relative import counts the same
        ("colony/vcm/pages.py", "from ..inference import engine\n", "imports up"),
    ],
)
def test_a_deliberately_wrong_import_is_caught(tmp_path, module, line, expected):
    """The check fails on a wrong import added to a copy of the tree (and passes on the copy before)."""
    copy = tmp_path / "colony"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(copy) == []
    path = copy / module.removeprefix("colony/")
    text = path.read_text()
    if line.startswith("    "):  # inside a function: put it in the file's first function body
        tree = ast.parse(text)
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
        lines = text.splitlines(keepends=True)
        first = fn.body[0]
        indent = " " * first.col_offset
        lines.insert(first.lineno - 1, indent + line.lstrip())
        text = "".join(lines)
    else:
        text = text + "\n" + line
    path.write_text(text)
    found = violations(copy)
    assert len(found) == 1, found
    assert expected in found[0].reason, str(found[0])


def test_type_checking_imports_do_not_count():
    from tests.layering_kit import Import

    assert judge(Import("colony.agents.base", "colony.system.registry", 1, False)) is not None
    assert judge(Import("colony.system.registry", "colony.agents.base", 1, True)) is None


def test_the_http_client_loads_no_runtime():
    """`import colony.client` loads the client, the leaves and nothing of the runtime."""
    code = (
        "import sys, colony.client; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('colony'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = {unit_of(m) for m in out.split()} - {""}
    assert loaded <= {"client", "wire", "config", "errors"}, out


def _functions_and_classes(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node


def _sources():
    return sorted(ROOT.rglob("*.py"))


def test_no_module_over_600_lines():
    big = [f"{p.relative_to(ROOT.parent)}: {n}" for p in _sources()
           if (n := p.read_text().count("\n")) > MAX_MODULE_LINES]
    assert not big, big


def test_no_function_over_80_lines():
    long = [
        f"{p.relative_to(ROOT.parent)}:{n.lineno} {n.name}: {n.end_lineno - n.lineno + 1} lines"
        for p in _sources()
        for n in _functions_and_classes(p)
        if not isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_no_class_over_30_methods_counting_its_mixins():
    """A mixin is a base class of colony/ that no other class inherits from: a class split across
    files. Its methods count as the class's own; a shared base (AgentCapability) does not."""
    classes: dict[str, ast.ClassDef] = {}
    children: dict[str, set[str]] = {}
    for p in _sources():
        for n in _functions_and_classes(p):
            if isinstance(n, ast.ClassDef):
                classes.setdefault(n.name, n)
                for base in n.bases:
                    children.setdefault(_base_name(base), set()).add(n.name)

    def methods(cls: ast.ClassDef) -> set[str]:
        own = {b.name for b in cls.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)}
        for base in map(_base_name, cls.bases):
            if base in classes and children.get(base) == {cls.name}:
                own |= {f"{base}.{m}" for m in methods(classes[base])}
        return own

    big = {name: len(m) for name, cls in classes.items() if len(m := methods(cls)) > MAX_CLASS_METHODS}
    assert not big, big


def _base_name(base: ast.expr) -> str:
    return ast.unparse(base).split(".")[-1].split("[")[0]


# Where settings may be loaded: the process entry points. Everything below takes them from whoever
# built it. The HTTP client reads the local cluster's token file through them when no token is given
# (a user program's entry point: the SDK's credential discovery, like the CLI's).
SETTINGS_ENTRY_POINTS = {
    "colony/cli.py",
    "colony/cli_bb.py",
    "colony/cli_chat.py",
    "colony/cli_memory.py",
    "colony/cli_target.py",
    "colony/client_http.py",
    "colony/serve/app.py",  # the Serve application's builder (`colony.serve.app:app`)
    "colony/serve/cluster.py",  # the local cluster daemon's main
    "colony/config.py",  # defines it
}


def test_settings_are_injected_not_looked_up_below_the_entry_points():
    """No `load_settings()` call outside the process entry points (a function-level call too)."""
    calls = []
    for path in _sources():
        rel = str(path.relative_to(ROOT.parent))
        if rel in SETTINGS_ENTRY_POINTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "load_settings":
                calls.append(f"{rel}:{node.lineno}")
    assert not calls, f"settings looked up below the entry points: {calls}"
