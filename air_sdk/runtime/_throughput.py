"""Tokens per second and MFU from `air.log(step=..., tokens=N)`, with no arithmetic in
the training script.

`tokens` is what this rank's batch held in one step (micro-batches x sequence
length, before any context-parallel split). Between two logs the meter knows the
steps done and the wall time, so:

- `tokens_per_s` (the whole job): tokens x steps/s x data-parallel ranks, where
  the data-parallel ranks are `air.layout().dp_size` (the world size over tp x pp x
  cp: ranks of one tensor/pipeline/context group share their tokens);
- `mfu` (0..1): this rank's model FLOP/s over its GPU's peak. Model FLOPs are one
  forward x 3 (forward and backward), never recomputation. The FLOPs per step come
  from `AIR_FLOPS_PER_TOKEN` (the runner sets it from `JobSpec.model`: 6 per matmul
  parameter plus attention), else they are counted once (`air_sdk.runtime._flops`):
  the counter is on from the first `tokens=` log to the next, and what it counted
  over those steps is this rank's FLOPs per step (a DTensor's local shard, so tensor
  parallel counts each rank's share), logged once as `flops_per_step`. The counted
  window runs slower, so it yields no rate.
- `hfu` (0..1, counted FLOPs only): the same with the hardware's FLOPs, recompute
  (activation checkpointing) included; logged once as `hardware_flops_per_step`.

The peak is `AIR_PEAK_FLOPS` when set (FLOP/s of one device), else the device table's
(`air_sdk.planner.devices`) for the GPU's name and `AIR_MFU_DTYPE` (default bf16).
Without either (a CPU) there is no MFU; tokens/s still. `AIR_COUNT_FLOPS=0` turns the
counting off.

Example:
    >>> meter = ThroughputMeter(world_size=8, non_data_parallel=1, peak_flops=1e15,
    ...                         flops_per_token=6e9)
    >>> meter.observe(10, 100.0, tokens=4096) is None  # the first log only starts the clock
    True
    >>> out = meter.observe(20, 102.0, tokens=4096)      # 10 steps in 2 s on 8 ranks
    >>> out["tokens_per_s"], round(out["mfu"], 4)
    (163840.0, 0.1229)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from air_sdk.schema.worker_env import WorkerEnv

__all__ = [
    "FLOPS_PER_STEP",
    "HARDWARE_FLOPS_PER_STEP",
    "HFU",
    "MFU",
    "TOKENS",
    "TOKENS_PER_S",
    "ThroughputMeter",
    "meter_from_env",
]

#: the key a script logs: tokens in this rank's batch per step
TOKENS = "tokens"
#: what the meter adds to the point (the schema's snapshot knows these names too)
TOKENS_PER_S = "tokens_per_s"
MFU = "mfu"
FLOPS_PER_STEP = "flops_per_step"
HFU = "hfu"
HARDWARE_FLOPS_PER_STEP = "hardware_flops_per_step"

PEAK_FLOPS_ENV = WorkerEnv.env_name("peak_flops")
FLOPS_PER_TOKEN_ENV = WorkerEnv.env_name("flops_per_token")
MFU_DTYPE_ENV = WorkerEnv.env_name("mfu_dtype")
COUNT_FLOPS_ENV = WorkerEnv.env_name("count_flops")


class ThroughputMeter:
    """Turns (step, time, tokens) of successive logs into tokens/s and MFU.

    `non_data_parallel` is tp x pp x cp: how many ranks share one batch's tokens.
    `count_flops` counts FLOPs (`air_sdk.runtime._flops`) when `flops_per_token`
    is not known (it needs torch imported and a peak to compare with).
    """

    def __init__(
        self,
        *,
        world_size: int = 1,
        non_data_parallel: int = 1,
        peak_flops: float | None = None,
        flops_per_token: float | None = None,
        count_flops: bool = False,
    ) -> None:
        if world_size < 1 or non_data_parallel < 1 or world_size % non_data_parallel:
            raise ValueError(
                f"world_size={world_size} must be a positive multiple of"
                f" non_data_parallel={non_data_parallel}"
            )
        self.data_parallel = world_size // non_data_parallel
        self.non_data_parallel = non_data_parallel
        self.peak_flops = peak_flops if peak_flops and peak_flops > 0 else None
        self.flops_per_token = flops_per_token if flops_per_token and flops_per_token > 0 else None
        #: this rank's FLOPs per step as counted (None until counted)
        self.flops_per_step: float | None = None
        self._count = count_flops and self.peak_flops is not None and self.flops_per_token is None
        # MFU per token per second (or per step per second), precomputed for the hot path:
        # each rank does 1/non_data_parallel of its group's FLOPs per token
        self._mfu_per_token = (
            self.flops_per_token / non_data_parallel / self.peak_flops
            if self.flops_per_token and self.peak_flops
            else 0.0
        )
        self._mfu_per_step = 0.0
        self._hfu_per_step = 0.0
        self._counter: Any = None
        self._prev: tuple[int, float] | None = None

    def observe(self, step: int, ts: float, tokens: float) -> dict[str, float] | None:
        """The values to add to this log's point (None: nothing yet)."""
        values = {TOKENS: tokens}
        self.add_to(values, step, ts)
        del values[TOKENS]
        return values or None

    def add_to(self, values: dict[str, float], step: int, ts: float) -> None:
        """`observe` for `air.log`'s hot path: the derived values go straight into the
        point's `values` (which hold `tokens`), never over the script's own."""
        prev = self._prev
        self._prev = (step, ts)
        if prev is None:
            if self._count:
                self._start_counting()
            return
        steps = step - prev[0]
        seconds = ts - prev[1]
        if steps <= 0 or seconds <= 0:
            return  # a repeated or rewound step (a restart): start a new interval
        if self._counter is not None:
            model, hardware = self._stop_counting()
            if model:
                self.flops_per_step = model / steps
                self._mfu_per_step = self.flops_per_step / self.peak_flops  # type: ignore[operator]
                self._hfu_per_step = hardware / steps / self.peak_flops  # type: ignore[operator]
                values.setdefault(FLOPS_PER_STEP, self.flops_per_step)
                values.setdefault(HARDWARE_FLOPS_PER_STEP, hardware / steps)
            return  # the counted interval ran slower: no rate from it
        steps_per_s = steps / seconds
        tokens = values[TOKENS]
        if TOKENS_PER_S not in values:
            values[TOKENS_PER_S] = tokens * steps_per_s * self.data_parallel
        if MFU not in values:
            if self._mfu_per_token:
                values[MFU] = tokens * steps_per_s * self._mfu_per_token
            elif self._mfu_per_step:
                values[MFU] = steps_per_s * self._mfu_per_step
        if self._hfu_per_step and HFU not in values:
            values[HFU] = steps_per_s * self._hfu_per_step

    def _start_counting(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            self._count = False
            return
        try:
            from air_sdk.runtime._flops import StepFlopCounter

            counter = StepFlopCounter()
            counter.__enter__()
        except Exception:  # MFU is a nicety: never let it break training
            self._count = False
            return
        self._counter = counter

    def _stop_counting(self) -> tuple[float, float]:
        """(model FLOPs, hardware FLOPs) counted; (0, 0) when counting failed."""
        counter, self._counter = self._counter, None
        self._count = False
        try:
            counter.__exit__(None, None, None)
            return float(counter.model_flops), float(counter.hardware_flops)
        except Exception:
            return 0.0, 0.0

    def close(self) -> None:
        """Leave the FLOP counter if it is still on (the run ended inside the window)."""
        if self._counter is not None:
            self._stop_counting()


def _float_env(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        print(f"[air] ignoring {name}={raw!r}: not a number", file=sys.stderr, flush=True)
        return None
    return value if value > 0 else None


def _layout_sizes(env: Mapping[str, str] | None) -> tuple[int, int]:
    """(world size, tp x pp x cp) from the runtime's one Layout (`air.layout()`)."""
    from air_sdk.errors import ConfigError
    from air_sdk.runtime._layout import Layout, layout

    try:
        the_layout = layout() if env is None else Layout.from_env(env)
    except ConfigError:  # a layout that does not fit: no divisor rather than no log
        world = (os.environ if env is None else env).get(WorkerEnv.env_name("world_size"))
        return int(world or 1), 1
    return the_layout.world_size, the_layout.non_data_parallel


def device_peak_flops(dtype: str = "bf16") -> float | None:
    """This process's GPU peak FLOP/s for `dtype` from the device table (None on CPU, or
    for a GPU the table does not know). Never imports torch itself.

    Example:
        >>> device_peak_flops() is None or device_peak_flops() > 0
        True
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        return None
    from air_sdk.planner.devices import peak_flops

    return peak_flops(name, dtype)


def meter_from_env(env: Mapping[str, str] | None = None) -> ThroughputMeter:
    """The meter for this rank as the launcher and the job describe it.

    Example:
        >>> meter_from_env({"WORLD_SIZE": "4", "AIR_PARALLELISM": '{"tp": 2}'}).data_parallel
        2
    """
    world, non_dp = _layout_sizes(env)
    env = os.environ if env is None else env
    peak = _float_env(env, PEAK_FLOPS_ENV)
    if peak is None:
        peak = device_peak_flops(env.get(MFU_DTYPE_ENV) or "bf16")
    return ThroughputMeter(
        world_size=world,
        non_data_parallel=non_dp,
        peak_flops=peak,
        flops_per_token=_float_env(env, FLOPS_PER_TOKEN_ENV),
        count_flops=env.get(COUNT_FLOPS_ENV, "1") != "0",
    )
