"""The GPT-2 example as a script (one CPU process): it learns a repeating sequence and
writes the step times benchmarks/gpu.py reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_script_learns_a_repeating_sequence_and_writes_its_step_times(tmp_path):
    tokens = np.tile(np.arange(32, dtype=np.uint16), 500)  # 0..31 over and over
    data = tmp_path / "train.bin"
    tokens.tofile(data)
    result = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIR_", "RANK", "WORLD"))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "air_sdk.examples.gpt2",
            "--config",
            "tiny",
            "--steps",
            "40",
            "--batch-size",
            "8",
            "--seq-len",
            "32",
            "--lr",
            "3e-3",
            "--data",
            str(data),
            "--result",
            str(result),
        ],  # fmt: skip
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(result.read_text())
    assert summary["loss"] < 1.0  # from ln(256) = 5.5: the pattern was learned
    assert summary["tokens_per_step"] == 8 * 32 and summary["num_steps"] == 32
    assert 0 < summary["step_s_median"] <= summary["step_s_max"]
    assert summary["device"] == "cpu"
