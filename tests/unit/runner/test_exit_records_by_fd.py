"""`JobPaths.exit_records`: the controller reads the exit records a job's supervisors
wrote by fd, so a FIFO there cannot hang it and a link cannot point it at another file
(issue 19, the audit of the gateway's reads and writes in job-writable dirs)."""

from __future__ import annotations

import json
import os
import threading

from air_sdk.runner.job_files import JobPaths
from air_sdk.runner.node.records import MAX_EXIT_RECORD_BYTES


def test_links_fifos_and_other_names_are_skipped_without_blocking(tmp_path):
    paths = JobPaths(tmp_path / "job")
    exits = paths.attempt(1) / "exits"
    exits.mkdir(parents=True)
    (exits / "rank-0.json").write_text(json.dumps({"rank": 0}))
    (tmp_path / "gateway.json").write_text(json.dumps({"rank": 1, "secret": "x"}))
    os.symlink(tmp_path / "gateway.json", exits / "rank-1.json")
    os.mkfifo(exits / "rank-2.json")  # a read of it would wait for a writer forever
    (exits / "notes.txt").write_text("ignored")
    (exits / "rank-3.json").write_bytes(b"x" * (MAX_EXIT_RECORD_BYTES + 10))
    found: list = []
    reader = threading.Thread(target=lambda: found.extend(paths.exit_records(1)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "reading the exit records blocked on the FIFO"
    assert [json.loads(raw) for raw, _ in found[:1]] == [{"rank": 0}]
    assert len(found) == 2 and len(found[1][0]) == MAX_EXIT_RECORD_BYTES  # read bounded


def test_an_exits_directory_swapped_for_a_link_is_not_read(tmp_path):
    paths = JobPaths(tmp_path / "job")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.json").write_text(json.dumps({"rank": 0}))
    paths.attempt(1).mkdir(parents=True)
    os.symlink(elsewhere, paths.attempt(1) / "exits")
    assert list(paths.exit_records(1)) == []
    assert list(paths.exit_records(2)) == []  # no such attempt yet
