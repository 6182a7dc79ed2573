"""`_safe_metadata`: a checkpoint's `.metadata` and non-tensor entries are read outside
the job's sandbox without running anything the job pickled (issue 19, item 6); real
DCP metadata, with tensors, plain values and paths, still loads."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from air_sdk.errors import CheckpointError  # noqa: E402
from air_sdk.runtime.checkpoint._safe_metadata import (  # noqa: E402
    load_metadata,
    load_state,
    safe_reader,
)


class Creates:
    """Unpickled, it creates the file `path` (what a job's pickle could do)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.path), "w"))


def saved(tmp_path: Path, state: dict) -> Path:
    where = tmp_path / "step-1"
    with pytest.warns(UserWarning):  # one process: DCP says it assumes so
        dcp.save(state, checkpoint_id=str(where))
    return where


def load(where: Path, key: str) -> dict:
    state: dict = {}
    load_state(state, dcp.FileSystemReader(str(where)), {key})
    return state


def test_real_metadata_and_plain_entries_load(tmp_path):
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optim.step()
    where = saved(tmp_path, {"model": model.state_dict(), "optim": optim.state_dict()})
    metadata = safe_reader(dcp.FileSystemReader(str(where))).read_metadata()
    assert "model.weight" in metadata.state_dict_metadata
    state = load(where, "optim")
    assert state["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)  # plain values
    assert torch.equal(load(where, "model")["model"]["weight"], model.weight)


def test_a_pickled_metadata_that_runs_code_is_refused(tmp_path):
    where = saved(tmp_path, {"model": torch.nn.Linear(2, 2).state_dict()})
    marker = tmp_path / "created"
    (where / ".metadata").write_bytes(pickle.dumps(Creates(marker)))
    with pytest.raises(CheckpointError, match="is not DCP metadata: it asks for io.open"):
        safe_reader(dcp.FileSystemReader(str(where))).read_metadata()
    with pytest.raises(CheckpointError, match="export refuses to run code"):
        load(where, "model")
    assert not marker.exists()


def test_a_non_tensor_entry_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "created"
    # DCP pickles a non-tensor value with torch.save: the job chose what it unpickles to
    where = saved(tmp_path, {"model": {"w": torch.ones(2), "evil": Creates(marker)}})
    with pytest.raises(CheckpointError, match="'model.evil' is not plain data"):
        load(where, "model")
    assert not marker.exists()


def test_something_else_than_metadata_is_refused(tmp_path):
    raw = tmp_path / "m"
    raw.write_bytes(pickle.dumps({"a": 1}))
    with raw.open("rb") as f, pytest.raises(CheckpointError, match="holds a dict"):
        load_metadata(f, "ckpt")
