"""Asking ranks for their flight recorder dumps through torch's FIFOs, and reading the
dumps as data only."""

import json
import os
import pickle
import threading
import time

from air_sdk.runner.flight_recorder import (
    MAX_DUMP_BYTES,
    collect,
    hang_report,
    read_dump,
    request_dumps,
)


def fake_rank(directory, rank, dump):
    """What torch does in a rank: a FIFO it polls; on a write, the dump file."""
    pipe = directory / f"rank_{rank}.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    stop = threading.Event()

    def monitor():
        while not stop.is_set():
            try:
                if os.read(fd, 128):
                    (directory / f"rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
                    return
            except BlockingIOError:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    return stop, thread, fd


def entry(seq, state="completed"):
    return {
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "profiling_name": "nccl:all_reduce",
        "input_sizes": [[16]],
        "state": state,
        "is_p2p": False,
    }


def test_request_dumps_pokes_the_fifos_that_have_a_reader(tmp_path):
    stop, thread, fd = fake_rank(tmp_path, 0, {"entries": []})
    os.mkfifo(tmp_path / "rank_1.pipe")  # its rank is gone: no reader
    (tmp_path / "rank_2.pipe").write_text("not a fifo")
    try:
        assert request_dumps(tmp_path) == [0]
        thread.join(5)
        assert (tmp_path / "rank_0").exists()
    finally:
        stop.set()
        os.close(fd)


def test_collect_waits_for_the_dumps_it_asked_for(tmp_path):
    ranks = [
        fake_rank(tmp_path, 0, {"entries": [entry(1), entry(2, "started")]}),
        fake_rank(tmp_path, 1, {"entries": [entry(1)]}),
    ]
    try:
        dumps = collect(tmp_path, since=0.0, num_ranks=2, timeout_s=10)
        assert sorted(dumps) == [0, 1]
        assert [r.seq for r in dumps[0].newest] == [1, 2]
    finally:
        for stop, _, fd in ranks:
            stop.set()
            os.close(fd)


def test_hang_report_reads_dumps_torch_wrote_on_its_own_timeout(tmp_path):
    directory = tmp_path / "flight-recorder"
    directory.mkdir()
    (directory / "rank_0").write_bytes(pickle.dumps({"entries": [entry(1), entry(2, "started")]}))
    (directory / "rank_1").write_text(json.dumps({"entries": [entry(1)]}))  # the JSON form
    started = time.monotonic()
    report = hang_report(tmp_path, num_ranks=2)
    assert time.monotonic() - started < 2  # no FIFO: nothing to wait for
    assert report.culprits == [1]
    assert "rank 1 is behind" in report.summary
    assert hang_report(tmp_path / "nowhere", num_ranks=2) is None


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_dump_is_data_only(tmp_path):
    hostile = tmp_path / "rank_0"
    hostile.write_bytes(pickle.dumps({"entries": [Boom()]}))
    assert read_dump(hostile) is None  # refused before anything is called
    (tmp_path / "rank_1").write_bytes(b"\x80\x02garbage")
    assert read_dump(tmp_path / "rank_1") is None
    big = tmp_path / "rank_2"
    with open(big, "wb") as f:
        f.truncate(MAX_DUMP_BYTES + 1)
    assert read_dump(big) is None
    (tmp_path / "rank_3").write_bytes(pickle.dumps([1, 2]))  # not a dict
    assert read_dump(tmp_path / "rank_3") is None
    (tmp_path / "rank_4").symlink_to(hostile)
    assert read_dump(tmp_path / "rank_4") is None


def test_old_dumps_are_left_out(tmp_path):
    old = tmp_path / "rank_0"
    old.write_bytes(pickle.dumps({"entries": [entry(1)]}))
    os.utime(old, (1000, 1000))
    assert collect(tmp_path, since=2000.0, num_ranks=4) == {}
    assert sorted(collect(tmp_path, since=0.0, num_ranks=4)) == [0]


def test_ranks_the_job_does_not_have_are_not_read(tmp_path):
    for rank in (0, 1, 7, 99999):
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"entries": [entry(1)]}))
    assert sorted(collect(tmp_path, since=0.0, num_ranks=8)) == [0, 1, 7]
