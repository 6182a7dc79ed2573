"""benchmarks/gpu.py --smoke: the GPU benchmark's code paths (torchrun and `air submit`,
DDP and FSDP2, a checkpoint every 10 steps, the runtime's tokens/s and MFU) on CPU, so
the script a GPU session runs is known to work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


def test_the_gpu_benchmark_runs_its_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_smoke.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert list(rows) == ["torchrun-ddp", "air-ddp", "air-fsdp-compile-ckpt100"]
    for row in rows.values():
        assert row["tokens_per_s"] > 0 and row["step_s_median"] > 0
        assert row["tokens_per_step"] == 4 * 64 * 2  # batch x sequence x ranks
    for name in ("air-ddp", "air-fsdp-compile-ckpt100"):
        assert rows[name]["runtime_tokens_per_s"] > 0
        assert 0 < rows[name]["runtime_mfu"] < 1  # the smoke sets AIR_PEAK_FLOPS
    assert rows["air-fsdp-compile-ckpt100"]["checkpoints"] == 2
    assert "| air-ddp |" in done.stdout and "torchrun-ddp" in result["report"]
