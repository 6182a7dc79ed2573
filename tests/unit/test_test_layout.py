"""The suite collects in one run: pytest imports test modules by basename (rootdir
`tests/` on sys.path, no packages), so two test files of one name break collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert names["test_test_layout.py"] == 1  # the tree was found
    assert [n for n, count in names.items() if count > 1] == []
