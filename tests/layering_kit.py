"""The package layering rule of docs/architecture.md, read from the code with `ast`.

Every import counts, those inside functions included (they are still dependencies); only imports
under `if TYPE_CHECKING:` are left out (they run nowhere). A module may import its own unit and
the units of lower layers; units of one layer (memory, context, planning) do not import each other;
the HTTP client imports only the leaves. tests/test_architecture.py runs `violations()` on colony/.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# From the leaves up; a unit is a package under colony/ or a group of top-level modules.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "aio", "file_lock"),
    ("config",),
    ("metrics", "security", "wire"),
    ("blackboard",),
    ("vcm",),
    ("inference",),
    ("agents",),
    ("memory", "context", "planning"),
    ("system",),
    ("api",),
    ("serve",),
    ("client",),
    ("cli",),
)
# Top-level modules that belong to a unit other than their own name.
MODULE_UNITS = {
    "config_sections": "config",
    "config_problems": "config",
    "metric_series": "metrics",
    "run_display": "cli",
    "dashboards": "cli",
    "dashboard_panels": "cli",
}
# Units that may import only the units named here (besides their own): the client talks HTTP.
ONLY = {"client": frozenset({"errors", "aio", "config", "wire"})}
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. colony.agents.base
    target: str  # the imported module, e.g. colony.context.action_log
    line: int
    in_function: bool


@dataclass(frozen=True)
class Violation:
    imp: Import
    reason: str

    def __str__(self) -> str:
        where = " (inside a function)" if self.imp.in_function else ""
        return f"{self.imp.module}:{self.imp.line} imports {self.imp.target}{where}: {self.reason}"


def unit_of(module: str) -> str:
    """`colony.agents.base` -> `agents`; `colony.cli_chat` -> `cli`, `colony.client_sessions` ->
    `client`, `colony.run_display` -> `cli` (MODULE_UNITS); `colony` -> ``."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1].startswith("__"):
        return ""  # the package itself (colony/__init__.py: the version, nothing imported)
    name = parts[1]
    for prefix in ("cli_", "client_"):
        if name.startswith(prefix):
            return prefix[:-1]
    return MODULE_UNITS.get(name, name)


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def imports(path: Path, root: Path) -> Iterator[Import]:
    """Every `colony` import in the file at `path` (colony/ is `root`), TYPE_CHECKING blocks left out."""
    module = module_name(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped: set[int] = set()
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(x) for child in node.body for x in ast.walk(child)}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function |= {id(x) for x in ast.walk(node) if x is not node}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                targets = [".".join([*base, node.module] if node.module else base)]
            elif node.module:
                targets = [node.module]
            # `from colony import cli` imports the module colony.cli, not the package
            if targets == ["colony"]:
                targets = [f"colony.{alias.name}" for alias in node.names]
        for target in targets:
            if target == "colony" or target.startswith("colony."):
                yield Import(module, target, node.lineno, id(node) in in_function)


def judge(imp: Import) -> str | None:
    """Why `imp` breaks the rule, or None when it keeps it."""
    source, target = unit_of(imp.module), unit_of(imp.target)
    if not source or not target or source == target:
        return None
    if source not in RANK:
        return f"the unit {source!r} has no layer (add it to LAYERS in tests/layering_kit.py)"
    if target not in RANK:
        return f"the unit {target!r} has no layer (add it to LAYERS in tests/layering_kit.py)"
    if source in ONLY and target not in ONLY[source]:
        return f"{source} may import only {', '.join(sorted(ONLY[source]))}"
    if RANK[target] > RANK[source]:
        return f"{source} (layer {RANK[source]}) imports up into {target} (layer {RANK[target]})"
    if RANK[target] == RANK[source]:
        return f"{source} imports its sibling {target} (define a Protocol in a lower layer instead)"
    return None


def violations(root: Path) -> list[Violation]:
    """Every import under `root` (a colony/ folder) against the rule."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for imp in imports(path, root):
            reason = judge(imp)
            if reason:
                found.append(Violation(imp, reason))
    return found
