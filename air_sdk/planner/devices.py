"""The accelerator table: memory, peak FLOP/s per dtype and interconnect bandwidths.

One table serves the planner (does a layout fit, how fast is it) and the runtime's
MFU (peak FLOP/s of the GPU a rank runs on, found by its NVML name). Figures are
datasheet numbers without sparsity; the bandwidths are what NCCL collectives reach
in practice per GPU (bus bandwidth), lower than the link's nominal rate.

Example:
    >>> device_spec("h100").memory_bytes // 2**30
    79
    >>> device_spec("NVIDIA H100 80GB HBM3").key
    'h100'
    >>> peak_flops("NVIDIA A100-SXM4-80GB", "bf16")
    312000000000000.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DEVICES", "DTYPES", "DeviceSpec", "device_spec", "peak_flops"]

#: dtypes the table knows peaks for (matmul input types; "fp32" means no TF32)
DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")

_GB = 10**9
_MIB = 2**20


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator type.

    Example:
        >>> spec = device_spec("h200")
        >>> spec.peak("bf16") / 1e12, spec.intra_node_bw > spec.inter_node_bw
        (989.4, True)
    """

    key: str
    #: what a person calls it (and what `air plan` prints)
    label: str
    #: usable memory as NVML reports it
    memory_bytes: int
    #: peak dense FLOP/s by dtype
    peak_flops: dict[str, float] = field(repr=False)
    #: collective bus bandwidth per GPU inside a node (NVLink, or PCIe without it), bytes/s
    intra_node_bw: float = 0.0
    #: collective bus bandwidth per GPU across nodes (InfiniBand / RoCE / Ethernet), bytes/s
    inter_node_bw: float = 0.0
    #: lowercase pieces that must all appear in an NVML name for it to be this device
    nvml_patterns: tuple[tuple[str, ...], ...] = ()

    def peak(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s for `dtype`; ValueError naming the dtypes it has otherwise."""
        try:
            return self.peak_flops[_dtype_key(dtype)]
        except KeyError:
            raise ValueError(
                f"{self.label} has no {dtype} peak in AIR's table; known:"
                f" {', '.join(sorted(self.peak_flops))}"
            ) from None


def _mk(
    key: str,
    label: str,
    memory_mib: int,
    bf16: float,
    *,
    fp8: float | None = None,
    tf32: float | None = None,
    fp32: float,
    intra: float,
    inter: float,
    patterns: tuple[tuple[str, ...], ...],
) -> DeviceSpec:
    peaks = {"bf16": bf16, "fp16": bf16, "fp32": fp32}
    if fp8 is not None:
        peaks["fp8"] = fp8
    peaks["tf32"] = tf32 if tf32 is not None else fp32
    return DeviceSpec(key, label, memory_mib * _MIB, peaks, intra, inter, patterns)


# Most specific first: an NVML name is matched against the patterns in this order
# ("H100 NVL" before "H100", "L40S" before "L4").
_TABLE = (
    _mk(
        "b200", "B200", 183_359, 2250e12, fp8=4500e12, tf32=1100e12, fp32=80e12,
        # NVLink 5 (1.8 TB/s both ways); 8x 400 Gb/s NICs per node
        intra=720 * _GB, inter=40 * _GB, patterns=(("b200",),),
    ),
    _mk(
        "h200", "H200", 143_771, 989.4e12, fp8=1978.9e12, tf32=494.7e12, fp32=66.9e12,
        # NVLink 4 (900 GB/s both ways), NCCL reaches ~360 GB/s busbw; 8x 400 Gb/s NICs
        intra=360 * _GB, inter=40 * _GB, patterns=(("h200",),),
    ),
    _mk(
        "h100-nvl", "H100 NVL", 95_830, 835e12, fp8=1670e12, tf32=417.5e12, fp32=60e12,
        # NVLink bridges pair the cards; the rest of the node talks over PCIe 5
        intra=40 * _GB, inter=25 * _GB, patterns=(("h100", "nvl"),),
    ),
    _mk(
        "h100-pcie", "H100 PCIe", 81_559, 756e12, fp8=1513e12, tf32=378e12, fp32=51e12,
        intra=40 * _GB, inter=25 * _GB, patterns=(("h100", "pcie"),),
    ),
    _mk(
        "h100", "H100 SXM", 81_559, 989.4e12, fp8=1978.9e12, tf32=494.7e12, fp32=66.9e12,
        intra=360 * _GB, inter=40 * _GB, patterns=(("h100",), ("h800",)),
    ),
    _mk(
        "a100-80gb", "A100 80GB", 81_920, 312e12, tf32=156e12, fp32=19.5e12,
        # NVLink 3 (600 GB/s both ways), ~230 GB/s busbw; 200 Gb/s HDR per GPU
        intra=230 * _GB, inter=20 * _GB, patterns=(("a100", "80gb"),),
    ),
    _mk(
        "a100-40gb", "A100 40GB", 40_960, 312e12, tf32=156e12, fp32=19.5e12,
        intra=230 * _GB, inter=20 * _GB, patterns=(("a100",),),
    ),
    _mk(
        "l40s", "L40S", 46_068, 362e12, fp8=733e12, tf32=183e12, fp32=91.6e12,
        # PCIe 4 only; a 100-200 Gb/s node network shared by 8 cards
        intra=20 * _GB, inter=2 * _GB, patterns=(("l40s",), ("l40-s",), ("l40 s",)),
    ),
    _mk(
        "l40", "L40", 46_068, 181e12, fp8=362e12, tf32=90.5e12, fp32=90.5e12,
        intra=20 * _GB, inter=2 * _GB, patterns=(("l40",),),
    ),
    _mk(
        "l4", "L4", 23_034, 121e12, fp8=242e12, tf32=60e12, fp32=30.3e12,
        intra=20 * _GB, inter=1.5 * _GB, patterns=(("l4",),),
    ),
)  # fmt: skip

#: key -> spec, in matching order
DEVICES: dict[str, DeviceSpec] = {d.key: d for d in _TABLE}

_ALIASES = {"h100-sxm": "h100", "h800": "h100", "a100": "a100-80gb", "b100": "b200"}


def _dtype_key(dtype: str) -> str:
    key = str(dtype).lower().removeprefix("torch.")
    return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}.get(key, key)


def device_spec(name: str) -> DeviceSpec:
    """The spec for a short key (`h100`, `a100-80gb`), a scheduler accelerator label,
    or an NVML / `torch.cuda.get_device_name()` name.

    Raises KeyError naming the known keys when the device is not in the table.

    Example:
        >>> device_spec("NVIDIA L4").key, device_spec("NVIDIA L40S").key
        ('l4', 'l40s')
    """
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in DEVICES:
        return DEVICES[key]
    for spec in _TABLE:
        if any(all(p in key for p in pattern) for pattern in spec.nvml_patterns):
            return spec
    raise KeyError(f"no accelerator {name!r} in AIR's table; known: {', '.join(DEVICES)}")


def peak_flops(name: str, dtype: str = "bf16") -> float | None:
    """Peak dense FLOP/s of the device `name` (key or NVML name) for `dtype`, or None
    when the device or the dtype is not in the table (then there is no MFU).

    Example:
        >>> peak_flops("NVIDIA H100 PCIe") / 1e12
        756.0
        >>> peak_flops("Intel Xeon") is None
        True
    """
    try:
        return device_spec(name).peak(dtype)
    except (KeyError, ValueError):
        return None
