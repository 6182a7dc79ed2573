"""In-process runs of the real libraries with AIR's integrations attached by
`air.autolog()`; what AIR posts is captured at the report boundary (a real
MetricsShipper and ReportPoster posting to a local HTTP receiver)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from unit.runtime.test_runtime_shipper import FakeGateway

import air_sdk.runtime as air
from air_sdk.runtime import _shipper
from air_sdk.runtime._poster import ReportPoster
from air_sdk.schema.events import CheckpointCommit, CheckpointRestore, WorkerReport


@dataclass
class Posted:
    """What one rank posted, parsed as the gateway would."""

    shipper: _shipper.MetricsShipper
    gateway: FakeGateway

    def reports(self) -> list[WorkerReport]:
        assert self.shipper.flush(timeout=15)
        return [WorkerReport.model_validate(body) for body in self.gateway.reports]

    def points(self) -> list[tuple[int, dict[str, float]]]:
        return [(p.step, p.values) for r in self.reports() for p in r.points]

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(s, v[name]) for s, v in self.points() if name in v]

    def commits(self) -> list[CheckpointCommit]:
        return [c for r in self.reports() for c in r.checkpoints if isinstance(c, CheckpointCommit)]

    def restores(self) -> list[CheckpointRestore]:
        return [
            c for r in self.reports() for c in r.checkpoints if isinstance(c, CheckpointRestore)
        ]

    def heartbeat_steps(self) -> list[int]:
        return [r.heartbeat_step for r in self.reports() if r.heartbeat_step is not None]


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Posted]:
    """Rank 0 of a 1-rank AIR job: autolog on, everything it posts captured."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIR_JOB_ID", "job-1")
    gateway = FakeGateway()
    shipper = _shipper.MetricsShipper(
        rank=0, poster=ReportPoster(gateway.report_url, "tok"), flush_interval=0.05
    )
    monkeypatch.setattr(_shipper, "_global", shipper)
    air.autolog()
    try:
        yield Posted(shipper, gateway)
    finally:
        air.autolog(disable=True)
        shipper.close(timeout=5)
        gateway.close()
