"""AIR for Hugging Face transformers: `AirCallback`, a `TrainerCallback`.

```python
from transformers import Trainer
from air_sdk.runtime.integrations.transformers import AirCallback

trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[AirCallback()])
```

Under AIR it is added to every `Trainer` (and subclass: Seq2SeqTrainer, TRL's
trainers) without a code change, in addition to whatever `report_to` names
(`report_to="none"` included); `AIR_AUTOLOG=0` leaves the Trainer alone.

* What the Trainer logs (loss, grad_norm, learning_rate, epoch, eval_* metrics,
  train_runtime and the *_per_second throughputs) becomes `air.log` series at
  `state.global_step`, from the global rank 0, every `logging_steps`.
* Every rank heartbeats each optimizer step and each evaluation batch.
* Each checkpoint the Trainer saves (`output_dir/checkpoint-N`) becomes an AIR
  checkpoint event; `train(resume_from_checkpoint=...)` is reported as the resume.
* A job submitted with `--checkpoint-every N` (`AIR_CHECKPOINT_EVERY`) also saves every
  N steps (`air.checkpoint.due`), besides whatever `save_strategy` asks for: the
  submit decides, as for a script's own loop.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from air_sdk.runtime.integrations._common import (
    log_scalars,
    quiet,
    record_checkpoint,
    step_done,
)

__all__ = ["AirCallback", "attach"]

_CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR


class AirCallback(TrainerCallback):
    """Reports a transformers Trainer's logs, progress, checkpoints and resume to AIR.

    Example:
        >>> from transformers import TrainingArguments
        >>> callback = AirCallback()
        >>> trainer = Trainer(model, TrainingArguments("out"), callbacks=[callback])  # doctest: +SKIP
    """

    def __init__(self) -> None:
        #: when the loop last did something else than saving (the save's start, about)
        self._mark = time.monotonic()

    @quiet("transformers resume")
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mark = time.monotonic()
        if state.global_step > 0 and state.is_world_process_zero:
            resumed = args.resume_from_checkpoint
            if not isinstance(resumed, str) or not resumed:
                resumed = _checkpoint_dir(args, state)
            record_checkpoint("transformers", resumed, state.global_step, restored=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step_done(state.global_step)
        if _due(state.global_step):
            control.should_save = True  # the Trainer saves after this step's callbacks
        self._mark = time.monotonic()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step_done(None)

    @quiet("transformers log")
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and state.is_world_process_zero:
            log_scalars(state.global_step, logs)
        self._mark = time.monotonic()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mark = time.monotonic()

    @quiet("transformers checkpoint")
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            seconds = time.monotonic() - self._mark
            record_checkpoint(
                "transformers", _checkpoint_dir(args, state), state.global_step, seconds
            )
        self._mark = time.monotonic()


@quiet("transformers checkpoint interval")
def _due(step: int) -> bool:
    """True at the steps the job's `--checkpoint-every` names."""
    from air_sdk.runtime.checkpoint import due

    return due(step)


def _checkpoint_dir(args: Any, state: Any) -> str:
    return os.path.join(args.output_dir, f"{_CHECKPOINT_PREFIX}-{state.global_step}")


@quiet("transformers trainer")
def attach(trainer: Any) -> None:
    """Add an AirCallback to `trainer` unless it has one (what autolog does to every
    Trainer).

    Example:
        >>> attach(Trainer(model, args))  # doctest: +SKIP
    """
    if not any(isinstance(cb, AirCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(AirCallback())
