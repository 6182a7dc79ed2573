"""The memory and layout planner: which parallel layout fits a model on given GPUs,
and which of those is fastest. Pure arithmetic; imports no torch.

Example:
    >>> from air_sdk.planner import plan
    >>> p = plan("llama3-70b", gpu="h200", nodes=4, gpus_per_node=8)
    >>> p.best.fits
    True
"""

from air_sdk.planner.devices import DEVICES, DeviceSpec, device_spec, peak_flops
from air_sdk.planner.estimate import (
    Cluster,
    CommBreakdown,
    LayoutEstimate,
    MemoryBreakdown,
    TrainSetup,
    estimate,
    layout_flags,
    layout_label,
)
from air_sdk.planner.model import PRESETS, ModelShape, preset
from air_sdk.planner.search import Plan, candidate_layouts, model_shape, plan, setup_for

__all__ = [
    "DEVICES",
    "PRESETS",
    "Cluster",
    "CommBreakdown",
    "DeviceSpec",
    "LayoutEstimate",
    "MemoryBreakdown",
    "ModelShape",
    "Plan",
    "TrainSetup",
    "candidate_layouts",
    "device_spec",
    "estimate",
    "layout_flags",
    "layout_label",
    "model_shape",
    "peak_flops",
    "plan",
    "preset",
    "setup_for",
]
