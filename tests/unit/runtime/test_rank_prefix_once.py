"""A rank's traceback says its rank once: torch.distributed's excepthook writes every
line as `[rank0]: ...`, and AIR's supervisor prefixes `[rank 0] ` (issue 21 item 7)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

import pytest

from air_sdk.runtime.supervise import pump_output

SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
print("step 1", flush=True)
raise ValueError("boom")
"""


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add_line(self, line: str) -> None:
        self.lines.append(line)


@pytest.mark.slow
def test_a_torch_rank_traceback_carries_one_rank_prefix(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(store=tmp_path / "store"))
    child = subprocess.Popen(
        [sys.executable, "-u", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, tail, shipped = io.BytesIO(), deque[str](maxlen=50), _Lines()
    assert child.stdout is not None
    pump_output(child.stdout, 0, tail, threading.Lock(), shipped, out)
    assert child.wait(timeout=120) == 1

    printed = out.getvalue().decode().splitlines()
    assert "[rank 0] Traceback (most recent call last):" in printed
    assert "[rank 0] ValueError: boom" in printed
    assert not any("[rank0]" in line for line in printed), printed
    assert "ValueError: boom" in tail and "ValueError: boom" in shipped.lines
    assert not any(line.startswith("[rank0]") for line in shipped.lines)
