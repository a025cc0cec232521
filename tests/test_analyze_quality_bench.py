"""The analyze-quality benchmark's own measures (benchmarks/analyze_quality.py): they must tell a
grounded summary from one that names what its code does not hold, independently of the job's check."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import analyze_quality as quality

PAGE = '''"""Where pages live: the page table maps each page to the replicas holding it."""

class PageTable:
    def drop_replica(self, replica_id):
        """A replica is gone."""
'''


def test_identifiers_are_code_names_not_english_words() -> None:
    found = quality.identifiers(
        "The `PageTable` in page_table.py maps pages, e.g. with drop_replica and redis.asyncio; "
        "it is a Web scraper."
    )
    assert found == {"PageTable", "page_table.py", "drop_replica", "redis.asyncio"}


def test_a_grounded_summary_scores_full_and_an_invented_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "page_table.py").write_text(PAGE)
    section = {"files": ["page_table.py"], "spans": ["page_table.py:1-6"]}
    good = {
        **section,
        "summary": "`PageTable` in page_table.py keeps where pages are; drop_replica forgets one.",
    }
    bad = {**section, "summary": "A web scraper built on BeautifulSoup with fetch_url and days_in_month."}
    output = {
        "path": str(tmp_path),
        "sections": [good, bad],
        "stats": {"accepted": 1, "regenerated": 1, "extractive": 0},
    }
    result = quality.measure("pkg", output, 1.0, 0)
    assert result.sections == 2 and result.covered == 1  # the invented one names nothing of the page
    assert result.grounded_names == 3 and result.names == 6  # BeautifulSoup, fetch_url, days_in_month
    assert {u.split(": ")[1] for u in result.ungrounded} == {"BeautifulSoup", "fetch_url", "days_in_month"}
    assert "50%" in quality.table([result])
