"""The `air` command against a fake gateway (mock transport injected via `make_client`)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from clitest import URL, FakeGateway, flat, invoke

from air_sdk.cli import main as cli
from air_sdk.client import Client, _http
from air_sdk.client._http import mock_session
from air_sdk.schema import JobRecord, JobState
from air_sdk.schema.api import FailureInfo, JobStatus

# -- argument errors: exit 2, a clear message, nothing sent --------------------


def test_bad_env_is_a_usage_error(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", str(script), "--env", "NOEQUALS")
    assert result.exit_code == 2
    assert "Invalid value for '--env': 'NOEQUALS' is not KEY=VALUE" in flat(result.output)
    assert gateway.requests == []


def test_missing_script_is_a_usage_error(gateway: FakeGateway, tmp_path: Path) -> None:
    result = invoke("submit", str(tmp_path / "nope.py"))
    assert result.exit_code == 2
    assert f"Invalid value for 'SCRIPT': file '{tmp_path / 'nope.py'}' does not exist" in flat(
        result.output
    )
    assert gateway.requests == []


def test_invalid_spec_from_flags_is_one_clean_line(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", str(script), "--nodes", "0", "--env", "RANK=1")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    # in the flags typed, not the spec's field names and pydantic's words
    assert "--nodes 0: must be at least 1" in lines[0]
    assert "resources.nodes" not in lines[0] and "Input should be" not in lines[0]
    assert "env RANK is set by AIR" in lines[0]
    assert "Traceback" not in result.output
    assert gateway.requests == []


def test_unreachable_gateway_exits_1_with_the_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_http, "_sleep", lambda s: None)
    monkeypatch.setenv("AIR_CONFIG_FILE", str(tmp_path / "absent.toml"))

    def refuse(request: requests.PreparedRequest) -> requests.Response:
        raise requests.ConnectionError("[Errno 111] Connection refused")

    monkeypatch.setattr(
        cli, "make_client", lambda *a, **k: Client(URL, "t", session=mock_session(refuse))
    )
    result = invoke("jobs")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: could not reach the gateway at {URL}: Connection refused;"
        " start one with `air gateway start`"
    )


def test_unknown_job_exits_1(gateway: FakeGateway) -> None:
    result = invoke("status", "j-404")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: no job j-404 (HTTP 404)"


# -- submit --------------------------------------------------------------------


def test_submit_prints_the_job_id_and_passes_args(gateway: FakeGateway, script: Path) -> None:
    flags = ["--nodes", "2", "-e", "LR=0.1", "--name", "exp1"]
    result = invoke("submit", str(script), *flags, "--", "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "j-1"
    spec = gateway.records["j-1"].spec
    assert spec.args == ["--epochs", "3"]
    assert spec.env == {"LR": "0.1"}
    assert spec.resources.nodes == 2 and spec.name == "exp1"
    assert spec.entrypoint == "train.py" and spec.bundle_sha256


def test_submit_passes_priority_pool_and_accelerator(gateway: FakeGateway, script: Path) -> None:
    flags = ["--priority", "high", "--pool", "any", "--accelerator", "a100"]
    result = invoke("submit", str(script), *flags)
    assert result.exit_code == 0, result.output
    spec = gateway.records["j-1"].spec
    assert (spec.priority, spec.pool, spec.accelerator) == ("high", "any", "a100")


def test_submit_refuses_an_unknown_priority(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", str(script), "--priority", "urgent")
    assert result.exit_code != 0
    assert "urgent" in result.output and gateway.records == {}


@pytest.mark.parametrize(("final", "code"), [(JobState.SUCCEEDED, 0), (JobState.FAILED, 1)])
def test_submit_follow_exit_code_follows_the_job(
    gateway: FakeGateway, script: Path, final: JobState, code: int
) -> None:
    gateway.final_state = final
    result = invoke("submit", str(script), "--follow")
    assert result.exit_code == code, result.output
    assert "final loss" in result.stdout and "0.3333" in result.stdout
    assert final.value in result.stdout
    if final is JobState.FAILED:
        # No FailureInfo on this record: the rank exit and log tail come from the events.
        assert "failed: rank 1 exit code 3" in result.stdout and "boom" in result.stdout


# -- reads ---------------------------------------------------------------------


def test_jobs_json_is_a_list_of_job_records(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    gateway.add_job("j-2", JobState.QUEUED)
    result = invoke("jobs", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [JobRecord.model_validate(d).id for d in data] == ["j-2", "j-1"]  # newest first
    assert data[1]["state"] == "RUNNING" and data[1]["spec"]["resources"]["nodes"] == 2


def test_jobs_state_filter_and_table(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING, name="alpha")
    result = invoke("jobs", "--state", "running")
    assert result.exit_code == 0, result.output
    assert "state=RUNNING" in gateway.requests[-1].url
    for cell in ("j-1", "alpha", "RUNNING", "2 x 1", "1m"):
        assert cell in result.stdout


def test_status_json_is_the_job_record(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    result = invoke("status", "j-1", "--json")
    assert result.exit_code == 0, result.output
    # the record plus `step`, `exports` and `data_loading` (None: no data loading counted)
    status = JobStatus.model_validate(json.loads(result.stdout))
    assert status.data_loading is None and status.exports == {}
    added = {"step", "data_loading", "exports"}
    assert JobRecord(**status.model_dump(exclude=added)) == gateway.records["j-1"]


def test_status_of_a_queued_job_says_why_it_waits_and_where(gateway: FakeGateway) -> None:
    why = "over quota: tenant 't' uses 8 of its 8 GPUs; this job needs 8 more"
    gateway.add_job("j-1", JobState.QUEUED, queue_position=3, queue_reason=why)
    result = invoke("status", "j-1")
    assert result.exit_code == 0, result.output
    assert "queue position: 3" in result.stdout
    assert f"waiting: {why}" in " ".join(result.stdout.split())


def test_status_of_a_failure_names_rank_exit_code_and_tail(gateway: FakeGateway) -> None:
    failure = FailureInfo(
        attempt=1, reason="worker crashed", rank=1, exit_code=3, log_tail=["Traceback", "KeyError"]
    )
    gateway.add_job("j-1", JobState.FAILED, failure=failure, state_reason="rank 1 failed")
    gateway.run_to_end("j-1", JobState.FAILED)
    result = invoke("status", "j-1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "FAILED" in out and "reason: rank 1 failed" in out
    assert "failed: rank 1 exit code 3: worker crashed" in out
    assert "j-1  train  FAILED  2 nodes x 1 rank" in out
    assert "KeyError" in out
    assert "step 3" in out and "loss 0.3333" in out


def test_logs_prefix_lines_with_rank(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    gateway.run_to_end("j-1", JobState.SUCCEEDED)
    result = invoke("logs", "j-1", "--tail", "5", "--rank", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "[rank 1] boom\n"
    assert parse_qs(urlsplit(gateway.requests[-1].url).query) == {"tail": ["5"], "rank": ["1"]}


def test_logs_follow_prints_new_lines_until_the_end(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    gateway.emit("j-1", "log", rank=0, lines=["loading data"])
    gateway.logs_upto = 1  # the page holds the first line; the rest arrives while following
    gateway.run_to_end("j-1", JobState.SUCCEEDED)
    result = invoke("logs", "j-1", "-f")
    assert result.exit_code == 0, result.output
    assert result.stdout == "[rank 0] loading data\n[rank 1] boom\n"
    assert "ended: SUCCEEDED" in result.stderr
    stream = [r for r in gateway.requests if r.path_url.startswith("/v1/jobs/j-1/events/stream")]
    assert parse_qs(urlsplit(stream[0].url).query)["after"] == ["1"]


def test_metrics_table_and_json(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    gateway.run_to_end("j-1", JobState.SUCCEEDED, steps=30)
    table = invoke("metrics", "j-1")
    assert table.exit_code == 0, table.output
    assert "LOSS" in table.stdout.upper()
    assert len([line for line in table.stdout.splitlines() if line.strip()]) == 1 + 20
    rows = json.loads(invoke("metrics", "j-1", "--json", "--all").stdout)
    assert [r["step"] for r in rows] == list(range(1, 31))


def test_metrics_of_a_rank_or_name_the_job_does_not_have_say_so(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    gateway.run_to_end("j-1", JobState.SUCCEEDED, steps=3)
    rank = invoke("metrics", "j-1", "--rank", "5")
    assert rank.exit_code == 2
    assert "job j-1 has ranks 0-1: --rank 5 is none of them" in flat(rank.output)
    name = invoke("metrics", "j-1", "--name", "los")
    assert name.exit_code == 2
    assert "job j-1 logged no metric named 'los'; it logged: loss" in flat(name.output)
    quiet = invoke("metrics", "j-1", "--rank", "1")  # a rank that logged nothing
    assert (quiet.exit_code, quiet.stdout.strip()) == (0, "no metrics yet")


def test_cancel(gateway: FakeGateway) -> None:
    gateway.add_job("j-1", JobState.RUNNING)
    result = invoke("cancel", "j-1")
    assert result.exit_code == 0, result.output
    assert "cancel requested for job j-1" in result.stdout
    assert gateway.records["j-1"].cancel_requested


def test_version() -> None:
    import air_sdk

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"air {air_sdk.__version__}"
