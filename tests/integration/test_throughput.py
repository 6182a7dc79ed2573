"""Tokens/s and MFU of a real 2-rank job, with nothing but `air.log(..., tokens=N)` in the
script (the GPT-2 example): FLOPs counted by the runtime, or taken from `JobSpec.model`.
On CPU there is no peak, so the job sets AIR_PEAK_FLOPS as a user would for a GPU the
device table lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from air_sdk.cli.terminal_views import progress_metrics
from air_sdk.schema import JobSpec, JobState, ModelSpec, Resources

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "air_sdk" / "examples"
ARGS = ["--config", "tiny", "--steps", "12", "--batch-size", "4"]
PEAK = "1e11"


def _finished(job):
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs())
    return job.snapshot()


def test_mfu_and_tokens_per_s_with_flops_counted_by_the_runtime(gateway):
    job = gateway.submit_script(
        EXAMPLES / "gpt2.py", args=ARGS, nodes=2, name="gpt2-tiny", env={"AIR_PEAK_FLOPS": PEAK}
    )
    snap = _finished(job)
    assert snap.tokens_per_s is not None and snap.tokens_per_s > 0
    assert snap.mfu is not None and 0 < snap.mfu < 1
    counted = [r for r in job.metrics(name="flops_per_step") if r.rank == 0]
    assert len(counted) == 1  # counted once, over the first logged interval
    # the tiny GPT-2: 2 layers of 64, vocab 256; 4 x 64 tokens per rank and step
    assert 5e7 < counted[0].values["flops_per_step"] < 5e8
    mfu_points = [r.step for r in job.metrics(name="mfu") if r.rank == 0]
    assert mfu_points == list(range(counted[0].step + 1, 13))
    assert "tokens/s" in progress_metrics(snap) and "MFU " in progress_metrics(snap)


def test_mfu_from_the_jobs_model_without_counting(gateway):
    spec = JobSpec(
        name="gpt2-model",
        entrypoint="gpt2.py",
        args=ARGS,
        resources=Resources(nodes=2),
        env={"AIR_PEAK_FLOPS": PEAK},
        model=ModelSpec(
            arch="gpt2", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=64
        ),
    )
    job = gateway.submit(spec, workdir=EXAMPLES)
    snap = _finished(job)
    assert job.metrics(name="flops_per_step") == []
    assert [r.step for r in job.metrics(name="mfu") if r.rank == 0] == list(range(2, 13))
    assert 0 < snap.mfu < 1


def test_counted_flops_under_tensor_parallel_are_each_ranks_share(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp
    import tpflops

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(tpflops.run, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    counted = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    b, w, h = tpflops.BATCH, tpflops.WIDTH, tpflops.HIDDEN
    forward = 2 * b * w * h * 2
    # forward and backward of both layers, no gradient for the input of the first
    whole = forward * 3 - 2 * b * w * h
    share = [forward // 2, whole // 2]
    assert counted == [share, share]  # not the whole group's on every rank
