"""Autolog's cost per logged step inside Lightning, transformers' Trainer and accelerate,
against the same library with logging off and with its TensorBoard logger.

How: the driver (what you run) starts a real gateway and submits a 1-node x 1-rank
AIR job whose script is this file in `--worker` mode, so AIR's integrations post to
a real gateway through the runtime's shipper while we time the loop. In the worker
autolog is turned off (`air.autolog(disable=True)`) and each variant attaches what
it measures:

- off: Lightning `logger=False`; Trainer `report_to="none"`; an Accelerator without
  trackers (`accelerator.log` is then a loop over nothing);
- AIR: `AirLogger()` + `AirCallback()`; `AirCallback()`; `log_with=[AirTracker()]`;
- TensorBoard: `TensorBoardLogger`; `report_to="tensorboard"`; `log_with="tensorboard"`.

Every step logs 3 scalars (logging every step: the worst case). A step is the time
between consecutive step ends (a callback, or the loop itself for accelerate) over
`--steps` steps after 20 warm-up steps; the model is tiny, so the step is mostly the
library's own per-step work and a logger's cost shows. Variants run interleaved,
round by round; per-step medians of all rounds are compared. The cost is
(variant - off) per step, and also as a share of a 10 ms step.

    .venv/bin/python benchmarks/autolog.py --rounds 5 --steps 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import air_gateway, bench_dir, fmt, header, markdown_table, write_result  # noqa: E402

VARIANTS = ("off", "air", "tensorboard")
LIBRARIES = ("lightning", "transformers", "accelerate")
WARMUP = 20
REFERENCE_STEP_US = 10_000.0  # the 10 ms step
GOAL_PCT = 1.0


# ---- worker side (runs inside the AIR job) ----------------------------------------------


def lightning_steps(variant: str, steps: int, root: str) -> list[float]:
    import lightning.pytorch as pl
    import torch

    from air_sdk.runtime.integrations.lightning import AirCallback, AirLogger

    ends: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self.layer(batch[0]).pow(2).mean()
            self.log_dict({"loss": loss, "lr": 0.1, "acc": 0.5})
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger: Any = {"off": False, "air": AirLogger(), "tensorboard": None}[variant]
    if variant == "tensorboard":
        logger = pl.loggers.TensorBoardLogger(root)
    callbacks: list[Any] = [Clock()] + ([AirCallback()] if variant == "air" else [])
    data = torch.utils.data.TensorDataset(torch.randn(steps + WARMUP, 4))
    trainer = pl.Trainer(
        max_steps=steps + WARMUP,
        logger=logger,
        callbacks=callbacks,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        accelerator="cpu",
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=1))
    return ends


def transformers_steps(variant: str, steps: int, root: str) -> list[float]:
    import torch
    import transformers

    from air_sdk.runtime.integrations.transformers import AirCallback

    ends: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any) -> dict[str, Any]:
            return {"loss": self.layer(x).pow(2).mean()}

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return steps + WARMUP

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": torch.ones(4)}

    args = transformers.TrainingArguments(
        output_dir=root,
        max_steps=steps + WARMUP,
        per_device_train_batch_size=1,
        logging_steps=1,
        save_strategy="no",
        report_to="tensorboard" if variant == "tensorboard" else "none",
        use_cpu=True,
        disable_tqdm=True,
    )
    callbacks: list[Any] = [Clock()] + ([AirCallback()] if variant == "air" else [])
    trainer = transformers.Trainer(
        model=Model(), args=args, train_dataset=Data(), callbacks=callbacks
    )
    trainer.train()
    return ends


def accelerate_steps(variant: str, steps: int, root: str) -> list[float]:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from air_sdk.runtime.integrations.accelerate import AirTracker

    AcceleratorState._reset_state(True)
    log_with: Any = {"off": None, "air": [AirTracker()], "tensorboard": "tensorboard"}[variant]
    accelerator = Accelerator(cpu=True, log_with=log_with, project_dir=root)
    if log_with is not None:
        accelerator.init_trackers("bench")
    model = torch.nn.Linear(4, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim = accelerator.prepare(model, optim)
    x = torch.ones(1, 4)
    ends: list[float] = []
    for step in range(steps + WARMUP):
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optim.step()
        optim.zero_grad()
        accelerator.log({"loss": loss.item(), "lr": 0.1, "acc": 0.5}, step=step)
        ends.append(time.perf_counter())
    accelerator.end_training()
    return ends


RUNNERS = {
    "lightning": lightning_steps,
    "transformers": transformers_steps,
    "accelerate": accelerate_steps,
}


def worker(a: argparse.Namespace) -> None:
    import logging
    import warnings

    import air_sdk.runtime as air

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    air.autolog(disable=True)
    per_step: dict[str, dict[str, list[float]]] = {
        lib: {v: [] for v in VARIANTS} for lib in a.libraries
    }
    for r in range(a.rounds):
        for lib in a.libraries:
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                with tempfile.TemporaryDirectory() as root:
                    ends = RUNNERS[lib](variant, a.steps, root)
                gaps = [
                    (b - e) * 1e6 for e, b in zip(ends[WARMUP:-1], ends[WARMUP + 1 :], strict=True)
                ]
                per_step[lib][variant].append(statistics.median(gaps))
        print(f"worker: round {r + 1} done", flush=True)
    air.flush()
    Path(a.out).write_text(json.dumps(per_step))


# ---- driver -----------------------------------------------------------------------------


def startup(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Seconds from exec to exit of `python -u SCRIPT` and of the same script under
    autolog's rank start (`_rank_main.py`), for an empty script and one that imports
    torch; interleaved."""
    import subprocess

    from air_sdk.runtime import _rank_main

    scripts = {"empty": "pass\n", "import torch": "import torch\n"}
    found: dict[str, dict[str, list[float]]] = {k: {"plain": [], "autolog": []} for k in scripts}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, source in scripts.items():
                script = Path(tmp) / "s.py"
                script.write_text(source)
                ways = {
                    "plain": [sys.executable, "-u", str(script)],
                    "autolog": [sys.executable, "-u", _rank_main.__file__, str(script)],
                }
                for way in ways if r % 2 == 0 else list(ways)[::-1]:
                    started = time.perf_counter()
                    subprocess.run(ways[way], check=True)
                    found[name][way].append(time.perf_counter() - started)
    return found


