"""`make demo` on a fresh clone says what it is doing while pip works (about 2 minutes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_setting_up_the_venv_says_each_step_before_it_runs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    # The real recipe, with every python/pip call replaced by `true`: only what make prints.
    run = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO),
            f"{venv}/.air-installed",
            f"VENV={venv}",
            "PYTHON=true",
            "PY=true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stdout.splitlines() if line.startswith("==> ")]
    assert said == [
        f"==> setting up {venv} (the first time takes about 2 minutes; later runs skip this)",
        "==> [1/3] upgrading pip",
        "==> [2/3] installing torch 2.13.0 (the CPU build)",
        "==> [3/3] installing AIR and its dependencies (FastAPI, Ray, JupyterLab, test tools)",
        f"==> {venv} is ready",
    ]
