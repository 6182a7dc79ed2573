"""AIR for PyTorch Lightning: `AirLogger` (metrics) and `AirCallback` (progress,
checkpoints, resumes).

```python
import lightning.pytorch as pl
from air_sdk.runtime.integrations.lightning import AirCallback, AirLogger

trainer = pl.Trainer(logger=AirLogger(), callbacks=[AirCallback()], strategy="ddp")
```

Under AIR both are added to every `Trainer` without a code change (autolog); pass
them yourself outside AIR (with `air.autolog()` they are added there too). For the
older `pytorch_lightning` package, import the same names from
`air_sdk.runtime.integrations.pytorch_lightning`: a Trainer accepts only loggers and
callbacks of its own package.

* `AirLogger`: everything the Trainer sends to its loggers (`self.log(...)` values,
  "epoch", validation metrics), at the step Lightning gives, becomes `air.log`
  series, from global rank 0. Hyperparameters are not series and are left out.
* `AirCallback`: every rank heartbeats each training and validation batch (hang
  detection, goodput); every `trainer.save_checkpoint` (ModelCheckpoint's saves and
  your own) becomes an AIR checkpoint event with its path, `trainer.global_step`,
  size and the seconds the save took; `fit(ckpt_path=...)` is reported as the
  attempt's resume.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from typing import Any

from air_sdk.runtime.integrations._common import (
    is_global_zero,
    log_scalars,
    quiet,
    record_checkpoint,
    step_done,
)

__all__ = [
    "AirCallback",  # noqa: F822 (made by the module's __getattr__)
    "AirLogger",  # noqa: F822
    "attach",
    "classes",
]

_WRAPPED = "__air_autolog__"
_classes: dict[str, tuple[type, type]] = {}


def classes(package: str = "lightning.pytorch") -> tuple[type, type]:
    """(AirLogger, AirCallback) built on `package`'s Logger and Callback
    ("lightning.pytorch" or "pytorch_lightning"); made once per package.

    Example:
        >>> AirLogger, AirCallback = classes("lightning.pytorch")
        >>> AirLogger().name
        ''
    """
    found = _classes.get(package)
    if found is None:
        found = _classes[package] = _make_classes(package)
    return found


def _make_classes(package: str) -> tuple[type, type]:
    logger_base = importlib.import_module(f"{package}.loggers").Logger
    callback_base = importlib.import_module(f"{package}.callbacks").Callback
    module = (
        __name__ if package == "lightning.pytorch" else __name__.rsplit(".", 1)[0] + "." + package
    )

    class AirLogger(logger_base):  # type: ignore[misc, valid-type]
        """A Lightning logger whose metrics become AIR's `air.log` series (global rank 0).

        `save_dir` is only what `trainer.log_dir` reports when this is the Trainer's
        first logger; AIR writes no files.

        Example:
            >>> trainer = pl.Trainer(logger=AirLogger())  # doctest: +SKIP
        """

        def __init__(self, save_dir: str | None = None) -> None:
            super().__init__()
            self._save_dir = save_dir
            #: the logger this one was added behind; its version names the run
            self._peer: Any = None
            self._last_step = 0

        @property
        def name(self) -> str:
            # "" and version "": where this is the only logger, a ModelCheckpoint
            # without dirpath writes to <save_dir>/checkpoints, as with no logger
            return ""

        @property
        def version(self) -> str | int | None:
            return self._peer.version if self._peer is not None else ""

        @property
        def save_dir(self) -> str | None:
            return self._save_dir

        @property
        def experiment(self) -> None:
            return None

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            if not is_global_zero():
                return
            if step is None:
                step = self._last_step
            self._last_step = step
            log_scalars(step, metrics)

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass  # AIR keeps the job's spec; hyperparameters are not series

    class AirCallback(callback_base):  # type: ignore[misc, valid-type]
        """A Lightning callback: per-rank progress, checkpoint saves and resumes for AIR.

        Example:
            >>> trainer = pl.Trainer(callbacks=[AirCallback()])  # doctest: +SKIP
        """

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            _wrap_save_checkpoint(trainer)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            _report_resume(trainer)

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            step_done(trainer.global_step)

        def on_validation_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            step_done(None)

    for cls in (AirLogger, AirCallback):
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
    return AirLogger, AirCallback


@quiet("lightning resume")
def _report_resume(trainer: Any) -> None:
    path = trainer.ckpt_path
    if path and is_global_zero():
        record_checkpoint("lightning", os.fspath(path), trainer.global_step, restored=True)


def _wrap_save_checkpoint(trainer: Any) -> None:
    save = trainer.save_checkpoint
    if getattr(save, _WRAPPED, False):
        return

    @functools.wraps(save)
    def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
        started = time.monotonic()
        save(filepath, *args, **kwargs)
        _report_save(trainer, filepath, time.monotonic() - started)

    setattr(save_checkpoint, _WRAPPED, True)
    trainer.save_checkpoint = save_checkpoint


@quiet("lightning checkpoint")
def _report_save(trainer: Any, filepath: Any, seconds: float) -> None:
    if is_global_zero():
        record_checkpoint("lightning", os.fspath(filepath), trainer.global_step, seconds)


@quiet("lightning trainer")
def attach(trainer: Any, package: str = "lightning.pytorch") -> None:
    """Add an AirLogger (behind the Trainer's own loggers) and an AirCallback to
    `trainer` unless it has them (what autolog does to every Trainer).

    With no logger of its own (`logger=False`) the AirLogger reports the Trainer's
    `default_root_dir` as its save_dir, so `trainer.log_dir` and ModelCheckpoint's
    default directory stay what they were.

    Example:
        >>> trainer = pl.Trainer(logger=False)  # doctest: +SKIP
        >>> attach(trainer)  # doctest: +SKIP
    """
    air_logger, air_callback = classes(package)
    loggers = list(trainer.loggers)
    if not any(isinstance(lg, air_logger) for lg in loggers):
        added = air_logger(save_dir=None if loggers else trainer.default_root_dir)
        added._peer = loggers[0] if loggers else None
        trainer.loggers = [*loggers, added]
    if not any(isinstance(cb, air_callback) for cb in trainer.callbacks):
        trainer.callbacks.append(air_callback())


def __getattr__(name: str) -> Any:
    # Made on first use: importing this module must not import Lightning.
    if name in ("AirLogger", "AirCallback"):
        air_logger, air_callback = classes("lightning.pytorch")
        return air_logger if name == "AirLogger" else air_callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
