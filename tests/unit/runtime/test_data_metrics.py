"""Data-loading metrics: `air.data.timed` measures the loop's waits, the shipper sends the
totals in its reports (to a real HTTP server standing in for the gateway), and the
snapshot turns them into what `air status` and the monitor show."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from test_runtime_shipper import FakeGateway, make_shipper

from air_sdk.runtime.data.metrics import DataRecorder, Timed, num_samples_of, timed
from air_sdk.schema import Event, JobSnapshot
from air_sdk.schema.data import DataLoading
from air_sdk.schema.events import AttemptChange, MetricsBatch, WorkerReport
from air_sdk.schema.numbers import json_data


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_timed_counts_the_waits_and_samples_of_the_loop(monkeypatch):
    clock = Clock()
    rec = DataRecorder(clock=clock)
    monkeypatch.setattr("air_sdk.runtime.data.metrics.recorder", lambda: rec)
    seen_while_waiting = []

    def slow_loader() -> Iterator[list[int]]:
        for size in (4, 4, 2):
            clock.now += 3.0  # the loader takes 3 s per batch
            seen_while_waiting.append(rec.totals()["waiting_since"])
            yield list(range(size))

    batches = []
    for batch in timed(slow_loader()):
        clock.now += 1.0  # the step takes 1 s
        batches.append(batch)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert seen_while_waiting == [100.0, 104.0, 108.0]  # the loop was waiting in next()
    totals = rec.totals()
    assert totals["num_samples"] == 10
    assert totals["wait_s"] == 9.0  # three waits of 3 s; the steps' 3 s are not waits
    assert totals["waiting_since"] is None


def test_a_wait_for_a_shard_names_the_shard_and_counts_once():
    clock = Clock()
    rec = DataRecorder(clock=clock)
    with rec.waiting(timed=True):
        clock.now += 1.0
        with rec.waiting(shard="s-07.bin"):  # ShardStore.pinned inside the loader's next()
            clock.now += 2.0
            inside = rec.totals()
            assert (inside["waiting_since"], inside["waiting_shard"]) == (100.0, "s-07.bin")
            assert inside["wait_s"] == 3.0  # the wait going on counts already
    assert rec.totals()["wait_s"] == 3.0


def test_the_totals_go_out_at_most_once_a_second_and_only_when_they_changed():
    clock = Clock()
    rec = DataRecorder(clock=clock)
    rec.record_samples(8)
    first = rec.take()
    assert first is not None and first["num_samples"] == 8
    assert rec.take() is None  # nothing new
    rec.record_samples(8)
    clock.now += 0.5
    assert rec.take() is None  # too soon
    assert rec.take(force=True)["num_samples"] == 16  # the last report of a rank
    rec.record_cache(hit=False)
    clock.now += 1.0
    assert rec.take()["num_cache_misses"] == 1


def test_timed_keeps_the_loaders_own_interface():
    class Loader:
        def __init__(self) -> None:
            self.epoch = 0

        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

        def __len__(self) -> int:
            return 3

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    loader = Loader()
    wrapped = timed(loader)
    assert isinstance(wrapped, Timed) and len(wrapped) == 3
    wrapped.set_epoch(4)
    assert loader.epoch == 4
    assert list(wrapped) == [0, 1, 2]
    assert list(timed([{"x": [1, 2, 3]}], samples=lambda b: 7)) == [{"x": [1, 2, 3]}]


def test_batch_sizes_as_dataloader_collates_them():
    torch = pytest.importorskip("torch")
    assert num_samples_of(torch.zeros(16, 3)) == 16
    assert num_samples_of((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert num_samples_of([torch.zeros(6, 2), torch.zeros(6)]) == 6
    assert num_samples_of({"input_ids": torch.zeros(3, 8)}) == 3
    assert num_samples_of(["a", "b"]) == 2


def test_the_shipper_sends_the_totals_in_its_reports(gateway: FakeGateway):
    shipper = make_shipper(gateway.report_url)
    rec = DataRecorder()
    shipper.set_data_source(rec.take)
    rec.record_samples(32)
    rec.record_cache(hit=True)
    gateway.wait_for(lambda: any("data" in body for body in gateway.reports))
    with rec.waiting(shard="s-03.bin"):
        shipper.log(1, loss=0.5)
        gateway.wait_for(
            lambda: any(b.get("data", {}).get("waiting_shard") for b in gateway.reports)
        )
    assert shipper.close()
    reports = [WorkerReport.model_validate(body) for body in gateway.reports]
    sent = [r.data for r in reports if r.data is not None]
    assert sent[0].num_samples == 32 and sent[0].num_cache_hits == 1
    assert any(d.waiting_shard == "s-03.bin" for d in sent)
    assert not sent[-1].waiting  # the last report, at close: the wait had ended
    (metrics,) = [p for p in reports[-1].payloads() if isinstance(p, MetricsBatch)]
    assert metrics.data == sent[-1]  # stored in the rank's metrics event


def _event(seq: int, payload, rank: int | None = None) -> Event:
    return Event.of(payload, seq=seq, job_id="j", ts=float(seq), rank=rank, attempt=1)


def test_the_snapshot_shows_samples_per_s_wait_share_and_cache_hits():
    snap = JobSnapshot(job_id="j")
    seq = iter(range(1, 100))
    snap.apply(_event(next(seq), AttemptChange(attempt=1, phase="started")))
    for rank, waited in ((0, 2.0), (1, 6.0)):
        for ts, samples, wait_s, hits in ((10.0, 100, 1.0, 1), (20.0, 300, 1.0 + waited, 3)):
            data = DataLoading(
                since=0.0,
                ts=ts,
                num_samples=samples,
                wait_s=wait_s,
                num_cache_hits=hits,
                num_cache_misses=1,
                waiting_since=19.0 if rank == 1 and ts == 20.0 else None,
                waiting_shard="s-9.bin" if rank == 1 and ts == 20.0 else None,
            )
            snap.apply(_event(next(seq), MetricsBatch(data=data), rank=rank))
    summary = snap.data_summary
    assert summary is not None
    assert summary.samples_per_s == 40.0  # 200 samples in 10 s, on each of 2 ranks
    assert summary.wait_fraction == pytest.approx(0.4)  # 20% and 60%
    assert (summary.slowest_rank, summary.slowest_wait_fraction) == (1, 0.6)
    assert summary.cache_hit_rate == 0.75
    assert summary.waiting == {1: "waiting for data (shard s-9.bin)"}
    assert summary.describe() == (
        "40.0 samples/s · waits for data 40% of the time (rank 1: 60%) · cache hits 75%"
        " (6 of 8) · rank 1 waiting for data (shard s-9.bin)"
    )
    snap.apply(_event(next(seq), AttemptChange(attempt=2, phase="started")))
    assert snap.data_summary is None  # a new attempt counts from scratch


def test_an_older_reader_ignores_the_data_of_a_metrics_event():
    data = json_data(MetricsBatch(data=DataLoading(since=0.0, ts=1.0, num_samples=3)))
    assert "data" in data
    stripped = MetricsBatch.model_validate({**data, "newer": 1}, extra="ignore")
    assert stripped.data is not None and stripped.data.num_samples == 3
    assert MetricsBatch.model_validate({"points": []}).data is None  # rows stored before


def test_a_wait_in_another_thread_is_seen_until_it_ends():
    rec = DataRecorder()
    started, release = threading.Event(), threading.Event()

    def wait_for_data() -> None:
        with rec.waiting(shard="s-1.bin", timed=True):
            started.set()
            release.wait(30)

    worker = threading.Thread(target=wait_for_data)
    worker.start()
    assert started.wait(30)
    assert rec.totals()["waiting_shard"] == "s-1.bin"
    release.set()
    worker.join(30)
    totals = rec.totals()
    assert totals["waiting_since"] is None and totals["wait_s"] > 0
