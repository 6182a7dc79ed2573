"""GPT-2 124M on one GPU node, side by side: bare torchrun vs `air submit`.

What: tokens/s and MFU of `air_sdk/examples/gpt2.py` (nanoGPT-style GPT-2 124M, batch
16 x 1024 tokens per GPU, AdamW) on every GPU of this machine, each case one run:

| case | launcher | model setup | measures |
| --- | --- | --- | --- |
| torchrun-ddp | bare torchrun (standalone) | DDP, bf16 autocast | the peer |
| air-ddp | `air submit` (embedded gateway, NVML sampling every 2 s) | the same | AIR's cost |
| air-ddp-nosampler | `air submit`, `AIR_SAMPLE_INTERVAL_S=0` | the same | NVML sampling's cost |
| air-ddp-sampler-0.1s | `air submit`, sampling every 0.1 s | the same | a bound on it |
| torchrun-fsdp-compile | bare torchrun | FSDP2 (`air.parallelize` where AIR has it, else `fully_shard`) + bf16 + `torch.compile` | the peer |
| air-fsdp-compile | `air submit` | the same | AIR's cost |
| air-fsdp-compile-ckpt100 | `air submit` | the same + `air.checkpoint.save` every 100 steps (async DCP) | the checkpoint's cost |

Every rank times its whole step (data, forward, backward, optimizer, `air.log`, a
checkpoint save's blocking part); rank 0 writes the times. Step time is the median
past the first fifth (compilation, allocator growth); the checkpoint's cost is the
difference of the means. Tokens/s = tokens per step / median step; MFU = the
planner's FLOPs per token (6 x matmul parameters + attention) x tokens/s over the
GPUs' bf16 peak (device table). Under AIR the runtime's own tokens/s and MFU (from
`air.log(..., tokens=N)`) are reported beside them.

    .venv/bin/python benchmarks/gpu.py                     # every GPU here, about 7 minutes
    .venv/bin/python benchmarks/gpu.py --cases torchrun-ddp,air-ddp --steps 200
    .venv/bin/python benchmarks/gpu.py --smoke             # CPU: tiny GPT-2, 2 gloo ranks

`--smoke` runs the same code paths on CPU (tiny config, fp32, no compile, 20 steps, a
checkpoint every 10; torchrun-ddp, air-ddp, air-fsdp-compile-ckpt100) so the script
cannot rot: `make test` runs it
(tests/integration/test_gpu_benchmark.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUIET_ENV, air_gateway, header, markdown_table, write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "air_sdk" / "examples"


@dataclass(frozen=True)
class Case:
    name: str
    launcher: str  # "torchrun" or "air"
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: the case it is compared with (same model setup, the other launcher or knob)
    baseline: str | None = None


CASES = (
    Case("torchrun-ddp", "torchrun", ("--bf16",)),
    Case("air-ddp", "air", ("--bf16",), baseline="torchrun-ddp"),
    Case("air-ddp-nosampler", "air", ("--bf16",), {"AIR_SAMPLE_INTERVAL_S": "0"}, "air-ddp"),
    Case(
        "air-ddp-sampler-0.1s",
        "air",
        ("--bf16",),
        {"AIR_SAMPLE_INTERVAL_S": "0.1"},
        "air-ddp-nosampler",
    ),
    Case("torchrun-fsdp-compile", "torchrun", ("--fsdp", "--bf16", "--compile")),
    Case(
        "air-fsdp-compile",
        "air",
        ("--fsdp", "--bf16", "--compile"),
        baseline="torchrun-fsdp-compile",
    ),
    Case(
        "air-fsdp-compile-ckpt100",
        "air",
        ("--fsdp", "--bf16", "--compile", "--ckpt-every", "100"),
        baseline="air-fsdp-compile",
    ),
)
#: on CPU: no bf16, no compile; a checkpoint every 10 of 20 steps
SMOKE_CASES = ("torchrun-ddp", "air-ddp", "air-fsdp-compile-ckpt100")


@dataclass
class Setup:
    config: str
    steps: int
    batch_size: int
    seq_len: int
    nproc: int
    gpus: int
    smoke: bool


def _smoke_flags(flags: tuple[str, ...]) -> list[str]:
    """A case's flags for CPU: no bf16 or compile, a checkpoint every 10 steps."""
    out = [f for f in flags if f not in ("--bf16", "--compile")]
    if "--ckpt-every" in out:
        out[out.index("--ckpt-every") + 1] = "10"
    return out


