"""A saved notebook shows how the job ended, not "RUNNING, no steps yet": the monitor is
displayed under a display id and its static copy (`text/html`, `text/plain`) is updated
in place when the job ends (issue 21 item 7). Driven through IPython's own display
machinery (`display(monitor)` and a cell whose value is the monitor), recording what
the display publisher sends, as ipykernel sends it to the front end and nbconvert saves."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from IPython import get_ipython
from IPython.core.displaypub import CapturingDisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display
from IPython.testing.globalipapp import start_ipython

from air_sdk.notebook.monitor import JobMonitor
from air_sdk.schema import Event, JobSnapshot

JOB = "j-final"


def _event(seq: int, type_: str, rank: int | None = None, **data: object) -> Event:
    return Event(seq=seq, job_id=JOB, ts=float(seq), type=type_, rank=rank, data=data)


class RunningJob:
    """A job RUNNING at step 3 when the monitor starts; `end()` makes it SUCCEED at 5."""

    id = JOB

    def __init__(self) -> None:
        self.existing = [_event(1, "state", state="RUNNING")] + [
            _event(1 + s, "metrics", rank=0, points=[{"step": s, "ts": s, "values": {"loss": 1 / s}}])
            for s in (1, 2, 3)
        ]  # fmt: skip
        self._ended = threading.Event()

    def record(self) -> Any:
        return SimpleNamespace(name="demo")

    def snapshot(self) -> JobSnapshot:
        return JobSnapshot.fold(JOB, self.existing)

    def follow(self, after: int = 0) -> Iterator[Event]:
        self._ended.wait(60)
        for s in (4, 5):
            yield _event(1 + s, "metrics", rank=0, points=[{"step": s, "ts": s, "values": {}}])
        yield _event(7, "state", state="SUCCEEDED")

    def cancel(self) -> None:
        raise AssertionError("not cancelled in this test")

    def end(self) -> None:
        self._ended.set()


def _visible(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html)


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> tuple[InteractiveShell, list[dict[str, Any]]]:
    shell = start_ipython() or get_ipython()
    assert shell is not None
    pub = CapturingDisplayPublisher()
    monkeypatch.setattr(shell, "display_pub", pub)
    return shell, pub.outputs


@pytest.mark.parametrize("how", ["display(monitor)", "the cell's value"])
def test_the_saved_output_is_updated_to_the_final_state(
    published: tuple[InteractiveShell, list[dict[str, Any]]], how: str
) -> None:
    shell, outputs = published
    job = RunningJob()
    monitor = JobMonitor(job)  # type: ignore[arg-type]
    try:
        if how == "display(monitor)":
            display(monitor)
        else:
            shell.user_ns["monitor"] = monitor
            shell.run_cell("monitor")
        assert len(outputs) == 1, outputs
        first = outputs[0]
        display_id = (first["transient"] or {}).get("display_id")
        assert display_id, "the monitor is displayed under a display id"
        assert "RUNNING" in _visible(first["data"]["text/html"])

        job.end()
        monitor.wait(timeout=120)

        updates = [o for o in outputs if o["update"]]
        assert updates, "the final state was never written into the cell's output"
        final = updates[-1]
        assert final["transient"]["display_id"] == display_id
        html = _visible(final["data"]["text/html"])
        assert "SUCCEEDED" in html and "RUNNING" not in html
        assert re.search(r"\bstep\s+5\b", html), html
        assert "SUCCEEDED" in final["data"]["text/plain"]
    finally:
        monitor.close()
