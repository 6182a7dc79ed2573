"""Per-job limits on memory, processes and disk (issue 19): through a real gateway
whose ranks run sandboxed (bwrap), with operator caps, each job one node and one rank.

A job past a limit fails at once (not restarted, though it has restarts left) with a
reason that names the limit and the numbers; a job under all of them succeeds; a job
asking more than the operator's cap is refused at submit, naming the cap. The fork
bomb is bounded (200 sleeping children at most) so it cannot hurt the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from airtest import node_runners, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.errors import AirError
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.notebook.snapshot_html import badge_html
from air_sdk.runner.backends.local import free_port
from air_sdk.runner.node.records import RunnerRecord
from air_sdk.schema import JobRecord, JobState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="limits read /proc"),
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path, str]]:
    """A client of the gateway, its home and its admin token."""
    if shutil.which("bwrap") is None:
        pytest.fail("bwrap is not installed: apt-get install bubblewrap (make sandbox-deps)")
    home = tmp_path_factory.mktemp("air-home")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=1,
        slots_per_node=1,
        write_client_config=False,
        sandbox="bwrap",
        max_job_memory="1GiB",
        max_job_processes=256,
        max_job_disk="256MiB",
    )
    gw = start_detached(opts)
    try:
        yield Client(gw.url, gw.token), home, gw.token
    finally:
        stop_gateway_and_its_jobs(gw.url, gw.token, home)


@pytest.fixture
def client(gateway: tuple[Client, Path, str]) -> Client:
    return gateway[0]


def _run(client: Client, tmp_path: Path, code: str, **options: object) -> JobRecord:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    job = client.submit_script(script, max_restarts=2, **options)  # type: ignore[arg-type]
    return job.wait(timeout=180)


def _failed_once_for(record: JobRecord, client: Client, words: str) -> str:
    """The failure's reason, after checking it names `words` and was not retried."""
    assert record.state is JobState.FAILED, (record.state, record.state_reason)
    assert record.failure is not None and record.failure.kind == "limit", record.failure
    reason = record.failure.reason
    assert words in reason, reason
    assert "not restarted" in record.state_reason, record.state_reason
    assert len(client.job(record.id).attempts()) == 1  # restarts left, none used
    return reason


def test_a_job_that_allocates_past_its_memory_limit_fails_naming_it(gateway, tmp_path):
    client, _home, token = gateway
    record = _run(
        client,
        tmp_path,
        """
        import time
        chunks = []
        for _ in range(32):  # 512 MiB, each page written
            chunks.append(bytearray(b"x" * (16 << 20)))
        print("allocated", flush=True)
        time.sleep(120)
        """,
        memory_limit="128MiB",
    )
    reason = _failed_once_for(record, client, "memory limit: job used ")
    assert "> limit 128 MiB" in reason and "--memory-limit" in reason
    # what a user reads: `air status` and the notebook monitor's badge
    env = {**os.environ, "AIR_GATEWAY_URL": client.gateway_url, "AIR_TOKEN": token}
    env.pop("AIR_CONFIG_FILE", None)
    status = subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", "status", record.id],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "memory limit: job used" in " ".join(status.stdout.split()), status
    assert "memory limit: job used" in badge_html(client.job(record.id).snapshot())


def test_a_fork_bomb_fails_with_the_process_limit(client, tmp_path):
    record = _run(
        client,
        tmp_path,
        """
        import os, time
        for _ in range(200):  # bounded: a real bomb would not stop
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
        time.sleep(120)
        """,
        max_processes=64,
    )
    reason = _failed_once_for(record, client, "process limit: job ran ")
    assert "> limit 64" in reason and "--max-processes" in reason


