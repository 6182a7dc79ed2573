"""Refusing a submit whose layout cannot fit its GPUs, with a layout that does.

Only a GPU job that describes its model (`JobSpec.model`) on a known accelerator
is judged, and only by what the job could at best do: with the default layout
(the script picks its own sharding) it is judged as FSDP over every rank, and
unless it turns activation checkpointing off, with checkpointing where needed.
So a refusal means the planner sees no way for the job as asked to fit.

Example:
    >>> from air_sdk.schema import JobSpec, ModelSpec, Resources
    >>> spec = JobSpec(code="...", accelerator="l4", resources=Resources(gpus_per_node=1),
    ...                model=ModelSpec(preset="llama3-8b"))
    >>> print(submit_refusal(spec))  # doctest: +ELLIPSIS
    llama3-8b does not fit 1 x 1 L4: the planner estimates 147.9 GiB per GPU ...
"""

from __future__ import annotations

from collections.abc import Sequence

from air_sdk.planner.devices import DeviceSpec, device_spec
from air_sdk.planner.estimate import USABLE_FRACTION, Cluster, LayoutEstimate, estimate
from air_sdk.planner.search import model_shape, plan, setup_for
from air_sdk.schema.spec import JobSpec, ModelSpec, Parallelism, Resources

__all__ = ["MAX_SUGGESTED_NODES", "submit_refusal"]

#: how far the refusal looks for a node count that fits
MAX_SUGGESTED_NODES = 256
_GIB = 2**30


def _device(spec: JobSpec, accelerators: Sequence[str]) -> DeviceSpec | None:
    """The GPU the job will get: the one it asks for, else the largest of the pool's
    (refuse only what fits nowhere); None when any of them is not in the table."""
    names = [spec.accelerator] if spec.accelerator not in (None, "gpu") else list(accelerators)
    specs = []
    for name in names:
        try:
            specs.append(device_spec(str(name)))
        except KeyError:
            return None
    return max(specs, key=lambda d: d.memory_bytes, default=None)


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / _GIB:.1f}"


def _breakdown(est: LayoutEstimate) -> str:
    mem = est.memory
    ac = " with activation checkpointing" if est.activation_checkpointing else ""
    return (
        f"weights {_gib(mem.weights)}, grads {_gib(mem.grads)}, optimizer"
        f" {_gib(mem.optimizer)}, buffers {_gib(mem.buffers)}, activations"
        f" {_gib(mem.activations)}{ac}, reserved {_gib(mem.reserved)} GiB"
    )


def submit_refusal(spec: JobSpec, accelerators: Sequence[str] = ()) -> str | None:
    """Why `spec` cannot fit its GPUs by the planner's estimate, with a layout that
    fits; None when it fits or there is not enough to judge (no model, no GPUs, an
    accelerator the table does not know).

    `accelerators` are the accelerator labels of the nodes the job may land on
    (used when the job does not name one).
    """
    res = spec.resources
    if spec.model is None or not res.gpus_per_node:
        return None
    device = _device(spec, accelerators)
    if device is None:
        return None
    try:
        shape = model_shape(spec.model)
    except ValueError as exc:
        return f"model: {exc}"
    setup = setup_for(spec.model, shape)
    cluster = Cluster(device, res.nodes, res.gpus_per_node)
    asked = spec.parallelism
    default = asked.is_default
    layout = Parallelism().resolve(cluster.world_size) if default else asked.resolve(res.world_size)
    est = estimate(shape, layout, cluster, setup)
    if est.fits:
        return None
    where = f"{res.nodes} x {res.gpus_per_node} {device.label}"
    if not default:
        where += f" with {est.flags}"
    elif cluster.world_size > 1:
        where += f" even sharded over all {cluster.world_size} GPUs ({est.label})"
    usable = USABLE_FRACTION * device.memory_bytes
    message = (
        f"{shape.name} does not fit {where}: the planner estimates"
        f" {_gib(est.memory.total)} GiB per GPU ({_breakdown(est)}) against"
        f" {_gib(usable)} GiB usable."
    )
    return f"{message} {_suggestion(spec.model, res, device)}"


def _suggestion(model: ModelSpec, res: Resources, device: DeviceSpec) -> str:
    what = model.preset or (f"--params {model.num_params}" if model.num_params else "...")
    command = f"`air plan {what} --gpu {device.key}"
    same = plan(model, device, res.nodes, res.gpus_per_node)
    if same.best is not None:
        best = same.best
        return (
            f"A layout that fits these GPUs: {best.flags} ({best.label},"
            f" {_gib(best.memory.total)} GiB per GPU); {command}"
            f" --nodes {res.nodes} --gpus-per-node {res.gpus_per_node}` compares them all."
        )
    nodes = res.nodes * 2
    while nodes <= MAX_SUGGESTED_NODES:
        bigger = plan(model, device, nodes, res.gpus_per_node)
        if bigger.best is not None:
            best = bigger.best
            return (
                f"No layout fits {res.nodes} node(s); with {nodes} nodes {best.flags} does"
                f" ({best.label}, {_gib(best.memory.total)} GiB per GPU): raise --nodes,"
                f" or see {command} --nodes {nodes} --gpus-per-node {res.gpus_per_node}`."
            )
        nodes *= 2
    return (
        f"No layout fits even {MAX_SUGGESTED_NODES} nodes: shorten the sequence or lower"
        " the micro-batch."
    )
