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

Every step logs 3 scalars (logging every step: the worst case), with a tiny model.
Two measures per run, after 20 warm-up steps:

- in hooks: per step, the time spent inside the measured logger's own calls
  (AirLogger.log_metrics + AirCallback.on_train_batch_end vs TensorBoardLogger's
  log_metrics + save; AirCallback's vs TensorBoardCallback's on_log/on_step_end;
  AirTracker.log + the optimizer-step heartbeat vs TensorBoardTracker.log), timed
  around those calls. This is the cost on the training thread, and it holds up on a
  loaded machine. (The shipper thread's own work is measured by log_overhead.py.)
- step: the wall time between step starts, off vs AIR vs TensorBoard. On a busy
  2-core machine this is mostly scheduling noise; it is reported, not judged.

Variants run interleaved, round by round; medians of the per-run medians are
compared, and AIR's in-hook cost is also given as a share of a 10 ms step. The
driver also measures a rank's start-up (CPU time): `python SCRIPT` against the same
script under autolog's `_rank_main.py`, for an empty script and one that imports torch.

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


class Meter:
    """Per step: the wall time of the step, and the time spent inside the hooks of the
    logger being measured (AIR's or TensorBoard's), found by timing those calls."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.in_hooks: list[float] = []
        self._current = 0.0

    def timed(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._current += time.perf_counter() - started

        return call

    def time_methods(self, obj: Any, *names: str) -> None:
        for name in names:
            if hasattr(obj, name):
                setattr(obj, name, self.timed(getattr(obj, name)))

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())
        self.in_hooks.append(self._current)
        self._current = 0.0

    def result(self) -> tuple[float, float]:
        """(median step, median in-hook time) in microseconds, after the warm-up."""
        ends = self.ends[WARMUP:]
        gaps = [(b - a) * 1e6 for a, b in zip(ends[:-1], ends[1:], strict=True)]
        return statistics.median(gaps), statistics.median(self.in_hooks[WARMUP + 1 :]) * 1e6


def lightning_run(variant: str, steps: int, root: str) -> Meter:
    import lightning.pytorch as pl
    import torch

    from air_sdk.runtime.integrations.lightning import AirCallback, AirLogger

    meter = Meter()

    class Clock(pl.Callback):
        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            meter.step_end()  # the previous step's logging happens after its batch end

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

    callbacks: list[Any] = [Clock()]
    logger: Any = False
    if variant == "air":
        logger, callback = AirLogger(), AirCallback()
        meter.time_methods(callback, "on_train_batch_end")
        callbacks.append(callback)
    elif variant == "tensorboard":
        logger = pl.loggers.TensorBoardLogger(root)
    if logger is not False:
        meter.time_methods(logger, "log_metrics", "save")
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
    return meter


def transformers_run(variant: str, steps: int, root: str) -> Meter:
    import torch
    import transformers

    from air_sdk.runtime.integrations.transformers import AirCallback

    meter = Meter()

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            meter.step_end()

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
    measured = "AirCallback" if variant == "air" else "TensorBoardCallback"
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == measured:
            meter.time_methods(callback, "on_log", "on_step_end", "on_prediction_step")
    trainer.train()
    return meter


def accelerate_run(variant: str, steps: int, root: str) -> Meter:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from air_sdk.runtime.integrations import accelerate as integration

    AcceleratorState._reset_state(True)
    air_tracker = integration.AirTracker()
    log_with: Any = {"off": None, "air": [air_tracker], "tensorboard": "tensorboard"}[variant]
    accelerator = Accelerator(cpu=True, log_with=log_with, project_dir=root)
    if log_with is not None:
        accelerator.init_trackers("bench")
    meter = Meter()
    for tracker in accelerator.trackers:
        meter.time_methods(tracker, "log")
    # what autolog adds after each optimizer step (here by hand: autolog is off)
    heartbeat = meter.timed(integration.after_optimizer_step)
    model = torch.nn.Linear(4, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim = accelerator.prepare(model, optim)
    x = torch.ones(1, 4)
    for step in range(steps + WARMUP):
        meter.step_end()
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optim.step()
        if variant == "air":
            heartbeat(optim)
        optim.zero_grad()
        accelerator.log({"loss": loss.item(), "lr": 0.1, "acc": 0.5}, step=step)
    accelerator.end_training()
    return meter


RUNNERS = {
    "lightning": lightning_run,
    "transformers": transformers_run,
    "accelerate": accelerate_run,
}


def worker(a: argparse.Namespace) -> None:
    import logging
    import warnings

    import air_sdk.runtime as air

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    air.autolog(disable=True)
    found: dict[str, dict[str, dict[str, list[float]]]] = {
        lib: {v: {"step_us": [], "in_hooks_us": []} for v in VARIANTS} for lib in a.libraries
    }
    for r in range(a.rounds):
        for lib in a.libraries:
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                with tempfile.TemporaryDirectory() as root:
                    step_us, in_hooks_us = RUNNERS[lib](variant, a.steps, root).result()
                found[lib][variant]["step_us"].append(step_us)
                found[lib][variant]["in_hooks_us"].append(in_hooks_us)
        print(f"worker: round {r + 1} done", flush=True)
    air.flush()
    Path(a.out).write_text(json.dumps(found))


# ---- driver -----------------------------------------------------------------------------


def startup(rounds: int) -> dict[str, dict[str, list[float]]]:
    """CPU seconds (user + system, of the child: far steadier than wall time on a busy
    machine) of `python -u SCRIPT` and of the same script under autolog's rank start
    (`_rank_main.py`), for an empty script and one that imports torch; interleaved."""
    import resource
    import subprocess

    from air_sdk.runtime import _rank_main

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

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
                    before = cpu()
                    subprocess.run(ways[way], check=True)
                    found[name][way].append(cpu() - before)
    return found


def summarize(found: dict[str, dict[str, dict[str, list[float]]]]) -> list[list[str]]:
    rows = []
    for lib, by_variant in found.items():
        step = {v: statistics.median(m["step_us"]) for v, m in by_variant.items()}
        hooks = {v: statistics.median(m["in_hooks_us"]) for v, m in by_variant.items()}
        ratio = fmt(hooks["tensorboard"] / hooks["air"], 1) + "x" if hooks["air"] else "n/a"
        rows.append(
            [
                lib,
                fmt(hooks["air"], 1),
                fmt(hooks["tensorboard"], 1),
                ratio,
                fmt(100 * hooks["air"] / REFERENCE_STEP_US, 3) + " %",
                fmt(step["off"], 0),
                fmt(step["air"], 0),
                fmt(step["tensorboard"], 0),
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

    starts = startup(max(a.rounds * 4, 20))
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
    found = json.loads(out.read_text())
    headers = [
        "library",
        "AIR in hooks (us/step)",
        "TensorBoard in hooks (us/step)",
        "TensorBoard / AIR",
        "AIR / 10 ms step",
        "step, off (us)",
        "step, AIR (us)",
        "step, TensorBoard (us)",
    ]
    print(header("autolog: cost per logged step"))
    print(f"\n{a.rounds} rounds x {a.steps} steps, per-step medians; goal < {GOAL_PCT} %\n")
    print(markdown_table(headers, summarize(found)))
    print("\nrank start-up (CPU time of the process, medians):\n")
    print(markdown_table(["script", "python (ms)", "under autolog (ms)", "cost (ms)"], start_rows))
    path = write_result(
        "autolog",
        {"rounds": a.rounds, "steps": a.steps, "per_variant": found, "startup_s": starts},
    )
    print(f"\nraw: {path}")


if __name__ == "__main__":
    main()
