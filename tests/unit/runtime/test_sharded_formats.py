"""Every shard format round-trips: write shards, `air data index` them (the real CLI),
read every sample back through `ShardedDataset`; a missing or stale index is refused
with the command that fixes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shard_files import SEQ_LEN, SIZES, jsonl_shards, tar_shards, token_shards

from air_sdk.errors import ConfigError, DataError
from air_sdk.runtime.data import ShardedDataset, read_index, write_index
from air_sdk.runtime.data._index import LLMC_HEADER_BYTES

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[3]


def air(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "air_sdk.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def everything(root: Path, **kwargs: object) -> list[object]:
    return list(ShardedDataset(root, shuffle=False, dp_rank=0, dp_size=1, **kwargs))  # type: ignore[arg-type]


def test_token_bins_indexed_by_the_cli_read_back_as_overlapping_sequences(tmp_path: Path) -> None:
    token_shards(tmp_path)
    done = air("data", "index", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["format"] == "tokens" and summary["dtype"] == "uint16"
    assert summary["shards"] == 3 and summary["tokens"] == sum(n * SEQ_LEN + 1 for n in SIZES)
    samples = everything(tmp_path, seq_len=SEQ_LEN)
    assert len(samples) == sum(SIZES)
    first = samples[0]
    assert first.dtype == torch.int64 and first.tolist() == list(range(SEQ_LEN + 1))
    # consecutive samples share one token: the last target is the next input
    assert samples[1].tolist() == list(range(SEQ_LEN, 2 * SEQ_LEN + 1))
    assert samples[SIZES[0]].tolist()[0] == 10000  # shard 1 starts with its own first token


def test_llmc_headers_and_npy_files_carry_their_dtype(tmp_path: Path) -> None:
    tokens = np.arange(3 * 4 + 1, dtype=np.uint32) + 70000  # needs uint32
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240801, 7, len(tokens))  # llm.c's uint32 (llama 3) header
    with (tmp_path / "a.bin").open("wb") as file:
        file.write(header.tobytes())
        file.write(tokens.tobytes())
    np.save(tmp_path / "b.npy", tokens + 100)
    index = write_index(tmp_path)
    assert index.dtype == "uint32"
    assert [(s.name, s.header_bytes, s.num_samples) for s in index.shards][0] == (
        "a.bin",
        LLMC_HEADER_BYTES,
        13,
    )
    views = everything(tmp_path, seq_len=4, decode=lambda view: view)
    assert isinstance(views[0], np.memmap) and views[0].dtype == np.uint32  # no copy
    assert [int(v[0]) for v in views] == [70000, 70004, 70008, 70100, 70104, 70108]


def test_views_handed_out_stay_readable_after_their_shard_is_closed(tmp_path: Path) -> None:
    # An identity decode hands out views of the memmap; closing the shard (evicted past
    # max_open_shards, or close()) once unmapped them under the views, and reading one
    # then crashed the process. Run in a child so a crash is a failure, not a dead pytest.
    token_shards(tmp_path)
    write_index(tmp_path)
    code = f"""
from air_sdk.runtime.data import ShardedDataset
data = ShardedDataset({str(tmp_path)!r}, seq_len={SEQ_LEN}, shuffle=False, dp_rank=0,
                      dp_size=1, max_open_shards=1, decode=lambda view: view)
views = list(data)  # every shard opened in turn; each one closed when the next opens
data.close()
print(sum(int(v.sum()) for v in views))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = 0
    for s, count in enumerate(SIZES):
        tokens = s * 10000 + np.arange(count * SEQ_LEN + 1, dtype=np.int64)
        expected += sum(
            int(tokens[i * SEQ_LEN : (i + 1) * SEQ_LEN + 1].sum()) for i in range(count)
        )
    assert int(done.stdout) == expected


