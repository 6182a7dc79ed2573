"""Real flight recorder dumps from torch (gloo records them too): a 3-rank job whose last
rank skips an all-reduce; the runner's reader and analysis name that rank and the
collective the others wait in."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import frdump  # noqa: E402

from air_sdk.runner.flight_recorder import hang_report  # noqa: E402

pytestmark = pytest.mark.slow


def test_real_dumps_name_the_rank_that_skipped_a_collective(tmp_path):
    traces = tmp_path / "flight-recorder"
    traces.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        frdump.run, args=(port, str(traces)), nprocs=frdump.WORLD, join=True, start_method="spawn"
    )
    report = hang_report(
        tmp_path, num_ranks=frdump.WORLD, timeout_s=1
    )  # read as the runner reads them
    assert report is not None
    assert report.summary == (
        "rank 2 is behind in process group 0 (default_pg): ranks 0-1 wait in all_reduce #4"
        " ([16]); rank 2 last called all_reduce #3 (scheduled)"
    )
    assert report.culprits == [2]
    assert report.last_collectives[0][-1] == (
        "all_reduce #4 in process group 0 (default_pg) [[16]] Float: scheduled"
    )
