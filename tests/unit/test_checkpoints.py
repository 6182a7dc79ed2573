"""`air_sdk.checkpoints.export` and `air checkpoints export` on the client: a job id is
looked up on the gateway (a fake one here), its checkpoint read from this machine, and a
checkpoint this machine cannot reach is refused with what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import air_sdk  # noqa: E402
from air_sdk.cli import main as cli  # noqa: E402
from air_sdk.client import Client  # noqa: E402
from air_sdk.client._http import mock_response, mock_session  # noqa: E402
from air_sdk.errors import CheckpointError  # noqa: E402
from air_sdk.runtime import checkpoint  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer  # noqa: E402

runner = CliRunner()


class Shipper:
    def add_checkpoint(self, record: dict[str, Any]) -> None:
        pass

    def flush(self, timeout: float = 10.0) -> bool:
        return True

    def heartbeat(self) -> None:
        pass


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIR_CHECKPOINT_DIR", "AIR_PARALLELISM", "RANK", "WORLD_SIZE", "AIR_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checkpoint, "_default", None)
    monkeypatch.setattr("air_sdk.runtime._shipper.get_shipper", Shipper)


def commit(step: int, path: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "step": step,
        "path": path,
        "world_size": 2,
        "size_bytes": 1,
        "num_files": 3,
        "blocked_s": 0.0,
        "durable_s": 0.1,
        "attempt": attempt,
    }


def fake_gateway(commits: dict[str, list[dict[str, Any]]]) -> Client:
    """A gateway that knows `GET /v1/jobs/{id}/checkpoints` of the jobs in `commits`."""

    def handle(request: requests.PreparedRequest) -> requests.Response:
        parts = urlsplit(request.url or "").path.strip("/").split("/")
        if parts[:2] == ["v1", "jobs"] and parts[3:] == ["checkpoints"]:
            if parts[2] not in commits:
                return mock_response(404, {"detail": f"no job {parts[2]}"})
            return mock_response(200, {"commits": commits[parts[2]]})
        return mock_response(404, {"detail": "not here"})

    return Client("http://gw.test", token="t", session=mock_session(handle), max_attempts=1)


def saved(directory: Path, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """A model checkpointed at `steps`; its parameters at each."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optim = torch.optim.SGD(model.parameters(), lr=0.5)
    ckpt, at = Checkpointer(directory), {}
    for step in steps:
        model(torch.randn(2, 3)).sum().backward()
        optim.step()
        ckpt.save({"model": model, "optim": optim}, step=step, block=True)
        at[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return at


def equal(path: Path, expected: dict[str, torch.Tensor]) -> bool:
    got = safetensors_torch.load_file(path)
    return got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


def test_a_jobs_checkpoint_is_found_through_the_gateway_and_exported(tmp_path: Path) -> None:
    at = saved(tmp_path / "ckpt", [10, 20])
    client = fake_gateway(
        {
            "train-1": [
                commit(10, str(tmp_path / "ckpt" / "step-10")),
                commit(20, str(tmp_path / "ckpt" / "step-20")),
            ]
        }
    )
    done = air_sdk.checkpoints.export("train-1", to=tmp_path / "new.safetensors", client=client)
    assert done.step == 20 and equal(tmp_path / "new.safetensors", at[20])
    air_sdk.checkpoints.export("train-1", 10, tmp_path / "old.safetensors", client=client)
    assert equal(tmp_path / "old.safetensors", at[10])
    with pytest.raises(
        CheckpointError, match="job train-1 has no checkpoint of step 15; it has 10, 20"
    ):
        air_sdk.checkpoints.export("train-1", 15, tmp_path / "x.safetensors", client=client)


def test_a_directory_only_the_gateway_reads_is_refused_with_what_to_do(tmp_path: Path) -> None:
    elsewhere = "/srv/air-gateway-home/jobs/train-2/checkpoints/step-5"  # not on this machine
    client = fake_gateway({"train-2": [commit(5, elsewhere)], "train-3": []})
    with pytest.raises(CheckpointError) as caught:
        air_sdk.checkpoints.export("train-2", to=tmp_path / "m.safetensors", client=client)
    message = str(caught.value)
    assert f"is at {elsewhere} on the gateway's machine, which this machine cannot read" in message
    assert f"air checkpoints export {elsewhere} --to FILE" in message
    assert "CheckpointSpec(dir='s3://bucket/run')" in message
    with pytest.raises(CheckpointError, match="job train-3 has committed no checkpoint yet"):
        air_sdk.checkpoints.export("train-3", to=tmp_path / "m.safetensors", client=client)
    assert not (tmp_path / "m.safetensors").exists()


def test_a_step_removed_by_retention_says_so(tmp_path: Path) -> None:
    saved(tmp_path / "ckpt", [1])
    (tmp_path / "ckpt" / "step-0").mkdir()  # the directory is there, its manifest is gone
    client = fake_gateway({"train-4": [commit(0, str(tmp_path / "ckpt" / "step-0"))]})
    with pytest.raises(CheckpointError, match=r"is gone: retention keeps the newest few"):
        air_sdk.checkpoints.export("train-4", 0, tmp_path / "m.safetensors", client=client)


def test_the_cli_exports_a_job_or_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = saved(tmp_path / "ckpt", [3])
    client = fake_gateway({"train-5": [commit(3, str(tmp_path / "ckpt" / "step-3"))]})
    monkeypatch.setattr(cli, "make_client", lambda *a, **k: client)
    out = tmp_path / "model.safetensors"
    result = runner.invoke(cli.app, ["checkpoints", "export", "train-5", "--to", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "step 3, 4 tensors" in result.output
    assert equal(out, at[3])
    result = runner.invoke(
        cli.app,
        [
            "checkpoints",
            "export",
            str(tmp_path / "ckpt"),
            "--step",
            "3",
            "--to",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"num_tensors": 4' in result.output
    result = runner.invoke(
        cli.app, ["checkpoints", "export", str(tmp_path / "ckpt"), "--step", "9", "--to", str(out)]
    )
    assert result.exit_code == 1
    assert "error: no committed checkpoint of step 9" in result.output


def test_the_cli_still_lists_a_jobs_checkpoints_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    client = fake_gateway({"train-6": [commit(10, "/ckpt/step-10")]})
    monkeypatch.setattr(cli, "make_client", lambda *a, **k: client)
    for argv in (["checkpoints", "train-6"], ["checkpoints", "list", "train-6"]):
        result = runner.invoke(cli.app, argv)
        assert result.exit_code == 0, result.output
        assert "/ckpt/step-10" in result.output
    result = runner.invoke(cli.app, ["checkpoints", "--json", "train-6"])
    assert result.exit_code == 0 and '"step": 10' in result.output


def test_the_checkpoint_path_is_whole_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    # `air checkpoints JOB | grep` must see the whole path, not one cut to fit 80 columns
    path = "/shared/checkpoints/" + "a-long-project-name/" * 4 + "train-6/step-10"
    client = fake_gateway({"train-6": [commit(10, path)]})
    monkeypatch.setattr(cli, "make_client", lambda *a, **k: client)
    result = runner.invoke(cli.app, ["checkpoints", "train-6"])
    assert result.exit_code == 0, result.output
    assert path in result.output