def test_a_raw_bin_of_the_wrong_length_is_refused_with_the_flag_to_change(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x01\x00\x02")
    done = air("data", "index", str(tmp_path))
    assert done.returncode == 2
    assert (
        "not a whole number of uint16 tokens: pass the right --dtype" in done.stdout + done.stderr
    )


def test_jsonl_lines_come_back_parsed_and_decode_is_pluggable(tmp_path: Path) -> None:
    written = jsonl_shards(tmp_path)
    index = write_index(tmp_path)
    assert index.format == "jsonl" and [s.num_samples for s in index.shards] == [5, 7]
    assert everything(tmp_path) == written  # the blank line is skipped
    raw = everything(tmp_path, decode=lambda line: line)
    assert raw[0] == (json.dumps(written[0]) + "\n").encode()


def test_tar_samples_are_grouped_by_key(tmp_path: Path) -> None:
    written = tar_shards(tmp_path)
    index = write_index(tmp_path)
    assert index.format == "tar" and [s.num_samples for s in index.shards] == [4, 3]
    assert everything(tmp_path) == written
    assert sorted(everything(tmp_path)[1]) == ["__key__", "cls", "seg.png", "txt"]


def test_a_missing_index_says_to_run_air_data_index(tmp_path: Path) -> None:
    token_shards(tmp_path)
    with pytest.raises(ConfigError, match=r"has no index\.json: run `air data index .*` once"):
        ShardedDataset(tmp_path, seq_len=SEQ_LEN, dp_rank=0, dp_size=1)


@pytest.mark.parametrize("change", ["grown", "removed", "added", "corrupt"])
def test_a_stale_index_is_refused(tmp_path: Path, change: str) -> None:
    token_shards(tmp_path)
    write_index(tmp_path)
    if change == "grown":
        with (tmp_path / "shard-001.bin").open("ab") as file:
            file.write(b"\x00\x00")
        why = "shard-001.bin is 324 bytes, the index says 322"
    elif change == "removed":
        (tmp_path / "shard-002.bin").unlink()
        why = "shard-002.bin is gone"
    elif change == "added":
        token_shards(tmp_path / "more", sizes=(2,))
        why = "more/shard-000.bin is not in it"
    else:
        (tmp_path / "index.json").write_text('{"version": 1, "format": "tokens", "shards": 3}')
        why = "not a valid index"
    with pytest.raises(ConfigError, match=why) as caught:
        read_index(tmp_path)
    assert "run `air data index" in str(caught.value)


def test_format_and_seq_len_must_fit_the_index(tmp_path: Path) -> None:
    jsonl_shards(tmp_path)
    write_index(tmp_path)
    with pytest.raises(ConfigError, match="holds jsonl shards .* not tokens"):
        ShardedDataset(tmp_path, format="tokens", dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match="seq_len is for token shards"):
        ShardedDataset(tmp_path, seq_len=4, dp_rank=0, dp_size=1)
    with pytest.raises(DataError, match="install the fsspec implementation for this protocol"):
        ShardedDataset("nosuchfs://bucket/shards", dp_rank=0, dp_size=1)


def test_mixed_formats_need_a_format_flag(tmp_path: Path) -> None:
    token_shards(tmp_path)
    jsonl_shards(tmp_path)
    with pytest.raises(ConfigError, match="several formats .* pass --format"):
        write_index(tmp_path)
    assert write_index(tmp_path, format="jsonl").format == "jsonl"
    assert len(everything(tmp_path)) == 12  # the .bin files beside it are not jsonl shards


def test_the_index_stays_small_whatever_the_shards_hold(tmp_path: Path) -> None:
    # Where each sample starts goes into one table per shard, loaded when the shard is
    # opened: index.json is read by every rank and worker and must not grow with samples.
    lines = [json.dumps({"id": i}) for i in range(20_000)]
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    assert air("data", "index", str(tmp_path)).returncode == 0
    assert (tmp_path / "index.json").stat().st_size < 600
    (entry,) = read_index(tmp_path).shards
    assert entry.table == ".air-index/big.jsonl.offsets" and entry.num_samples == 20_000
    data = ShardedDataset(tmp_path, shuffle=False, dp_rank=0, dp_size=1)
    assert data.sample(12_345) == {"id": 12_345}
    tar_shards(tmp_path / "tars")
    assert write_index(tmp_path / "tars").shards[1].table == ".air-index/shard-1.tar.samples.json"
    assert everything(tmp_path / "tars")[4]["__key__"] == "sub/010000"


def test_a_sample_table_that_does_not_fit_its_shard_is_refused(tmp_path: Path) -> None:
    jsonl_shards(tmp_path)
    index = write_index(tmp_path)
    table = tmp_path / str(index.shards[1].table)
    table.write_bytes(table.read_bytes()[:-8])  # one offset short
    with pytest.raises(ConfigError, match="the sample table of part-1.jsonl does not match"):
        everything(tmp_path)
    table.unlink()
    with pytest.raises(ConfigError, match=r"\.air-index/part-1\.jsonl\.offsets is gone"):
        read_index(tmp_path)
    (tmp_path / "part-1.jsonl").unlink()
    write_index(tmp_path)  # the table of a shard that is gone goes with it
    assert sorted(p.name for p in (tmp_path / ".air-index").iterdir()) == ["part-0.jsonl.offsets"]


def test_an_index_of_an_older_air_says_to_index_again(tmp_path: Path) -> None:
    jsonl_shards(tmp_path)
    (tmp_path / "index.json").write_text(
        '{"version": 1, "format": "jsonl", "shards": [{"name": "part-0.jsonl", "bytes": 1,'
        ' "sha256": "0", "num_samples": 5, "offsets": [0, 1, 2, 3, 4, 5]}]}'
    )
    with pytest.raises(
        ConfigError, match=r"not a valid index \(version 2\): version.*air data index"
    ):
        read_index(tmp_path)
