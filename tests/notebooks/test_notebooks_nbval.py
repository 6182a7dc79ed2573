"""The example notebooks run top to bottom on CPU, each under nbval in an isolated env.

Why a subprocess per notebook rather than collecting `notebooks/*.ipynb` in this
session: the kernel inherits the environment of the process that starts it, and the
notebooks start and stop a gateway, so each needs its own HOME, AIR_HOME, config
file and gateway port (never the user's ~/.config/air or port 8470). Setting those
in this process would leak into every other test. Each notebook is copied into a
temporary directory first, so what it writes (the SDK notebook's script) never
lands in the checkout. `--nbval-lax` checks that no cell raises and compares the
outputs of the cells tagged `nbval-check-output` only; the cells assert what matters
themselves (the job SUCCEEDED, every step's loss arrived, it fell).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from notebook_env import REPO, isolated_env

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
#: one notebook runs in 20-80 s on 2 cores (parallel_llama's and finetune_hf_llama's 4
#: ranks are the slowest: the second took 1.2x the first's time, side by side on one
#: machine, its ranks importing transformers); this bounds a hung cell or job
CELL_TIMEOUT_S = 120
RUN_TIMEOUT_S = 240


def test_the_notebooks_are_collected() -> None:
    # A rename must not silently drop a notebook from CI.
    expected = {
        "finetune_hf_llama.ipynb",
        "parallel_llama.ipynb",
        "quickstart.ipynb",
        "resilience.ipynb",
        "sdk_from_script.ipynb",
    }
    assert expected <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_clean(name: str, tmp_path: Path) -> None:
    env = isolated_env(tmp_path / "env")
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    shutil.copy(REPO / "notebooks" / name, workdir / name)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--nbval-lax",
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        "--nbval-current-env",  # the kernel runs this interpreter (the checkout's venv)
        "-p",
        "no:cacheprovider",
        f"--rootdir={workdir}",
        "-q",
        "-rA",
        name,
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=workdir,
            env=env.vars,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        output, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = (exc.stdout or b"").decode(errors="replace"), None
    finally:
        left = env.cleanup(grace_s=10)
    took = time.monotonic() - started
    assert code == 0, f"{name} under nbval: exit {code} after {took:.0f} s\n{output[-6000:]}"
    # `%air gateway stop` ends the notebook: nothing of the run may outlive it.
    assert not left, f"{name} left processes behind: {left}"
    print(f"{name}: {took:.1f} s")
