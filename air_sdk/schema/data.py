"""Data-loading metrics on the wire and in the snapshot.

A rank's runtime counts what its training loop got from its data (`air_sdk.runtime.
data.metrics`: samples, seconds waited on `next()`, shard cache hits and misses) and
sends the running totals with its reports, at most about once a second (a
`DataLoading` inside the report's `metrics` event). Totals, not increments: a report
lost on the way costs nothing, and a reader gets the rates from any two of them.

`JobSnapshot` keeps each rank's latest totals and the rates between its last two
(`RankDataLoading`); `DataLoadingSummary` is what a person reads: the job's samples/s,
the share of the loop's time spent waiting for data, the cache hit rate, and which
ranks wait right now (and for which shard).

Example:
    >>> first = DataLoading(since=0.0, ts=10.0, num_samples=100, wait_s=1.0)
    >>> rank = RankDataLoading.first(first).updated(
    ...     DataLoading(since=0.0, ts=20.0, num_samples=300, wait_s=6.0, num_cache_hits=3,
    ...                 num_cache_misses=1))
    >>> rank.samples_per_s, rank.wait_fraction
    (20.0, 0.5)
    >>> summary = DataLoadingSummary.of({0: rank})
    >>> summary.samples_per_s, summary.cache_hit_rate
    (20.0, 0.75)
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from air_sdk.schema.numbers import NON_FINITE

__all__ = ["MAX_SHARD_NAME_CHARS", "DataLoading", "DataLoadingSummary", "RankDataLoading"]

#: a shard name in a report is cut to this many characters
MAX_SHARD_NAME_CHARS = 512


class DataLoading(BaseModel):
    """One rank's data-loading totals since its runtime started counting (`since`), as
    measured at `ts` (the rank's clock). `wait_s` includes a wait still going on."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)

    since: float
    ts: float
    #: samples the loop took (`record_samples`, or one per item `air.data.timed` yielded)
    num_samples: int = Field(0, ge=0)
    #: seconds the training loop waited for its next batch
    wait_s: float = Field(0.0, ge=0)
    num_cache_hits: int = Field(0, ge=0)
    num_cache_misses: int = Field(0, ge=0)
    #: set while the loop waits for data now: since when (the rank's clock) ...
    waiting_since: float | None = None
    #: ... and for which shard, when the wait is a shard's download (else None)
    waiting_shard: str | None = Field(None, max_length=MAX_SHARD_NAME_CHARS)

    @property
    def waiting(self) -> bool:
        return self.waiting_since is not None

    def waiting_text(self) -> str:
        """How a hang or straggler report names the wait.

        Example:
            >>> DataLoading(since=0, ts=1, waiting_since=0.5, waiting_shard="s-07").waiting_text()
            'waiting for data (shard s-07)'
        """
        if self.waiting_shard:
            return f"waiting for data (shard {self.waiting_shard})"
        return "waiting for data"


class RankDataLoading(BaseModel):
    """A rank's latest totals, and its rates between its last two reports of them."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)

    latest: DataLoading
    samples_per_s: float | None = None
    #: the share (0..1) of the loop's wall time spent waiting for data
    wait_fraction: float | None = None

    @classmethod
    def first(cls, totals: DataLoading) -> RankDataLoading:
        """Rates over the whole time since the rank started counting."""
        return cls(latest=totals, **_rates(None, totals))

    def updated(self, totals: DataLoading) -> RankDataLoading:
        """The rates between this one's latest totals and `totals` (the rates so far
        stay when no time passed between them)."""
        rates = _rates(self.latest, totals)
        if not rates:
            return self.model_copy(update={"latest": totals})
        return RankDataLoading(latest=totals, **rates)


def _rates(before: DataLoading | None, totals: DataLoading) -> dict[str, float]:
    if before is None or before.since != totals.since:
        # A rank's first report, or a new process (its counters started again).
        span = totals.ts - totals.since
        samples, waited = totals.num_samples, totals.wait_s
    else:
        span = totals.ts - before.ts
        samples = totals.num_samples - before.num_samples
        waited = totals.wait_s - before.wait_s
    if span <= 0:
        return {}
    return {
        "samples_per_s": max(samples, 0) / span,
        "wait_fraction": min(max(waited / span, 0.0), 1.0),
    }


class DataLoadingSummary(BaseModel):
    """The job's data loading at a glance (`air status`, the monitor).

    Example:
        >>> DataLoadingSummary.of({}) is None
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan=NON_FINITE)

    #: samples per second of all ranks together
    samples_per_s: float | None = None
    #: the mean over ranks of the share of loop time spent waiting for data (0..1)
    wait_fraction: float | None = None
    #: the rank that waits the largest share, and that share
    slowest_rank: int | None = None
    slowest_wait_fraction: float | None = None
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    #: hits / (hits + misses) of the shard cache; None before any shard was read
    cache_hit_rate: float | None = None
    #: rank -> how it waits right now ("waiting for data (shard X)")
    waiting: dict[int, str] = Field(default_factory=dict)

    def describe(self) -> str:
        """One line for people (`air status`, the monitor).

        Example:
            >>> DataLoadingSummary(samples_per_s=1234.5, wait_fraction=0.35, slowest_rank=1,
            ...                    slowest_wait_fraction=0.6, num_cache_hits=8, num_cache_misses=2,
            ...                    cache_hit_rate=0.8, waiting={1: "waiting for data"}).describe()
            '1.2k samples/s · waits for data 35% of the time (rank 1: 60%) · cache hits 80% (8 of 10) · rank 1 waiting for data'
        """
        pieces = []
        if self.samples_per_s is not None:
            pieces.append(f"{_short(self.samples_per_s)} samples/s")
        if self.wait_fraction is not None:
            text = f"waits for data {self.wait_fraction:.0%} of the time"
            if (
                self.slowest_rank is not None
                and self.slowest_wait_fraction is not None
                and f"{self.slowest_wait_fraction:.0%}" != f"{self.wait_fraction:.0%}"
            ):
                text += f" (rank {self.slowest_rank}: {self.slowest_wait_fraction:.0%})"
            pieces.append(text)
        if self.cache_hit_rate is not None:
            total = self.num_cache_hits + self.num_cache_misses
            pieces.append(
                f"cache hits {self.cache_hit_rate:.0%} ({self.num_cache_hits} of {total})"
            )
        pieces.extend(f"rank {rank} {how}" for rank, how in list(self.waiting.items())[:4])
        if len(self.waiting) > 4:
            pieces.append(f"{len(self.waiting) - 4} more ranks waiting for data")
        return " · ".join(pieces)

    @classmethod
    def of(cls, ranks: Mapping[int, RankDataLoading]) -> DataLoadingSummary | None:
        """None when no rank reported data loading."""
        if not ranks:
            return None
        rates = [r.samples_per_s for r in ranks.values() if r.samples_per_s is not None]
        waits = {k: r.wait_fraction for k, r in ranks.items() if r.wait_fraction is not None}
        slowest = max(waits, key=lambda k: (waits[k], -k)) if waits else None
        hits = sum(r.latest.num_cache_hits for r in ranks.values())
        misses = sum(r.latest.num_cache_misses for r in ranks.values())
        return cls(
            samples_per_s=sum(rates) if rates else None,
            wait_fraction=sum(waits.values()) / len(waits) if waits else None,
            slowest_rank=slowest,
            slowest_wait_fraction=waits[slowest] if slowest is not None else None,
            num_cache_hits=hits,
            num_cache_misses=misses,
            cache_hit_rate=hits / (hits + misses) if hits + misses else None,
            waiting={
                k: r.latest.waiting_text() for k, r in sorted(ranks.items()) if r.latest.waiting
            },
        )


def _short(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"
