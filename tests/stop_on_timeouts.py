"""A pytest plugin: the run stops once `MAX_TIMEOUTS` tests have run into
pytest-timeout's limit. Each spends the whole per-test limit (300 s here), and a dozen
hung tests once ran CI past its 90 minutes, killed before the summary that names them.
The run fails either way; stopping early keeps the summary and the time."""

from __future__ import annotations

import pytest

#: tests that may time out before the run stops
MAX_TIMEOUTS = 3

_timed_out: list[str] = []
_sessions: list[pytest.Session] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _sessions.append(session)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not (report.failed and "Timeout (>" in str(report.longrepr)):
        return
    if report.nodeid not in _timed_out:
        _timed_out.append(report.nodeid)
    if len(_timed_out) >= MAX_TIMEOUTS and _sessions:
        _sessions[-1].shouldstop = (
            f"{len(_timed_out)} tests timed out ({', '.join(_timed_out)}); the run stops"
            " here (tests/stop_on_timeouts.py)"
        )