def test_a_job_writing_past_its_disk_limit_fails_naming_it(client, tmp_path):
    record = _run(
        client,
        tmp_path,
        """
        import os, time
        import air_sdk.runtime as air
        for i in range(40):  # 40 MiB in files of 1 MiB, each under the per-file limit
            with open(os.path.join(air.output_dir(), f"part-{i}"), "wb") as f:
                f.write(os.urandom(1 << 20))
        print("written", flush=True)
        time.sleep(120)
        """,
        disk_limit="16MiB",
    )
    reason = _failed_once_for(record, client, "disk limit: job's directories hold ")
    assert "> limit 16 MiB" in reason and "--disk-limit" in reason


def test_one_file_past_the_disk_limit_fails_naming_it(client, tmp_path):
    record = _run(
        client,
        tmp_path,
        """
        with open("/tmp/big", "wb") as f:
            f.write(b"x" * (24 << 20))
        """,
        disk_limit="16MiB",
    )
    reason = _failed_once_for(record, client, "disk limit: rank 0 wrote a file past 16 MiB")
    assert "--disk-limit" in reason


def _warm_ready(job_id: str) -> bool:
    """Whether the job's NodeRunner has a warm interpreter ready (its record says)."""
    for _pid, node_dir in node_runners(job_id).values():
        try:
            record = RunnerRecord.from_dict(json.loads((node_dir / "runner.json").read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if record.warm_ready:
            return True
    return False


WARM_THEN_BIG_FILE = """
import os, resource, sys, time
from air_sdk.schema import WorkerEnv

restarts = int(os.environ[WorkerEnv.env_name("restart_count")])
print("attempt", restarts + 1, "RLIMIT_FSIZE", resource.getrlimit(resource.RLIMIT_FSIZE)[0], flush=True)
if restarts == 0:  # until the test saw the next attempt's warm interpreter ready
    go = os.path.join(os.environ[WorkerEnv.env_name("checkpoint_dir")], "go")
    while not os.path.exists(go):
        time.sleep(0.1)
    sys.exit(3)
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (24 << 20))
except OSError:
    os.remove("/tmp/big")  # so the reason is the rlimit's, not the disk watch's
    raise
"""


def test_a_rank_on_a_warm_interpreter_runs_under_the_same_limits(gateway, tmp_path):
    client, home, _token = gateway
    script = tmp_path / "train.py"
    script.write_text(WARM_THEN_BIG_FILE)
    job = client.submit_script(script, max_restarts=1, disk_limit="16MiB")
    wait_for(lambda: _warm_ready(job.id), 240, "a warm interpreter")  # shared cores: slow
    (home / "jobs" / job.id / "checkpoints" / "go").touch()
    record = job.wait(timeout=180)
    assert record.state is JobState.FAILED, record.state_reason
    assert record.failure is not None and record.failure.kind == "limit", record.failure
    assert "disk limit: rank 0 wrote a file past 16 MiB" in record.failure.reason, record.failure
    log = (home / "jobs" / job.id / "attempts" / "2" / "nodes" / "node-0.log").read_text()
    assert "(1 of 1 on warm interpreters)" in log
    assert f"attempt 2 RLIMIT_FSIZE {16 << 20}" in log


def test_a_job_under_all_its_limits_succeeds(client, tmp_path):
    record = _run(
        client,
        tmp_path,
        """
        import os, threading, time
        import air_sdk.runtime as air
        data = bytearray(b"x" * (32 << 20))
        with open(os.path.join(air.output_dir(), "result"), "wb") as f:
            f.write(os.urandom(4 << 20))
        threads = [threading.Thread(target=time.sleep, args=(3,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("done", len(data), flush=True)
        """,
        memory_limit="512MiB",
        max_processes=64,
        disk_limit="128MiB",
    )
    assert record.state is JobState.SUCCEEDED, (record.state_reason, record.failure)


def test_a_job_asking_more_than_the_operators_cap_is_refused_at_submit(client, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    with pytest.raises(AirError, match="memory limit 4 GiB is over this gateway's cap of 1 GiB"):
        client.submit_script(script, memory_limit="4GiB")
    with pytest.raises(AirError, match="process limit 1000 is over this gateway's cap of 256"):
        client.submit_script(script, max_processes=1000)
