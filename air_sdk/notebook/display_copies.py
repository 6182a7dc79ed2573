"""The static copies of a live view that a notebook keeps, brought up to date.

A live widget shows the job as it goes, but what a notebook saves (nbconvert,
GitHub, a reload without the kernel) is each output's static `text/html`: the
state at the moment the view was displayed. `DisplayCopies` displays a view under
a display id and, when the job has ended, sends `update_display_data` with the
final bundle, so the saved output shows how the job ended.

Example:
    >>> copies = DisplayCopies()
    >>> copies.show({"text/plain": "RUNNING"})  # doctest: +SKIP
    >>> copies.update({"text/plain": "SUCCEEDED"})  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["DisplayCopies"]

log = logging.getLogger(__name__)


class DisplayCopies:
    """The display handles of one view, each one updated in place on `update`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: list[Any] = []

    def show(self, bundle: dict[str, Any]) -> None:
        """Display `bundle` (a mimebundle) under a new display id, and keep its handle."""
        from IPython.display import display

        handle = display(bundle, raw=True, display_id=True)
        if handle is not None:  # None outside IPython
            with self._lock:
                self._handles.append(handle)

    def update(self, bundle: dict[str, Any]) -> None:
        """Replace every displayed copy with `bundle` (from any thread)."""
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            try:
                handle.update(bundle, raw=True)
            except Exception:  # a closed kernel channel: the live view still stands
                log.debug("could not update display %s", handle.display_id, exc_info=True)
