"""Cluster configuration from TOML: pools of nodes (the inventory) and the scheduler
policy (quotas, weights, switches). The format is documented in docs/scheduling.md.

    [[pools]]
    name = "a100"
    accelerator = "a100"
    labels = { region = "eu-west" }
      [[pools.nodes]]
      name = "gpu-{i}"     # {i} expands with count
      count = 4
      gpus = 8
      slots = 8

    [tenants.vision]
    gpus = 16
    weight = 2
      [[tenants.vision.slos]]          # service level objectives (docs/operations.md)
      kind = "queue_wait"
      percentile = 95
      under_s = 600
      priority = "high"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from air_sdk.scheduler.gang import ANY_POOL, NodeSpec
from air_sdk.scheduler.policy import (
    DEFAULT_MAX_QUEUED,
    UNLIMITED,
    SchedulerPolicy,
    TenantQuota,
)
from air_sdk.scheduler.slo import SloSpec
from air_sdk.schema.names import ACCELERATOR, NAME, NODE, is_valid, shown

Priority = Literal["low", "normal", "high"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeEntry(_Model):
    """One node, or `count` alike nodes named by `name` with `{i}` replaced by 0..count-1."""

    name: str = Field(min_length=1)
    gpus: int | list[int] = Field(0, description="GPU count (ids 0..n-1) or explicit GPU ids.")
    slots: int | None = Field(
        None, ge=1, description="Rank slots; default: the GPU count, or 1 without GPUs."
    )
    count: int = Field(1, ge=1, le=100_000)
    healthy: bool = True
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _node_name_ok(cls, v: str) -> str:
        # The name a route takes (`air admin node clear NAME`): the same rule holds here.
        if not is_valid(NODE, v.replace("{i}", "0")):
            raise ValueError(
                f"node name {shown(v)} must be 1-128 of letters, digits, '.', '_' or '-'"
                " ('{i}' numbers alike nodes)"
            )
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus_ok(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"gpus={v}: give a GPU count >= 0 or a list of GPU ids")
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"gpus={v} lists a GPU id twice")
        return v


class PoolEntry(_Model):
    """A named set of nodes of one accelerator type."""

    name: str = Field(min_length=1)
    accelerator: str = "cpu"
    labels: dict[str, str] = Field(default_factory=dict, description="Given to every node.")
    nodes: list[NodeEntry] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if v == ANY_POOL:
            raise ValueError("'any' is reserved (a job's pool = 'any' lets the scheduler choose)")
        if not is_valid(NAME, v):
            raise ValueError(
                f"pool name {shown(v)} must be 1-63 of letters, digits, '.', '_' or '-',"
                " starting with a letter or digit (jobs name it in `pool`)"
            )
        return v

    @field_validator("accelerator")
    @classmethod
    def _accelerator_ok(cls, v: str) -> str:
        if not is_valid(ACCELERATOR, v.lower()):
            raise ValueError(
                f"accelerator {shown(v)} must be 1-32 of letters, digits, '.', '_' or '-'"
                " ('a100', 'h100', 'cpu')"
            )
        return v


class SloEntry(_Model):
    """One service level objective of a tenant (docs/operations.md):

    - `kind = "queue_wait"`: `percentile` of queue waits `under_s` seconds (of jobs of
      `priority` only, when given);
    - `kind = "time_to_detect"`: `percentile` of failures noticed within `under_s`;
    - `kind = "goodput"`: the window's goodput `at_least` this ratio.
    """

    kind: Literal["queue_wait", "goodput", "time_to_detect"]
    name: str | None = Field(None, min_length=1, max_length=63, description="Default: kind.")
    percentile: float | None = Field(None, gt=0, lt=100)
    under_s: float | None = Field(None, gt=0)
    at_least: float | None = Field(None, gt=0, lt=1)
    priority: Priority | None = None
    window_h: float = Field(24.0, gt=0, description="The rolling window, in hours.")
    alert_burned: float = Field(
        0.5, gt=0, le=1, description="Burned fraction of the error budget that alerts."
    )

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> SloEntry:
        if self.kind == "goodput":
            if self.at_least is None:
                raise ValueError("a goodput SLO needs at_least (e.g. at_least = 0.9)")
            if self.under_s is not None or self.percentile is not None:
                raise ValueError("a goodput SLO takes at_least only: remove under_s/percentile")
        else:
            if self.under_s is None:
                raise ValueError(f"a {self.kind} SLO needs under_s (seconds, e.g. under_s = 600)")
            if self.at_least is not None:
                raise ValueError(f"a {self.kind} SLO takes under_s and percentile, not at_least")
        if self.priority is not None and self.kind != "queue_wait":
            raise ValueError("priority applies to queue_wait SLOs only: remove it")
        return self

    def spec(self) -> SloSpec:
        if self.kind == "goodput":
            assert self.at_least is not None
            target, objective = self.at_least, self.at_least
        else:
            assert self.under_s is not None
            target, objective = self.under_s, (self.percentile or 95.0) / 100
        return SloSpec(
            name=self.name or self.kind,
            kind=self.kind,
            target=target,
            objective=objective,
            window_s=self.window_h * 3600,
            priority=self.priority,
            alert_burned=self.alert_burned,
        )


class TenantEntry(_Model):
    gpus: int | None = Field(None, ge=0)
    slots: int | None = Field(None, ge=0)
    weight: float = Field(1.0, gt=0)
    max_priority: Priority | None = Field(
        None,
        description="Highest priority its jobs may ask for (default: '*''s, else 'normal');"
        " the system admin is not capped.",
    )
    max_queued: int | None = Field(
        None, ge=1, description="Queued jobs it may have at once (default: '*''s, else 1000)."
    )
    slos: list[SloEntry] | None = Field(
        None, max_length=50, description="Its SLOs (default: '*''s, else none)."
    )

    @field_validator("slos")
    @classmethod
    def _slo_names_unique(cls, v: list[SloEntry] | None) -> list[SloEntry] | None:
        names = [e.name or e.kind for e in v or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"SLO name {twice[0]!r} is used twice: give each a distinct name")
        return v

    max_restarts_per_hour: int | None = Field(
        None,
        ge=0,
        description="Charged failures (crashes, hangs) of its jobs in the last hour after"
        " which its failing jobs fail instead of restarting (default: '*''s, else no cap).",
    )
    data_roots: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Absolute directories only this tenant's jobs may name as output_dir or"
        " checkpoint.dir (local backend, sandboxed ranks).",
    )

    @field_validator("data_roots")
    @classmethod
    def _roots_ok(cls, v: list[str]) -> list[str]:
        for root in v:
            if not root.startswith("/") or any(ord(c) < 32 for c in root):
                raise ValueError(f"data root {shown(root)} must be an absolute directory path")
        return v


class SchedulerEntry(_Model):
    fair_share: Literal["drf", "fifo"] = "drf"
    backfill: bool = True
    preemption: bool = True
    preemptor_priorities: list[Priority] = Field(default_factory=lambda: list[Priority](["high"]))
    locality_label: str | None = "region"
    locality_strict: bool = False
    aging_s: float | None = Field(24 * 3600.0, gt=0)


class ClusterFile(_Model):
    pools: list[PoolEntry] = Field(default_factory=list)
    tenants: dict[str, TenantEntry] = Field(
        default_factory=dict, description="Quotas and weights; '*' sets the default quota."
    )
    scheduler: SchedulerEntry = Field(default_factory=SchedulerEntry)


@dataclass(frozen=True)
class ClusterConfig:
    """The inventory and the policy a TOML file describes.

    Example:
        >>> cfg = parse_cluster_config('''
        ... [[pools]]
        ... name = "gpu"
        ... accelerator = "a100"
        ...   [[pools.nodes]]
        ...   name = "g{i}"
        ...   count = 2
        ...   gpus = 8
        ... [tenants.vision]
        ... gpus = 8
        ... ''')
        >>> [(n.name, n.num_gpus, n.slots) for n in cfg.inventory]
        [('g0', 8, 8), ('g1', 8, 8)]
        >>> cfg.policy.quota("vision").gpus
        8
    """

    inventory: list[NodeSpec]
    policy: SchedulerPolicy
    #: tenant -> directories only its jobs may name (`data_roots`; `runner.job_paths`)
    data_roots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def parse_cluster_config(text: str, *, source: str = "<string>") -> ClusterConfig:
    """Parse cluster TOML; errors name the file and the field to fix."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from exc
    try:
        cfg = ClusterFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"{source}: {problems}") from exc
    star = cfg.tenants.get("*")
    if star is not None and star.data_roots:
        raise ValueError(
            f"{source}: tenants.*.data_roots: data roots belong to one tenant; give them under"
            " [tenants.NAME], or let every tenant use a directory with air gateway start"
            " --allowed-data-root DIR (each tenant under DIR/<tenant>/) or --shared-data-root DIR"
        )
    roots = {n: tuple(t.data_roots) for n, t in cfg.tenants.items() if t.data_roots}
    return ClusterConfig(inventory=_inventory(cfg, source), policy=_policy(cfg), data_roots=roots)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Read a cluster TOML file (see docs/scheduling.md for the format)."""
    p = Path(path)
    return parse_cluster_config(p.read_text(), source=str(p))


def _inventory(cfg: ClusterFile, source: str) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    pool_names: set[str] = set()
    for pool in cfg.pools:
        if pool.name in pool_names:
            raise ValueError(f"{source}: pool {pool.name!r} is defined twice")
        pool_names.add(pool.name)
        for entry in pool.nodes:
            if entry.count > 1 and "{i}" not in entry.name:
                raise ValueError(
                    f"{source}: pool {pool.name!r}: node {entry.name!r} has count={entry.count}"
                    " but no '{i}' in its name to number the nodes"
                )
            gpus = tuple(range(entry.gpus)) if isinstance(entry.gpus, int) else tuple(entry.gpus)
            slots = entry.slots if entry.slots is not None else max(1, len(gpus))
            for i in range(entry.count):
                name = entry.name.replace("{i}", str(i))
                if name in seen:
                    raise ValueError(f"{source}: node {name!r} is defined twice")
                seen.add(name)
                nodes.append(
                    NodeSpec(
                        name=name,
                        slots=slots,
                        gpus=gpus,
                        pool=pool.name,
                        healthy=entry.healthy,
                        accelerator=pool.accelerator.lower(),
                        labels={**pool.labels, **entry.labels},
                    )
                )
    return nodes


def _policy(cfg: ClusterFile) -> SchedulerPolicy:
    quotas = {
        name: TenantQuota(gpus=t.gpus, slots=t.slots)
        for name, t in cfg.tenants.items()
        if name != "*"
    }
    star = cfg.tenants.get("*")
    named = {name: t for name, t in cfg.tenants.items() if name != "*"}
    s = cfg.scheduler
    return SchedulerPolicy(
        quotas=quotas,
        default_quota=TenantQuota(gpus=star.gpus, slots=star.slots) if star else UNLIMITED,
        weights={name: t.weight for name, t in cfg.tenants.items() if name != "*"},
        fair_share=s.fair_share,
        backfill=s.backfill,
        preemption=s.preemption,
        preemptor_priorities=frozenset(s.preemptor_priorities),
        locality_label=s.locality_label,
        locality_strict=s.locality_strict,
        aging_s=s.aging_s,
        max_priorities={n: t.max_priority for n, t in named.items() if t.max_priority},
        default_max_priority=(star.max_priority if star and star.max_priority else "normal"),
        max_queued={n: t.max_queued for n, t in named.items() if t.max_queued},
        default_max_queued=(star.max_queued if star and star.max_queued else DEFAULT_MAX_QUEUED),
        slos={n: tuple(e.spec() for e in t.slos) for n, t in named.items() if t.slos is not None},
        default_slos=tuple(e.spec() for e in star.slos or ()) if star else (),
        max_restarts_per_hour={
            n: t.max_restarts_per_hour
            for n, t in named.items()
            if t.max_restarts_per_hour is not None
        },
        default_max_restarts_per_hour=star.max_restarts_per_hour if star else None,
    )
