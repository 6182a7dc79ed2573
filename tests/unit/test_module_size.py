"""No module holds more than one idea's worth of code (issue 15): 600 lines at most."""

from __future__ import annotations

from pathlib import Path

import air_sdk

REPO = Path(air_sdk.__file__).resolve().parents[1]
MAX_LINES = 600


def test_no_module_is_over_600_lines():
    sources = [*(REPO / "air_sdk").rglob("*.py"), *(REPO / "magics").rglob("*.py")]
    assert len(sources) > 100  # the tree was found
    over = {
        str(path.relative_to(REPO)): lines
        for path in sources
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert over == {}, f"split these along their ideas: {over}"
