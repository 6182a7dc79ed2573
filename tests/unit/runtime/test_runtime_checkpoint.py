"""air.checkpoint in one process (no process group): what is saved comes back, only committed
and intact checkpoints are restored, failures say so. Multi-rank runs: test_runtime_checkpoint_dist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import air_sdk.runtime as air  # noqa: E402
from air_sdk.errors import AirError  # noqa: E402
from air_sdk.runtime import _dist, checkpoint  # noqa: E402
from air_sdk.runtime._storage import LocalStorage  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer, CheckpointError  # noqa: E402
from air_sdk.schema.events import CheckpointCommit, CheckpointRestore, CheckpointSkip  # noqa: E402


class Recorder:
    """Stands in for the shipper: keeps what would be posted to the gateway."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add_checkpoint(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def flush(self, timeout: float = 10.0) -> bool:
        return True


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    for name in ("AIR_CHECKPOINT_DIR", "AIR_CHECKPOINT_KEEP", "RANK", "WORLD_SIZE", "AIR_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checkpoint, "_default", None)
    recorder = Recorder()
    monkeypatch.setattr("air_sdk.runtime._shipper.get_shipper", lambda: recorder)
    return recorder


def make_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = air.resumable_loader(list(range(12)), batch_size=2, num_replicas=1, rank=0, seed=1)
    return {"model": model, "optim": optim, "data": loader, "epoch": 0, "best": {"loss": 9.0}}


def train(state: dict[str, Any], num_steps: int) -> None:
    it = iter(state["data"])
    for _ in range(num_steps):
        x = torch.randn(3, 4)
        state["optim"].zero_grad()
        state["model"](x).pow(2).mean().backward()
        state["optim"].step()
        next(it)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def save_steps(ckpt: Checkpointer, state: dict[str, Any], steps: list[int]) -> None:
    for step in steps:
        train(state, 1)
        ckpt.save(state, step=step)
    ckpt.wait()


def test_load_restores_model_optimizer_data_position_and_plain_values(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 3)
    state["epoch"], state["best"] = 2, {"loss": 0.5}
    ckpt.save(state, step=30)
    assert ckpt.wait() == 30
    saved = params(state["model"])
    saved_optim = state["optim"].state_dict()

    fresh = make_state(seed=1)  # other weights, an optimizer with no state yet
    assert ckpt.load(fresh) == 30
    assert all(torch.equal(v, saved[k]) for k, v in params(fresh["model"]).items())
    got_optim = fresh["optim"].state_dict()
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(got_optim["state"][0][key], saved_optim["state"][0][key])
    assert fresh["data"].state_dict() == state["data"].state_dict()
    assert fresh["data"].state_dict()["index"] == 6
    assert fresh["epoch"] == 2 and fresh["best"] == {"loss": 0.5}


def test_save_returns_before_the_write_and_keeps_what_the_state_was(tmp_path: Path) -> None:
    release = threading.Event()

    class SlowStorage(LocalStorage):
        def writer(self, path: str) -> Any:
            writer = super().writer(path)
            write_data = writer.write_data

            def held(*args: Any) -> Any:
                assert release.wait(30)
                return write_data(*args)

            writer.write_data = held  # type: ignore[method-assign]
            return writer

    ckpt = Checkpointer(storage=SlowStorage(tmp_path))
    state = make_state()
    ckpt.save(state, step=1)  # returns while the writer is still held
    before = params(state["model"])
    with torch.no_grad():
        for p in state["model"].parameters():
            p.add_(1.0)  # training goes on while the checkpoint is written
    assert ckpt.latest() is None  # not committed yet: nothing to restore
    assert not (tmp_path / "step-1" / "manifest.json").exists()
    release.set()
    assert ckpt.wait() == 1
    assert ckpt.latest() == 1
    fresh = make_state(seed=5)
    ckpt.load(fresh)
    assert all(torch.equal(v, before[k]) for k, v in params(fresh["model"]).items())


def test_the_manifest_is_written_last_and_lists_every_file(
    tmp_path: Path, one_process: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIR_JOB_ID", "job-7")
    monkeypatch.setenv("AIR_ATTEMPT", "2")
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    train(state, 2)
    ckpt.save(state, step=5, block=True)
    directory = tmp_path / "step-5"
    manifest = json.loads((directory / "manifest.json").read_text())
    on_disk = {p.name for p in directory.iterdir()} - {"manifest.json"}
    assert {f["path"] for f in manifest["files"]} == on_disk
    assert {".metadata", "__0_0.distcp"} <= on_disk
    for entry in manifest["files"]:
        assert entry["size"] == (directory / entry["path"]).stat().st_size
    assert manifest["step"] == 5 and manifest["world_size"] == 1 and manifest["format"] == 1
    assert manifest["job_id"] == "job-7" and manifest["attempt"] == 2
    assert manifest["data_position"] == {"data": state["data"].state_dict()}
    assert not (directory / "manifest.json.tmp").exists()
    (record,) = one_process.records
    commit = CheckpointCommit.model_validate(record)  # what the gateway will accept
    assert (commit.step, commit.path, commit.num_files) == (5, str(directory), len(on_disk))
    assert commit.size_bytes == sum(f["size"] for f in manifest["files"])
    assert 0 <= commit.blocked_s <= commit.durable_s and commit.attempt == 2


def test_a_truncated_checkpoint_is_skipped_for_the_previous_one_and_reported(
    tmp_path: Path, one_process: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    save_steps(ckpt, state, [10])
    at_10 = params(state["model"])
    save_steps(ckpt, state, [20])
    data_file = tmp_path / "step-20" / "__0_0.distcp"
    data_file.write_bytes(data_file.read_bytes()[:100])  # a torn write
    one_process.records.clear()

    fresh = make_state(seed=3)
    assert ckpt.load(fresh) == 10
    assert all(torch.equal(v, at_10[k]) for k, v in params(fresh["model"]).items())
    err = capsys.readouterr().err
    assert "skipped checkpoint step 20: file __0_0.distcp" in err
    assert "does not match its manifest" in err
    record, restored = one_process.records  # the skip, then the step it resumed from
    skip = CheckpointSkip.model_validate(record)
    assert CheckpointRestore.model_validate(restored).step == 10
    assert skip.step == 20 and "__0_0.distcp" in skip.skipped
    assert ckpt.latest() == 20  # committed, just not intact: latest() does not hash

    (tmp_path / "step-10" / "__0_0.distcp").write_bytes(b"x" * 7)  # now neither is intact
    assert ckpt.load(make_state()) is None
    with pytest.raises(CheckpointError, match="cannot restore step 10"):
        ckpt.load(make_state(), step=10)


def test_a_flipped_byte_of_the_same_size_is_caught_by_its_hash(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    save_steps(ckpt, state, [1, 2])
    data_file = tmp_path / "step-2" / "__0_0.distcp"
    raw = bytearray(data_file.read_bytes())
    raw[-10] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    assert ckpt.load(make_state()) == 1


def test_a_directory_without_a_manifest_does_not_exist_for_restore(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    state = make_state()
    save_steps(ckpt, state, [3])
    # what a crash mid-save leaves: DCP's data and even its .metadata, but no manifest
    (tmp_path / "step-9").mkdir()
    for name in (".metadata", "__0_0.distcp"):
        (tmp_path / "step-9" / name).write_bytes((tmp_path / "step-3" / name).read_bytes())
    (tmp_path / "step-11").mkdir()  # and an empty one
    assert ckpt.latest() == 3
    assert ckpt.load(make_state()) == 3


def test_an_invalid_manifest_is_skipped_and_reported(tmp_path: Path, one_process: Recorder) -> None:
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, make_state(), [1, 2])
    manifest = tmp_path / "step-2" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["files"][0]["path"] = "../../etc/passwd"
    manifest.write_text(json.dumps(body))
    one_process.records.clear()
    assert ckpt.latest() == 1
    assert ckpt.load(make_state()) == 1
    assert "not a plain file name" in one_process.records[0]["skipped"]


def test_retention_keeps_exactly_the_newest_k(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "step-1").mkdir()  # an old leftover of a failed save: cleaned up too
    ckpt = Checkpointer(tmp_path, keep=2)
    state = make_state()
    save_steps(ckpt, state, [2, 4, 6, 8])
    assert sorted(os.listdir(tmp_path)) == ["step-6", "step-8"]
    monkeypatch.setenv("AIR_CHECKPOINT_KEEP", "1")
    from_env = Checkpointer(tmp_path)
    save_steps(from_env, state, [10])
    assert sorted(os.listdir(tmp_path)) == ["step-10"]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Checkpointer(tmp_path, keep=0)


def test_a_leftover_at_the_same_step_is_moved_aside_never_written_into(tmp_path: Path) -> None:
    leftover = tmp_path / "step-4"
    leftover.mkdir(parents=True)
    (leftover / ".metadata").write_bytes(b"stale metadata of a failed attempt")
    (leftover / "__3_0.distcp").write_bytes(b"a rank that no longer exists")
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, make_state(), [4])
    assert sorted(p.name for p in leftover.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "manifest.json",
    ]
    assert (leftover / ".metadata").read_bytes() != b"stale metadata of a failed attempt"
    assert sorted(os.listdir(tmp_path)) == ["step-4"]
    assert ckpt.load(make_state()) == 4


class FailingStorage(LocalStorage):
    """Every write fails the way a full disk would."""

    def writer(self, path: str) -> Any:
        writer = super().writer(path)

        def full(*args: Any) -> Any:
            raise OSError(28, "No space left on device")

        writer.write_data = full  # type: ignore[method-assign]
        return writer


def test_a_failed_background_write_is_a_checkpoint_error_and_keeps_the_old_copy(
    tmp_path: Path, one_process: Recorder
) -> None:
    good = Checkpointer(tmp_path)
    state = make_state()
    save_steps(good, state, [7])
    at_7 = params(state["model"])
    one_process.records.clear()

    failing = Checkpointer(storage=FailingStorage(tmp_path))
    train(state, 1)
    failing.save(state, step=7)  # the same step again: the committed copy is moved aside
    with pytest.raises(CheckpointError, match="No space left on device") as caught:
        failing.wait()
    assert isinstance(caught.value, AirError)
    assert "step 7 was not committed" in str(caught.value)
    assert failing.wait() is None  # reported once
    assert one_process.records == []  # nothing committed, nothing reported
    assert [n for n in os.listdir(tmp_path) if not n.startswith(".trash")] == ["step-7"]
    fresh = make_state(seed=4)
    assert good.load(fresh) == 7  # the earlier commit of step 7 is back in place
    assert all(torch.equal(v, at_7[k]) for k, v in params(fresh["model"]).items())

    failing.save(state, step=8)
    with pytest.raises(CheckpointError, match="step 8 was not committed"):
        failing.save(state, step=9)  # the next save reports the one before it


def test_a_state_the_checkpoint_does_not_have_is_a_checkpoint_error(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, make_state(), [1])
    state = make_state()
    state["scheduler_step"] = 3  # a key added after the checkpoint was taken
    with pytest.raises(CheckpointError, match="checkpoint load failed"):
        ckpt.load(state)


def test_without_a_directory_nothing_resumes_and_save_says_what_to_set() -> None:
    assert air.checkpoint.load(make_state()) is None
    assert air.checkpoint.latest() is None
    with pytest.raises(CheckpointError, match="AIR_CHECKPOINT_DIR"):
        air.checkpoint.save(make_state(), step=1)


def test_the_module_api_uses_air_checkpoint_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIR_CHECKPOINT_DIR", str(tmp_path / "env"))
    state = make_state()
    air.checkpoint.save(state, step=12)
    assert air.checkpoint.wait() == 12
    assert air.checkpoint.latest() == 12
    assert air.checkpoint.load(make_state()) == 12
    configured = air.checkpoint.configure(tmp_path / "other", keep=1)
    assert configured.keep == 1 and air.checkpoint.latest() is None
    air.checkpoint.save(state, step=13)
    air.checkpoint.close()
    assert os.listdir(tmp_path / "other") == ["step-13"]


def test_an_optimizer_without_its_module_is_refused(tmp_path: Path) -> None:
    state = make_state()
    del state["model"]
    with pytest.raises(CheckpointError, match="put the model in the state"):
        Checkpointer(tmp_path).save(state, step=1)
    assert not (tmp_path / "step-1").exists()


def test_fsspec_urls_work_through_the_same_protocol() -> None:
    url = "memory://air-test-fsspec/run"
    ckpt = Checkpointer(url, keep=2)
    state = make_state()
    save_steps(ckpt, state, [1, 2, 3])
    saved = params(state["model"])
    assert ckpt.latest() == 3
    assert ckpt.storage is not None
    assert ckpt.storage.list_dir(url) == ["step-2", "step-3"]
    fresh = make_state(seed=2)
    assert ckpt.load(fresh) == 3
    assert all(torch.equal(v, saved[k]) for k, v in params(fresh["model"]).items())
    ckpt.storage.remove_tree(url)


def test_air_checkpoint_is_exported_lazily_and_latest_needs_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys, air_sdk.runtime as air\n"
        "assert 'air_sdk.runtime.checkpoint' not in sys.modules\n"
        f"print(air.checkpoint.Checkpointer({str(tmp_path)!r}).latest(), 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["None", "False"]
    assert "checkpoint" in air.__all__ and "resumable_loader" in air.__all__


def test_air_shutdown_commits_the_save_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_dist, "_shut_down", False)
    release = threading.Event()

    class SlowStorage(LocalStorage):
        def writer(self, path: str) -> Any:
            writer = super().writer(path)
            write_data = writer.write_data
            writer.write_data = lambda *a: release.wait(30) and write_data(*a)  # type: ignore[method-assign]
            return writer

    ckpt = Checkpointer(storage=SlowStorage(tmp_path))
    ckpt.save(make_state(), step=3)
    threading.Timer(0.2, release.set).start()
    _dist.shutdown()  # waits for the commit before it would destroy the process group
    assert (tmp_path / "step-3" / "manifest.json").exists()
    assert ckpt.wait() is None  # nothing left in flight


def test_a_script_that_just_exits_still_commits_its_last_save(tmp_path: Path) -> None:
    script = (
        "import torch, air_sdk.runtime as air\n"
        f"air.checkpoint.configure({str(tmp_path)!r})\n"
        "air.checkpoint.save({'model': torch.nn.Linear(512, 512), 'step': 1}, step=1)\n"
        "raise SystemExit(0)  # no wait(), no shutdown(): the exit hook commits it\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    assert Checkpointer(tmp_path).latest() == 1


def test_a_checkpoint_from_before_optimizers_were_saved_by_name_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AIR once saved an optimizer unflattened (`param_groups` as a list) and wrote no
    `state_kinds` in the manifest; such a checkpoint loads as it was saved."""
    import functools
    import pickle

    from air_sdk.runtime.checkpoint import _adapters, _checkpointer

    as_before = functools.partial(_adapters.stateful, flat_optimizers=False)
    monkeypatch.setattr(_checkpointer, "stateful", as_before)
    state = make_state()
    train(state, 2)
    Checkpointer(tmp_path).save(state, step=2, block=True)
    monkeypatch.setattr(_checkpointer, "stateful", _adapters.stateful)
    metadata = pickle.loads((tmp_path / "step-2" / ".metadata").read_bytes())
    assert "optim.param_groups.0.params" in metadata.state_dict_metadata  # the old layout
    manifest = tmp_path / "step-2" / "manifest.json"
    body = json.loads(manifest.read_text())
    del body["state_kinds"]
    manifest.write_text(json.dumps(body))

    fresh = make_state(seed=1)
    assert Checkpointer(tmp_path).load(fresh) == 2
    assert all(torch.equal(v, params(state["model"])[k]) for k, v in params(fresh["model"]).items())
    want, got = state["optim"].state_dict()["state"], fresh["optim"].state_dict()["state"]
    assert all(torch.equal(got[i]["exp_avg"], want[i]["exp_avg"]) for i in want)
