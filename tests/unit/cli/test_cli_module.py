"""`python -m air_sdk` runs the `air` command, as a user without `air` on PATH types it."""

from __future__ import annotations

import subprocess
import sys


def test_python_m_air_sdk_is_the_air_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "air_sdk", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: air [OPTIONS] COMMAND" in done.stdout and "submit" in done.stdout
