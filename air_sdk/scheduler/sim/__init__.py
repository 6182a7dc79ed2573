"""Trace replay for the scheduler: a discrete-event simulator that drives the real
`decide` (or the `schedule_fifo` baseline), a trace generator calibrated to the
Philly and PAI traces, and readers for the public trace files."""

from air_sdk.scheduler.sim.metrics import fair_shares, jain_index
from air_sdk.scheduler.sim.readers import read_pai, read_philly
from air_sdk.scheduler.sim.simulator import (
    JobOutcome,
    SimResult,
    SimulationError,
    compare,
    simulate,
)
from air_sdk.scheduler.sim.trace import (
    PAI_ACCELERATORS,
    PHILLY,
    TraceJob,
    TraceProfile,
    TraceStats,
    gang_shape,
    generate_trace,
    trace_stats,
)

__all__ = [
    "PAI_ACCELERATORS",
    "PHILLY",
    "JobOutcome",
    "SimResult",
    "SimulationError",
    "TraceJob",
    "TraceProfile",
    "TraceStats",
    "compare",
    "fair_shares",
    "gang_shape",
    "generate_trace",
    "jain_index",
    "read_pai",
    "read_philly",
    "simulate",
    "trace_stats",
]
