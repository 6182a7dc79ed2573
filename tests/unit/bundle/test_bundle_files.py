"""Extra files sent with a job (`%%air train --files`, `@air_sdk.distributed(files=...)`)."""

from __future__ import annotations

import pytest

from air_sdk.bundle import collect_files
from air_sdk.errors import BundleTooLargeError, SpecError


def test_collect_files_keeps_paths_under_the_root_and_puts_outside_ones_at_the_top(tmp_path):
    root = tmp_path / "project"
    (root / "data" / "__pycache__").mkdir(parents=True)
    (root / "data" / "vocab.txt").write_text("a b")
    (root / "data" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (tmp_path / "shared.bin").write_bytes(b"\1\2")

    files = collect_files(["data", "../shared.bin"], root)

    assert files == {"data/vocab.txt": b"a b", "shared.bin": b"\1\2"}


def test_collect_files_refuses_missing_and_oversized_paths(tmp_path):
    with pytest.raises(SpecError, match=r"--files nope.txt: no such file"):
        collect_files(["nope.txt"], tmp_path)
    (tmp_path / "big.bin").write_bytes(b"0" * 2048)
    with pytest.raises(
        BundleTooLargeError, match=r"2 KiB; the limit is 1 KiB \(largest: big.bin\)"
    ):
        collect_files(["big.bin"], tmp_path, max_bytes=1024)
