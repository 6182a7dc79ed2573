"""`stop_unless_cancelled`: a cancel during a long preemption grace kills the ranks
soon after it came (issue 19, item 9), with a backend whose graceful stop would last
as long as the grace."""

from __future__ import annotations

import threading

from air_sdk.runner.stopping import stop_unless_cancelled


class SlowStopBackend:
    """terminate(grace) waits the whole grace unless a kill (grace 0) comes first."""

    def __init__(self) -> None:
        self.killed = threading.Event()
        self.calls: list[float] = []

    def terminate(self, handle: object, grace_s: float, *, wait_first_s: float = 0.0) -> None:
        self.calls.append(grace_s)
        if grace_s == 0.0:
            self.killed.set()
        else:
            self.killed.wait(grace_s)


def test_a_cancel_in_the_grace_kills_after_the_override():
    backend = SlowStopBackend()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    cancelled = stop_unless_cancelled(
        backend,  # type: ignore[arg-type]
        object(),  # type: ignore[arg-type]
        3600.0,
        cancel.is_set,
        override_s=0.3,
    )
    assert cancelled and backend.calls == [3600.0, 0.0]


def test_without_a_cancel_the_grace_is_kept():
    backend = SlowStopBackend()
    assert not stop_unless_cancelled(backend, object(), 0.3, lambda: False)  # type: ignore[arg-type]
    assert backend.calls == [0.3]
