"""The suite stops after three tests timed out (tests/stop_on_timeouts.py), and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HUNG = """
import time
import pytest

@pytest.mark.parametrize("n", range(5))
def test_hangs(n):
    time.sleep(30)
"""


def test_the_run_stops_after_three_timeouts_and_names_them(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HUNG)
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(tests)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "stop_on_timeouts",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=1",
            "-q",
            str(tmp_path / "test_hung.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2, out  # interrupted, failed
    assert "3 failed" in out and "4 failed" not in out, out
    assert "3 tests timed out (" in out and "test_hangs[2]" in out, out