def _gpt2_args(case: Case, setup: Setup, result: Path) -> list[str]:
    flags = _smoke_flags(case.flags) if setup.smoke else list(case.flags)
    return [
        "--config",
        setup.config,
        "--steps",
        str(setup.steps),
        "--batch-size",
        str(setup.batch_size),
        "--seq-len",
        str(setup.seq_len),
        "--result",
        str(result),
        *flags,
    ]


def _run_torchrun(case: Case, setup: Setup, result: Path, timeout_s: float) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={setup.nproc}",
        "-m",
        "air_sdk.examples.gpt2",
        *_gpt2_args(case, setup, result),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    env.update(QUIET_ENV)
    env.update(case.env)
    done = subprocess.run(
        command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case.name}: torchrun exited {done.returncode}\n{done.stdout[-3000:]}")
    return {}


def _series_median(job: Any, name: str) -> float | None:
    rows = [r for r in job.metrics(name=name) if r.rank == 0]
    values = [r.values[name] for r in rows[len(rows) // 5 :]]
    return statistics.median(values) if values else None


def _run_air(
    case: Case, setup: Setup, result: Path, client: Any, timeout_s: float
) -> dict[str, Any]:
    from air_sdk.schema import JobSpec, JobState, ModelSpec, Resources

    if setup.gpus:
        resources = Resources(nodes=1, gpus_per_node=setup.gpus)
        env = dict(case.env)
        # the runner turns the model into AIR_FLOPS_PER_TOKEN: MFU without FLOP counting
        # (which would run a compiled model once under a dispatch mode)
        model = ModelSpec(preset="gpt2-124m", seq_len=setup.seq_len, micro_batch=setup.batch_size)
    else:
        resources = Resources(nodes=1, procs_per_node=setup.nproc)
        env = {**case.env, "AIR_PEAK_FLOPS": "1e11"}  # CPU has no peak: exercise the MFU path
        model = None
    spec = JobSpec(
        name=f"bench-{case.name}"[:63],
        entrypoint="gpt2.py",
        args=_gpt2_args(case, setup, result),
        env=env,
        resources=resources,
        model=model,
    )
    job = client.submit(spec, workdir=EXAMPLES)
    record = job.wait(timeout=timeout_s)
    if record.state is not JobState.SUCCEEDED:
        tail = "\n".join(line.text for line in job.logs())[-3000:]
        raise RuntimeError(f"{case.name}: job {job.id} {record.state.value}\n{tail}")
    return {
        "job_id": job.id,
        "runtime_tokens_per_s": _series_median(job, "tokens_per_s"),
        "runtime_mfu": _series_median(job, "mfu"),
        "checkpoints": len(job.checkpoints().commits),
    }


def _planned_mfu(setup: Setup, device: str, tokens_per_s: float, world: int) -> float | None:
    from air_sdk.planner import peak_flops, preset
    from air_sdk.planner.model import ModelShape

    if setup.config == "gpt2-124m":
        shape = preset("gpt2-124m")
    else:  # the tiny config of the example, as a planner shape
        shape = ModelShape(
            "tiny", "gpt2", 2, 64, 4, 4, 256, 256, max_positions=64, tied_embeddings=True
        )
    peak = peak_flops(device, "bf16") if device != "cpu" else None
    if peak is None:
        return None
    return shape.flops_per_token(setup.seq_len) * tokens_per_s / (world * peak)


def run_case(case: Case, setup: Setup, out: Path, client: Any, timeout_s: float) -> dict[str, Any]:
    result = out / f"{case.name}.json"
    result.unlink(missing_ok=True)
    started = time.perf_counter()
    if case.launcher == "torchrun":
        extra = _run_torchrun(case, setup, result, timeout_s)
    else:
        extra = _run_air(case, setup, result, client, timeout_s)
    wall = time.perf_counter() - started
    measured = json.loads(result.read_text())
    world = setup.gpus or setup.nproc
    tokens_per_s = measured["tokens_per_step"] / measured["step_s_median"]
    row = {
        "case": case.name,
        "launcher": case.launcher,
        "wall_s": wall,
        **measured,
        "tokens_per_s": tokens_per_s,
        "mfu": _planned_mfu(setup, measured.get("device", "cpu"), tokens_per_s, world),
        **extra,
    }
    print(
        f"{case.name}: {measured['step_s_median'] * 1e3:.1f} ms/step median,"
        f" {tokens_per_s:,.0f} tokens/s ({wall:.0f} s)",
        flush=True,
    )
    return row


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(rows: dict[str, dict[str, Any]]) -> str:
    table = []
    for name, row in rows.items():
        case = next(c for c in CASES if c.name == name)
        base = rows.get(case.baseline or "")
        ratio = row["tokens_per_s"] / base["tokens_per_s"] if base else None
        table.append(
            [
                name,
                f"{row['step_s_median'] * 1e3:.1f}",
                f"{row['step_s_mean'] * 1e3:.1f}",
                f"{row['tokens_per_s']:,.0f}",
                _fmt(row.get("mfu"), ".1%"),
                _fmt(row.get("runtime_tokens_per_s"), ",.0f"),
                _fmt(row.get("runtime_mfu"), ".1%"),
                f"{case.baseline} {ratio:.3f}x" if ratio else "",
            ]
        )
    lines = [
        markdown_table(
            [
                "case",
                "step ms (median)",
                "step ms (mean)",
                "tokens/s",
                "MFU",
                "runtime tokens/s",
                "runtime MFU",
                "tokens/s vs",
            ],
            table,
        )
    ]
    plain, ckpt = rows.get("air-fsdp-compile"), rows.get("air-fsdp-compile-ckpt100")
    if plain and ckpt:
        extra_ms = (ckpt["step_s_mean"] - plain["step_s_mean"]) * 1e3
        lines.append(f"checkpoint every 100 steps: mean step {extra_ms:+.2f} ms")
    on, off = rows.get("air-ddp"), rows.get("air-ddp-nosampler")
    if on and off:
        extra_ms = (on["step_s_median"] - off["step_s_median"]) * 1e3
        lines.append(f"NVML sampling every 2 s: median step {extra_ms:+.2f} ms")
    return "\n".join(lines)


def _gpus() -> tuple[int, str]:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return 0, "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU: tiny model, 2 gloo ranks")
    parser.add_argument("--cases", default=None, help="comma-separated case names")
    parser.add_argument("--steps", type=int, default=None, help="default 300 (smoke: 20)")
    parser.add_argument("--batch-size", type=int, default=None, help="per GPU; default 16")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default: results/gpu.json)")
    a = parser.parse_args(argv)
    gpus, device = _gpus()
    if not a.smoke and not gpus:
        print("no GPU here: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    setup = Setup(
        config="tiny" if a.smoke else "gpt2-124m",
        steps=a.steps or (20 if a.smoke else 300),
        batch_size=a.batch_size or (4 if a.smoke else 16),
        seq_len=64 if a.smoke else 1024,
        nproc=2 if a.smoke else gpus,
        gpus=0 if a.smoke else gpus,
        smoke=a.smoke,
    )
    wanted = (
        a.cases.split(",") if a.cases else list(SMOKE_CASES if a.smoke else [c.name for c in CASES])
    )
    unknown = set(wanted) - {c.name for c in CASES}
    if unknown:
        print(f"unknown cases {sorted(unknown)}; known: {[c.name for c in CASES]}", file=sys.stderr)
        return 2
    cases = [c for c in CASES if c.name in wanted]
    title = "GPT-2 124M: torchrun vs air submit" if not a.smoke else "GPU benchmark smoke (CPU)"
    print(header(title) + f"; {setup.nproc} x {device}", flush=True)
    out = Path(tempfile.mkdtemp(prefix="air-bench-gpu-"))
    rows: dict[str, dict[str, Any]] = {}
    # one embedded gateway for every AIR case: a node with this machine's GPUs
    with air_gateway(num_nodes=1, slots_per_node=setup.nproc) as (client, _gw, _home):
        for case in cases:
            rows[case.name] = run_case(case, setup, out, client, a.timeout)
    text = report(rows)
    print(text)
    payload = {"setup": setup.__dict__, "device": device, "rows": rows, "report": text}
    if a.out is not None:
        a.out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {a.out}")
    else:
        print(f"wrote {write_result('gpu_smoke' if a.smoke else 'gpu', payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
