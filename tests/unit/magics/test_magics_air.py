"""`%%air train` and the `%air` line magics against a fake client: what they submit,
show and store, and how they refuse bad options."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import magics.air as air_magics
from air_sdk.client import Job
from air_sdk.errors import JobFailedError, TransportError
from air_sdk.notebook.capture import CELL_PICKLE, CellCaptureError
from air_sdk.schema.api import FailureInfo, JobRecord, LogLine, LogPage
from air_sdk.schema.spec import JobSpec
from air_sdk.schema.state import JobState


class FakeClient:
    """What the magics call on a `Client`, recorded; jobs stay QUEUED unless told."""

    gateway_url = "http://gw.test"

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []
        self.records: dict[str, JobRecord] = {}
        self.num_record_reads = 0
        self.end_after_reads: int | None = None
        self.final_state = JobState.SUCCEEDED
        self.posts: list[str] = []

    def _record(self, job_id: str, spec: JobSpec, state: JobState, **extra: Any) -> JobRecord:
        now = time.time()
        record = JobRecord(
            id=job_id,
            tenant="t",
            name=spec.name,
            state=state,
            spec=spec,
            created_at=now - 75,
            updated_at=now,
            **extra,
        )
        self.records[job_id] = record
        return record

    def submit(self, spec: JobSpec, *, workdir: Any = None, extra_files: Any = None) -> Job:
        self.submitted.append({"spec": spec, "workdir": workdir, "files": dict(extra_files)})
        return Job(self, self._record(f"j-{len(self.submitted)}", spec, JobState.QUEUED))  # type: ignore[arg-type]

    def job_record(self, job_id: str) -> JobRecord:
        self.num_record_reads += 1
        record = self.records[job_id]
        if self.end_after_reads is not None and self.num_record_reads >= self.end_after_reads:
            extra: dict[str, Any] = {}
            if self.final_state is JobState.FAILED:
                extra = {
                    "state_reason": "rank 1 exit code 3",
                    "failure": FailureInfo(attempt=1, reason="worker crashed", rank=1, exit_code=3),
                }
            record = self._record(job_id, record.spec, self.final_state, attempt=1, **extra)
        return record

    def job(self, job_id: str) -> Job:
        return Job(self, self.job_record(job_id))  # type: ignore[arg-type]

    def jobs(self, state: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        return list(self.records.values())[:limit]

    def newest_job(self) -> JobRecord | None:
        return list(self.records.values())[-1] if self.records else None

    def _get(self, path: str, model: type, params: dict[str, Any] | None = None) -> Any:
        assert path.endswith("/logs") and model is LogPage
        lines = [LogLine(attempt=1, rank=r, text=f"step {r}") for r in (0, 1)]
        rank, tail = (params or {}).get("rank"), (params or {}).get("tail")
        lines = [line for line in lines if rank is None or line.rank == rank]
        return LogPage(lines=lines[-tail:] if tail else lines, last_seq=3)

    def _post(self, path: str, model: type) -> JobRecord:
        self.posts.append(path)
        job_id = path.split("/")[3]
        record = self.records[job_id]
        return self._record(job_id, record.spec, JobState.CANCELLED, cancel_requested=True)


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    ip = start_ipython() or get_ipython()  # one global test shell per process
    assert ip is not None
    ip.run_line_magic("load_ext", "air_sdk")
    return ip


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeClient]:
    client = FakeClient()
    made: list[tuple[Any, ...]] = []

    def make_client(gateway: str | None = None, token: str | None = None, **kw: Any) -> FakeClient:
        made.append((gateway, token))
        return client

    monkeypatch.setattr(air_magics, "make_client", make_client)
    client.made = made  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    yield client


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Job, dict[str, Any]]]:
    calls: list[tuple[Job, dict[str, Any]]] = []
    monkeypatch.setattr(air_magics, "show_monitor", lambda job, **opts: calls.append((job, opts)))
    return calls


@pytest.fixture(autouse=True)
def _clean_namespace(shell: InteractiveShell) -> Iterator[None]:
    before = set(shell.user_ns)
    yield
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    shell.user_ns.pop("_air_job", None)


def air(shell: InteractiveShell, line: str, cell: str | None = None) -> Any:
    if cell is None:
        return shell.run_line_magic("air", line)
    return shell.run_cell_magic("air", line, cell)


# -- loading and help ----------------------------------------------------------------------


@pytest.mark.parametrize("extension", ["air_sdk", "magics"])
def test_load_ext_registers_the_line_and_cell_magic(shell, extension):
    registry = shell.magics_manager.magics
    registry["line"].pop("air")
    registry["cell"].pop("air")
    shell.extension_manager.loaded.clear()
    assert shell.find_line_magic("air") is None

    shell.run_line_magic("load_ext", extension)

    assert shell.find_line_magic("air") is not None
    assert shell.find_cell_magic("air") is not None
    assert extension in shell.extension_manager.loaded


def test_import_air_sdk_does_not_import_ipython():
    code = "import sys, air_sdk; print('IPython' in sys.modules, 'magics' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_help_lists_every_command_and_option(shell, capsys):
    shell.run_cell("%air?")
    text = capsys.readouterr().out
    for word in (
        "%%air train",
        "%air gateway start|stop|status",
        "%air attach JOB",
        "--nodes",
        "--procs-per-node",
        "--gpus-per-node",
        "--name",
        "--max-restarts",
        "--checkpoint-every",
        "--pool",
        "--priority",
        "--accelerator",
        "--env",
        "--files",
        "--gateway",
        "--wait",
        "--rank",
        "--tail",
    ):
        assert word in text, word


# -- options that must change --------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("train --nodes 0", "x = 1", "argument --nodes/-n: must be 1 or more, not 0"),
        ("train --nodes two", "x = 1", "'two' is not a whole number"),
        ("train --env NOEQUALS", "x = 1", "'NOEQUALS' is not KEY=VALUE (for example --env LR=0.1"),
        ("train --env RANK=3", "x = 1", "env RANK is set by AIR for every rank"),
        ("train --name 'my run'", "x = 1", "name 'my run' must be 1-63 characters"),
        ("train --gpus-per-node 2 --procs-per-node 3", "x = 1", "give one rank per GPU"),
        ("train", "   \n", "the cell is empty"),
        ("train", None, "put `%%air train [options]` on the first line of the cell"),
        ("trian", None, "invalid choice: 'trian'"),
        ("jobs", "x = 1", "`%%air jobs` takes no cell: use the line magic `%air jobs`"),
        ("status j-1 j-2", None, "`%air status` takes at most a job id"),
        ("logs j-1 --nodes 2", None, "--nodes applies to `train` and `gateway`, not to `logs`"),
        ("jobs --rank 1", None, "--rank applies to `logs`, not to `jobs`"),
        ("train extra", "x = 1", "`train` takes no arguments, got 'extra'"),
        ("gateway restart", None, "unknown action; use one of start, stop, status"),
    ],
)
def test_bad_options_raise_a_usage_error_saying_what_to_change(shell, fake, line, cell, message):
    with pytest.raises(UsageError) as info:
        air(shell, line, cell)
    assert message in str(info.value)
    assert fake.submitted == []


# -- %%air train ---------------------------------------------------------------------------


def test_train_submits_the_cell_with_the_options_and_returns_at_once(shell, fake, shown, tmp_path):
    shell.run_cell("def helper(x):\n    return x * 2\nlr = 0.1")
    cell = "import air_sdk.runtime as air\nprint(helper(lr))\n"
    line = (
        "train --nodes 2 --procs-per-node 3 --name mnist-nb --max-restarts 2"
        " --checkpoint-every 50 --pool gpu -e LR=0.1 --env MODE=fast --total-steps 200"
        " --priority high --accelerator h100"
    )

    result = air(shell, line, cell)

    assert result is None  # nothing for Out[] to print a second time
    assert len(fake.submitted) == 1
    submitted = fake.submitted[0]
    spec = submitted["spec"]
    assert (spec.resources.nodes, spec.resources.procs_per_node) == (2, 3)
    assert spec.resources.gpus_per_node == 0
    assert spec.env == {"LR": "0.1", "MODE": "fast"}
    assert (spec.name, spec.max_restarts, spec.pool) == ("mnist-nb", 2, "gpu")
    assert (spec.priority, spec.accelerator) == ("high", "h100")
    assert spec.checkpoint.every_steps == 50
    assert spec.entrypoint is None and repr(cell) in spec.code  # the bootstrap runs the cell
    assert "<air cell>" in spec.code
    assert submitted["workdir"] == tmp_path  # the working directory travels
    assert set(submitted["files"]) == {CELL_PICKLE}
    assert b"helper" in submitted["files"][CELL_PICKLE]
    job = shell.user_ns["_air_job"]
    assert isinstance(job, Job) and job.id == "j-1"
    assert shown == [(job, {"total_steps": 200})]
    assert fake.num_record_reads == 0  # it did not wait for the job


def test_train_defaults_are_one_node_one_rank_on_cpu(shell, fake, shown):
    air(shell, "train", "x = 1")
    spec = fake.submitted[0]["spec"]
    assert (spec.resources.nodes, spec.resources.procs_per_node, spec.resources.gpus_per_node) == (
        1,
        1,
        0,
    )
    assert (spec.name, spec.max_restarts, spec.pool, spec.env) == ("cell", 0, "default", {})
    assert (spec.priority, spec.accelerator) == ("normal", None)
    assert spec.checkpoint.every_steps is None
    assert shown[0][1] == {}


def test_gateway_option_reaches_the_client(shell, fake, shown):
    air(shell, "train --gateway http://10.0.0.5:8470 --gpus-per-node 4", "x = 1")
    assert fake.made == [("http://10.0.0.5:8470", None)]  # type: ignore[attr-defined]
    assert fake.submitted[0]["spec"].resources.gpus_per_node == 4


def test_ipython_expands_variables_in_the_options(shell, fake, shown):
    shell.user_ns["num_nodes"] = 2
    shell.run_cell("%%air train --nodes $num_nodes --env RUN={num_nodes * 3}\nx = 1\n")
    spec = fake.submitted[0]["spec"]
    assert spec.resources.nodes == 2 and spec.env == {"RUN": "6"}


def test_files_travel_with_the_cell(shell, fake, shown, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "vocab.txt").write_text("a b c")
    (tmp_path / "labels.csv").write_text("0,1")
    air(shell, "train --files data labels.csv", "x = 1")
    files = fake.submitted[0]["files"]
    assert files["data/vocab.txt"] == b"a b c"
    assert files["labels.csv"] == b"0,1"


def test_a_value_that_cannot_travel_fails_before_upload_in_one_line(shell, fake, shown):
    shell.run_cell("import threading\nlock = threading.Lock()")
    with pytest.raises(CellCaptureError) as info:
        air(shell, "train", "with lock:\n    pass\n")
    assert str(info.value).startswith("`lock` (_thread.lock) cannot be sent to the workers")
    assert info.value._render_traceback_() == [f"CellCaptureError: {info.value}"]
    assert fake.submitted == [] and shown == []


def test_a_failing_cell_shows_one_line_in_the_notebook(shell, fake, shown, capsys):
    shell.run_cell("import threading\nlock = threading.Lock()")
    result = shell.run_cell("%%air train\nwith lock:\n    pass\n")
    assert isinstance(result.error_in_exec, CellCaptureError)
    out = capsys.readouterr().out
    assert "CellCaptureError: `lock` (_thread.lock) cannot be sent" in out
    assert "Traceback" not in out


def test_wait_blocks_until_the_job_ends_and_shows_the_final_state(shell, fake, shown, capsys):
    fake.end_after_reads = 2
    air(shell, "train --nodes 2 --wait", "x = 1")
    assert fake.num_record_reads == 2
    assert "job j-1 (cell): SUCCEEDED" in capsys.readouterr().out
    assert len(shown) == 1


def test_wait_on_a_failed_job_raises_with_the_reason(shell, fake, shown, capsys):
    fake.end_after_reads = 1
    fake.final_state = JobState.FAILED
    with pytest.raises(JobFailedError, match="job j-1 failed: rank 1 exit code 3"):
        air(shell, "train --wait", "x = 1")
    out = capsys.readouterr().out
    assert "FAILED" in out and "rank 1 exit code 3: worker crashed" in out


# -- line magics ---------------------------------------------------------------------------


def submit_one(shell: InteractiveShell) -> str:
    air(shell, "train --nodes 2", "x = 1")
    return str(shell.user_ns["_air_job"].id)


def test_jobs_shows_a_table_as_html_and_text(shell, fake, shown, monkeypatch):
    submit_one(shell)
    displayed: list[Any] = []
    monkeypatch.setattr(air_magics, "display", displayed.append)
    air(shell, "jobs")
    (table,) = displayed
    text = repr(table)
    assert text.splitlines()[0].split() == [
        "ID",
        "NAME",
        "STATE",
        "NODES",
        "x",
        "PROCS",  # as `air jobs` says it
        "ATTEMPT",
        "AGE",
    ]
    assert text.splitlines()[1].split() == ["j-1", "cell", "QUEUED", "2", "x", "1", "0", "1m"]
    html = table._repr_html_()
    assert html.startswith('<table class="air-jobs">') and "<td>QUEUED</td>" in html


def test_status_logs_and_cancel(shell, fake, shown, capsys):
    job_id = submit_one(shell)
    air(shell, f"status {job_id}")
    assert "job j-1 (cell): QUEUED" in capsys.readouterr().out
    air(shell, f"logs {job_id} --rank 1 --tail 5")
    assert capsys.readouterr().out == "[rank 1] step 1\n"
    air(shell, f"cancel {job_id}")
    assert capsys.readouterr().out == "cancel requested for job j-1 (now CANCELLED)\n"
    assert fake.posts == ["/v1/jobs/j-1/cancel"]


def test_status_without_a_job_is_the_newest_as_in_the_cli(shell, fake, shown, capsys):
    air(shell, "status")
    assert "you have no jobs on http://gw.test yet" in capsys.readouterr().out
    submit_one(shell)
    air(shell, "status")
    out = capsys.readouterr().out
    assert "job j-1: your newest" in out and "job j-1 (cell): QUEUED" in out


def test_attach_shows_the_monitor_again_and_stores_the_job(shell, fake, shown):
    job_id = submit_one(shell)
    shell.user_ns.pop("_air_job")
    air(shell, f"attach {job_id} --total-steps 10")
    job = shell.user_ns["_air_job"]
    assert job.id == job_id
    assert shown[-1] == (job, {"total_steps": 10})


def test_an_unreachable_gateway_is_one_line(shell, monkeypatch, capsys):
    def make_client(*args: Any, **kwargs: Any) -> Any:
        raise TransportError("could not reach the gateway at http://127.0.0.1:9")

    monkeypatch.setattr(air_magics, "make_client", make_client)
    shell.run_cell("%air jobs")
    out = capsys.readouterr().out
    assert "TransportError: could not reach the gateway at http://127.0.0.1:9" in out
    assert "Traceback" not in out


def test_a_cell_whose_value_is_a_state_or_event_type_shows_the_value() -> None:
    from IPython.lib.pretty import pretty

    from air_sdk.schema import EventType, JobState

    assert pretty(JobState.SUCCEEDED) == "SUCCEEDED"  # not <JobState.SUCCEEDED: 'SUCCEEDED'>
    assert pretty(EventType.STATE) == "state" and str(EventType.STATE) == "state"
    assert f"{EventType.METRICS}" == "metrics"
