"""The checkpoint tree's pieces without torch: manifests, the retention policy, and both
CheckpointStorage implementations behaving alike."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_sdk.runtime._manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    committed_manifest,
    list_step_dirs,
    parse_step_dir,
    retention_victims,
    verify_files,
)
from air_sdk.runtime._storage import (
    CheckpointStorage,
    FsspecStorage,
    LocalStorage,
    storage_for,
)

SHA = "ab" * 32


def manifest_body(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "format": 1,
        "step": 4,
        "world_size": 2,
        "created_at": 1.5,
        "job_id": "j",
        "attempt": 1,
        "files": [{"path": "__0_0.distcp", "size": 3, "sha256": SHA}],
    }
    body.update(changes)
    return body


def test_a_manifest_round_trips_and_carries_what_the_contract_names() -> None:
    manifest = Manifest(
        step=4,
        world_size=2,
        files=(FileEntry(".metadata", 10, SHA), FileEntry("__1_0.distcp", 20, SHA)),
        job_id="j",
        attempt=3,
        data_position={"data": {"epoch": 1, "index": 8}},
    )
    body = json.loads(manifest.to_json())
    assert set(body) == {
        "format",
        "step",
        "world_size",
        "created_at",
        "job_id",
        "attempt",
        "data_position",
        "files",
    }
    assert body["files"][1] == {"path": "__1_0.distcp", "size": 20, "sha256": SHA}
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.size_bytes == 30
    assert "data_position" not in json.loads(Manifest(step=1, world_size=1, files=()).to_json())
    with pytest.raises(ManifestError, match="not JSON"):
        Manifest.from_json(b'{"format": 1,')  # a torn write (the rename makes this unlikely)


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"format": 2}, "format"),
        ({"step": -1}, "'step'"),
        ({"step": "4"}, "'step'"),
        ({"world_size": 0}, "'world_size'"),
        ({"files": []}, "'files'"),
        ({"files": [{"path": "../x", "size": 1, "sha256": SHA}]}, "plain file name"),
        ({"files": [{"path": "a/b", "size": 1, "sha256": SHA}]}, "plain file name"),
        ({"files": [{"path": "a", "size": 1, "sha256": "XY"}]}, "sha256"),
        ({"files": [{"path": "a", "size": True, "sha256": SHA}]}, "'size'"),
        ({"data_position": [1]}, "data_position"),
    ],
)
def test_an_invalid_manifest_says_what_is_wrong(changes: dict[str, object], complaint: str) -> None:
    with pytest.raises(ManifestError, match=complaint):
        Manifest.from_json(json.dumps(manifest_body(**changes)).encode())


def test_only_canonical_step_directories_count() -> None:
    assert [
        parse_step_dir(n) for n in ("step-0", "step-12", "step-012", "step-x", "step-3.tmp")
    ] == [
        0,
        12,
        None,
        None,
        None,
    ]
    assert parse_step_dir(".replaced-step-4-abcd1234") is None


def test_retention_keeps_the_newest_k_and_never_the_one_just_committed() -> None:
    dirs = [(2, True), (4, True), (6, True), (8, True)]
    assert retention_victims(dirs, keep=2, just_committed=8) == [4, 2]
    assert retention_victims(dirs, keep=10, just_committed=8) == []
    # a committed step 9 of an earlier, diverged run counts as newer, but step 5 stays
    assert retention_victims([(9, True), (5, True), (3, True)], keep=1, just_committed=5) == [3]
    # uncommitted: older ones are leftovers of failed saves; newer ones are left alone
    assert retention_victims([(1, False), (4, True), (7, False)], keep=1, just_committed=4) == [1]


@pytest.fixture(params=["local", "fsspec-file", "fsspec-memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStorage]:
    if request.param == "local":
        yield LocalStorage(tmp_path / "root")
    elif request.param == "fsspec-file":
        yield FsspecStorage(f"file://{tmp_path}/root")
    else:
        url = f"memory://air-{uuid.uuid4().hex}/root"
        memory = FsspecStorage(url)
        yield memory
        memory.remove_tree(url)


def test_every_storage_implements_the_protocol_alike(storage: CheckpointStorage) -> None:
    assert isinstance(storage, CheckpointStorage)
    step = storage.join(storage.root, "step-3")
    storage.make_dirs(step)
    storage.make_dirs(storage.join(storage.root, "step-10"))
    payload = b"checkpoint bytes" * 100
    data_file = storage.join(step, "__0_0.distcp")
    storage.write_atomic(data_file, payload)
    assert not storage.exists(data_file + ".tmp")
    assert storage.read_bytes(data_file) == payload
    assert storage.size(data_file) == len(payload)
    assert storage.digest(data_file) == (len(payload), hashlib.sha256(payload).hexdigest())
    assert storage.list_dir(storage.root) == ["step-10", "step-3"]
    assert storage.list_dir(storage.join(storage.root, "nope")) == []
    assert list_step_dirs(storage) == [
        (10, storage.join(storage.root, "step-10")),
        (3, step),
    ]
    storage.sync_dir(step)

    entry = FileEntry("__0_0.distcp", len(payload), hashlib.sha256(payload).hexdigest())
    assert verify_files(storage, step, [entry]) == []
    storage.write_atomic(data_file, payload[:-1] + b"!")
    assert verify_files(storage, step, [entry]) == [
        "__0_0.distcp: sha256 does not match the manifest"
    ]
    storage.write_atomic(data_file, payload[:10])
    assert "10 bytes, the manifest says 1600" in verify_files(storage, step, [entry])[0]
    storage.remove_file(data_file)
    storage.remove_file(data_file)  # twice: no error
    assert verify_files(storage, step, [entry]) == ["__0_0.distcp: missing"]

    assert committed_manifest(storage, step, 3) is None  # no manifest: not committed
    storage.write_atomic(storage.join(step, "manifest.json"), json.dumps(manifest_body()).encode())
    with pytest.raises(ManifestError, match="names step 4"):
        committed_manifest(storage, step, 3)

    aside = storage.join(storage.root, ".trash-step-3-0000")
    storage.move(step, aside)
    assert not storage.exists(step) and storage.exists(storage.join(aside, "manifest.json"))
    storage.remove_tree(aside)
    storage.remove_tree(aside)
    assert storage.list_dir(storage.root) == ["step-10"]


def test_storage_for_picks_by_scheme(tmp_path: Path) -> None:
    assert isinstance(storage_for(tmp_path), LocalStorage)
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), FsspecStorage)
    assert storage_for("memory://bucket/run/").root == "memory://bucket/run"
