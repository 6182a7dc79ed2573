"""AIR for Hugging Face accelerate: `AirTracker`, a `GeneralTracker`, and the hooks
autolog puts on `Accelerator`.

```python
from accelerate import Accelerator
import air_sdk.runtime.integrations.accelerate  # registers log_with="air"

accelerator = Accelerator(log_with="air")           # or log_with=[AirTracker(), "tensorboard"]
accelerator.init_trackers("my-run")
accelerator.log({"loss": loss.item()}, step=step)   # an air.log point, from the main process
air.checkpoint.record(accelerator.save_state(), step=step)   # without autolog
```

Under AIR (autolog) every `Accelerator` gets an AirTracker without a code change
(`accelerator.log` reaches AIR even before or without `init_trackers`), every rank
heartbeats each optimizer step that updates the weights, `save_state` becomes an AIR
checkpoint event and `load_state` the attempt's resume. The step of a checkpoint is
the last step given to `accelerator.log` (accelerate has no step of its own); AIR
keeps the step of each of the job's saves in `$AIR_CHECKPOINT_DIR/accelerate-steps.json`,
so that a resume after a restart reports the step it continues from.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from accelerate.tracking import GeneralTracker

from air_sdk.runtime._context import context
from air_sdk.runtime.integrations._common import (
    is_global_zero,
    log_scalars,
    quiet,
    record_checkpoint,
    step_done,
)

__all__ = ["AirTracker", "after_load_state", "after_optimizer_step", "after_save_state", "attach"]

#: the name for `Accelerator(log_with=...)`
NAME = "air"
_STEPS_FILE = "accelerate-steps.json"


class _Progress:
    """This process's count of weight updates and the last step it logged."""

    optimizer_steps = 0
    logged_step: int | None = None


class AirTracker(GeneralTracker):
    """An accelerate tracker whose `log` calls become AIR's `air.log` series.

    Example:
        >>> AirTracker().name
        'air'
    """

    name = NAME
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_name: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name

    @property
    def tracker(self) -> None:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass  # AIR keeps the job's spec; hyperparameters are not series

    @quiet("accelerate log")
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if not is_global_zero():
            return
        if step is None:
            step = (_Progress.logged_step or 0) + 1
        _Progress.logged_step = int(step)
        log_scalars(step, values)


def _register() -> None:
    # accelerate >= 1.15 resolves registered names in log_with; on older versions
    # autolog swaps "air" for an AirTracker before the Accelerator sees it.
    try:
        from accelerate.tracking import register_tracker_class
    except ImportError:
        return
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    if LOGGER_TYPE_TO_CLASS.get(NAME) is not AirTracker:
        register_tracker_class(AirTracker)


_register()


def with_air_tracker(log_with: Any) -> Any:
    """`log_with` with the name "air" replaced by an AirTracker.

    Example:
        >>> with_air_tracker(["tensorboard", "air"])[1].name
        'air'
    """
    if log_with is None:
        return None
    many = isinstance(log_with, list | tuple)
    items = list(log_with) if many else [log_with]
    items = [AirTracker() if str(item) == NAME else item for item in items]
    return items if many else items[0]


@quiet("accelerate accelerator")
def attach(accelerator: Any) -> None:
    """Give `accelerator` an AirTracker unless `log_with` names one (what autolog does
    to every Accelerator).

    Example:
        >>> attach(Accelerator())  # doctest: +SKIP
    """
    if not accelerator.is_main_process:
        return
    known = [*accelerator.log_with, *accelerator.trackers]
    if not any(isinstance(t, AirTracker) for t in known):
        accelerator.trackers.append(AirTracker())


@quiet("accelerate step")
def after_optimizer_step(optimizer: Any) -> None:
    """Called after `AcceleratedOptimizer.step()`: one weight update on this rank."""
    state = getattr(optimizer, "gradient_state", None)
    if state is not None and not state.sync_gradients:
        return  # an accumulation micro-step: accelerate skipped the update
    _Progress.optimizer_steps += 1
    step_done(_Progress.optimizer_steps)


@quiet("accelerate checkpoint")
def after_save_state(accelerator: Any, location: Any, output_dir: Any, seconds: float) -> None:
    """Called after `Accelerator.save_state()` returned `location`."""
    if not is_global_zero():
        return
    path = os.fspath(location if isinstance(location, str | os.PathLike) else output_dir)
    step = _Progress.logged_step
    if step is None:
        step = _Progress.optimizer_steps
    _remember_step(path, step)
    record_checkpoint("accelerate", path, step, seconds)


@quiet("accelerate resume")
def after_load_state(accelerator: Any, input_dir: Any) -> None:
    """Called after `Accelerator.load_state(input_dir)` returned."""
    if not is_global_zero():
        return
    path = os.fspath(input_dir) if input_dir else _latest_automatic(accelerator)
    if path:
        step = _saved_step(path)
        if _Progress.logged_step is None:  # a save before the next log is at this step
            _Progress.logged_step = step
        record_checkpoint("accelerate", path, step, restored=True)


def _latest_automatic(accelerator: Any) -> str | None:
    # load_state() without a path takes the newest checkpoint_<n> under project_dir
    folder = os.path.join(accelerator.project_dir or "", "checkpoints")
    try:
        names = [n for n in os.listdir(folder) if _trailing_int(n) is not None]
    except OSError:
        return None
    if not names:
        return None
    return os.path.join(folder, max(names, key=lambda n: _trailing_int(n) or 0))


def _trailing_int(name: str) -> int | None:
    found = re.search(r"(\d+)$", name)
    return int(found.group(1)) if found else None


def _steps_file() -> str | None:
    directory = context().checkpoint_dir
    if not directory or "://" in directory:
        return None
    return os.path.join(directory, _STEPS_FILE)


def _read_steps(file: str) -> dict[str, int]:
    try:
        with open(file) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remember_step(path: str, step: int) -> None:
    file = _steps_file()
    if file is None:
        return
    steps = _read_steps(file)
    steps[os.path.realpath(path)] = int(step)
    os.makedirs(os.path.dirname(file), exist_ok=True)
    tmp = f"{file}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    with open(tmp, "w") as f:
        json.dump(steps, f)
    os.replace(tmp, file)


def _saved_step(path: str) -> int:
    """The step this job saved `path` at; else the number its name ends with, else 0."""
    file = _steps_file()
    if file is not None:
        step = _read_steps(file).get(os.path.realpath(path))
        if isinstance(step, int):
            return step
    return _trailing_int(os.path.basename(os.path.normpath(path))) or 0
