"""README's settings table is complete: every ColonySettings field has a row with its env name."""

from __future__ import annotations

import re
from pathlib import Path

from colony.config import ColonySettings
from colony.config_problems import setting_paths as _setting_paths

README = Path(__file__).resolve().parents[1] / "README.md"


def settings_rows() -> dict[str, str]:
    """Each field named in the first column of the settings table -> its env column."""
    rows: dict[str, str] = {}
    for line in README.read_text().splitlines():
        cells = line.split("|")
        if not line.startswith("| `") or len(cells) < 4 or "_" not in cells[2]:
            continue
        for name in re.findall(r"`([a-z_.]+)`", cells[1]):
            rows[name] = cells[2]
    return rows


def test_readme_settings_table_names_every_setting_with_its_env_name() -> None:
    rows = settings_rows()
    fields = {".".join(path) for path, section in _setting_paths(ColonySettings).items() if not section}
    assert not fields - set(rows), f"settings missing from README's table: {sorted(fields - set(rows))}"
    assert not set(rows) - fields - {"colony"}, f"README rows that are no setting: {set(rows) - fields}"
    for name in fields:
        env = "COLONY_" + name.upper().replace(".", "__")
        suffix = "_" + name.rsplit(".", 1)[-1].upper()
        assert env in rows[name] or f"...{suffix}" in rows[name], (name, rows[name])


def test_every_test_the_security_docs_cite_exists() -> None:
    """The security statements in docs/ each name the test that holds them: a renamed or deleted
    test must not leave a statement pointing at nothing."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    defined: set[str] = set()
    for path in Path(__file__).resolve().parent.glob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    cited = {
        (doc.name, name)
        for doc in (docs / "api.md", docs / "planning.md", docs / "vcm.md", docs / "blackboard.md")
        for name in re.findall(r"\b(test_\w+)", doc.read_text())
        if not name.endswith("_py") and not (docs.parent / "tests" / f"{name}.py").exists()
    }
    assert len(cited) >= 10, "the security docs should cite their tests"
    missing = sorted((doc, name) for doc, name in cited if name not in defined)
    assert not missing, f"docs cite tests that do not exist: {missing}"