def summarize(per_step: dict[str, dict[str, list[float]]]) -> list[list[str]]:
    rows = []
    for lib, by_variant in per_step.items():
        med = {v: statistics.median(samples) for v, samples in by_variant.items()}
        air_cost = med["air"] - med["off"]
        tb_cost = med["tensorboard"] - med["off"]
        rows.append(
            [
                lib,
                fmt(med["off"], 0),
                fmt(med["air"], 0),
                fmt(med["tensorboard"], 0),
                fmt(air_cost, 0),
                fmt(tb_cost, 0),
                fmt(100 * air_cost / REFERENCE_STEP_US, 2) + " %",
            ]
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return

    from air_sdk.schema import JobState

    starts = startup(max(a.rounds * 2, 10))
    start_rows = [
        [
            name,
            fmt(1000 * statistics.median(t["plain"]), 0),
            fmt(1000 * statistics.median(t["autolog"]), 0),
            fmt(1000 * (statistics.median(t["autolog"]) - statistics.median(t["plain"])), 0),
        ]
        for name, t in starts.items()
    ]

    src = bench_dir("air-bench-autolog-", [Path(__file__), Path(__file__).with_name("_common.py")])
    out = src / "result.json"
    args = ["--worker", "--out", str(out), "--rounds", str(a.rounds), "--steps", str(a.steps)]
    args += ["--libraries", *a.libraries]
    with air_gateway(num_nodes=1) as (client, _gw, _home):
        job = client.submit_script(src / "autolog.py", args=args, workdir=src)
        print(f"submitted {job.id}; the benchmark runs inside it", flush=True)
        record = job.wait(timeout=a.timeout)
        if record.state is not JobState.SUCCEEDED:
            raise SystemExit(f"the worker job ended {record.state.value}: {record.state_reason}")
    per_step = json.loads(out.read_text())
    headers = [
        "library",
        "off (us/step)",
        "AIR (us/step)",
        "TensorBoard (us/step)",
        "AIR cost (us)",
        "TensorBoard cost (us)",
        "AIR cost / 10 ms step",
    ]
    print(header("autolog: cost per logged step"))
    print(f"\n{a.rounds} rounds x {a.steps} steps, per-step medians; goal < {GOAL_PCT} %\n")
    print(markdown_table(headers, summarize(per_step)))
    print("\nrank start-up (exec to exit, medians):\n")
    print(markdown_table(["script", "python (ms)", "under autolog (ms)", "cost (ms)"], start_rows))
    path = write_result(
        "autolog",
        {"rounds": a.rounds, "steps": a.steps, "per_step": per_step, "startup_s": starts},
    )
    print(f"\nraw: {path}")


if __name__ == "__main__":
    main()
