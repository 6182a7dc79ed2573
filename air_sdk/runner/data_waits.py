"""What a rank's data loading says about a hang or a straggler.

Ranks that count their data loading (`air.data.timed`, `ShardStore`) send their
totals inside their `metrics` events (`air_sdk.schema.data.DataLoading`). When the
runner reports a hang or a straggler it reads the rank's newest totals: a rank whose
loop is waiting for data right now is "waiting for data (shard X)", and a straggler
that spends much of its time waiting is said to.
"""

from __future__ import annotations

from air_sdk.schema.data import RankDataLoading
from air_sdk.schema.events import EventType, MetricsBatch
from air_sdk.store import SqliteStore

__all__ = ["STRAGGLER_WAIT_SHARE", "hang_notes", "latest_data_loading", "straggler_note"]

#: metrics events of a rank read back, newest first, to find its last two totals
_EVENTS_READ = 10
#: a straggler waiting for data at least this share of its time is said to
STRAGGLER_WAIT_SHARE = 0.3


def latest_data_loading(
    store: SqliteStore, job_id: str, attempt: int, rank: int
) -> RankDataLoading | None:
    """The rank's newest data-loading totals in this attempt, with the rates between its
    last two; None when it sent none lately."""
    events = store.read_events(
        job_id,
        types=(EventType.METRICS,),
        rank=rank,
        attempt=attempt,
        newest_first=True,
        limit=_EVENTS_READ,
    )
    found = [b.data for e in events if (b := e.payload_as(MetricsBatch)).data is not None]
    if not found:
        return None
    newest, *older = found
    if not older:
        return RankDataLoading.first(newest)
    return RankDataLoading.first(older[0]).updated(newest)


def hang_notes(store: SqliteStore, job_id: str, attempt: int, ranks: list[int]) -> dict[int, str]:
    """rank -> "waiting for data (shard X)" for the stalled ranks whose loop waits now."""
    notes: dict[int, str] = {}
    for rank in ranks:
        loading = latest_data_loading(store, job_id, attempt, rank)
        if loading is not None and loading.latest.waiting:
            notes[rank] = loading.latest.waiting_text()
    return notes


def straggler_note(store: SqliteStore, job_id: str, attempt: int, rank: int) -> str:
    """ "; it is waiting for data (shard X)" or "; it waits for data 70% of the time", or ""."""
    loading = latest_data_loading(store, job_id, attempt, rank)
    if loading is None:
        return ""
    if loading.latest.waiting:
        return f"; it is {loading.latest.waiting_text()}"
    if loading.wait_fraction is not None and loading.wait_fraction >= STRAGGLER_WAIT_SHARE:
        return f"; it waits for data {loading.wait_fraction:.0%} of the time"
    return ""
