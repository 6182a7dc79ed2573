"""Checkpoint blocking time: how long a save stops the training loop, and how long
until the checkpoint is durable, for a CPU state of --gib GiB.

Side by side, interleaved per round, in one process (world of 1):
  copy        the floor: one in-memory copy of the state (what any snapshot costs)
  torch.save  torch.save + fsync of the file (the loop waits for all of it)
  dcp.save    torch.distributed.checkpoint.save (synchronous)
  dcp.async   plain dcp.async_save: blocking = until it returns; durable = future done
  air         air.checkpoint.save: blocking = until it returns; durable = manifest in place

Usage: .venv/bin/python benchmarks/checkpoint.py --gib 1 --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, header, markdown_table, median, write_result  # noqa: E402


def make_state(gib: float):
    import torch

    n = int(gib * (1 << 30) / 4 / 8)
    return {f"layer{i}": torch.randn(n) for i in range(8)}


def fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def run_copy(state, scratch: Path) -> tuple[float, float]:
    t = time.perf_counter()
    _copy = {k: v.clone() for k, v in state.items()}
    blocked = time.perf_counter() - t
    del _copy
    return blocked, blocked


def run_torch_save(state, scratch: Path) -> tuple[float, float]:
    import torch

    path = scratch / "state.pt"
    t = time.perf_counter()
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    blocked = time.perf_counter() - t
    return blocked, blocked


def run_dcp_save(state, scratch: Path) -> tuple[float, float]:
    import torch.distributed.checkpoint as dcp

    t = time.perf_counter()
    dcp.save(state, checkpoint_id=str(scratch / "dcp"))
    fsync_tree(scratch / "dcp")
    blocked = time.perf_counter() - t
    return blocked, blocked


def run_dcp_async(state, scratch: Path) -> tuple[float, float]:
    import torch.distributed.checkpoint as dcp

    t = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=str(scratch / "dcp-async"))
    blocked = time.perf_counter() - t
    future.result()
    fsync_tree(scratch / "dcp-async")
    return blocked, time.perf_counter() - t


_AIR: dict[str, object] = {}


def run_air(state, scratch: Path) -> tuple[float, float]:
    # One checkpointer for the whole run, as in training: its process group and
    # directory are set up once, and every save is a new step.
    from air_sdk.runtime.checkpoint import Checkpointer

    if "ckpt" not in _AIR:
        _AIR["dir"] = tempfile.mkdtemp(prefix="air-ckpt-bench-air-")
        _AIR["ckpt"] = Checkpointer(str(_AIR["dir"]), keep=1)
        _AIR["step"] = 0
    ckpt = _AIR["ckpt"]
    _AIR["step"] = int(_AIR["step"]) + 1  # type: ignore[call-overload]
    t = time.perf_counter()
    ckpt.save(state, step=_AIR["step"])  # type: ignore[attr-defined]
    blocked = time.perf_counter() - t
    ckpt.wait()  # type: ignore[attr-defined]
    return blocked, time.perf_counter() - t


METHODS = {
    "copy": run_copy,
    "torch.save": run_torch_save,
    "dcp.save": run_dcp_save,
    "dcp.async": run_dcp_async,
    "air": run_air,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size in GiB")
    ap.add_argument("--runs", type=int, default=3, help="rounds (each runs every method)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)  # DCP's async path wants a group
    state = make_state(args.gib)
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
    for fn in METHODS.values():  # warm-up: first-call set-up is not a save's cost
        scratch = Path(tempfile.mkdtemp(prefix="air-ckpt-bench-warmup-"))
        try:
            fn(state, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    for _ in range(args.runs):
        for name, fn in METHODS.items():
            scratch = Path(tempfile.mkdtemp(prefix=f"air-ckpt-bench-{name.replace('.', '-')}-"))
            try:
                results[name].append(fn(state, scratch))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    dist.destroy_process_group()
    if "dir" in _AIR:
        shutil.rmtree(str(_AIR["dir"]), ignore_errors=True)

    copy_floor = median([b for b, _ in results["copy"]])
    torch_save = median([b for b, _ in results["torch.save"]])
    rows = []
    summary = {}
    for name, samples in results.items():
        blocked = median([b for b, _ in samples])
        durable = median([d for _, d in samples])
        summary[name] = {"blocked_s": blocked, "durable_s": durable, "runs": samples}
        rows.append(
            [name, fmt(blocked), fmt(durable), fmt(blocked / copy_floor), fmt(blocked / torch_save)]
        )
    print(header(f"Checkpoint blocking time, {args.gib:g} GiB CPU state, median of {args.runs}"))
    print()
    print(markdown_table(["method", "blocked s", "durable s", "x copy", "x torch.save"], rows))
    air = summary["air"]["blocked_s"]
    print(
        f"\ngoal: air blocked <= 1.2x copy ({fmt(1.2 * copy_floor)} s) and <= 0.5x torch.save"
        f" ({fmt(0.5 * torch_save)} s): {'met' if air <= 1.2 * copy_floor and air <= 0.5 * torch_save else 'missed'}"
    )
    write_result("checkpoint", {"gib": args.gib, "runs": args.runs, "summary": summary})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
