"""What the terminal shows while `air submit` bundles a work directory: while the tree
is scanned, a spinner with the files and bytes found so far (on a terminal only); while
it is packed, a rich progress bar with bytes on a terminal, one line elsewhere (CI,
pipes); nothing for a small tree.

Example:
    >>> from rich.console import Console
    >>> with BundleProgress(Console(), "train/") as progress:
    ...     progress(1 << 20, 1 << 20)  # 1 MiB: packs in a blink, nothing shown
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.status import Status

__all__ = ["BUNDLE_PROGRESS_MIN_BYTES", "SCAN_PROGRESS_MIN_FILES", "BundleProgress"]


#: a bundle smaller than this packs in a blink: no progress is shown
BUNDLE_PROGRESS_MIN_BYTES = 16 << 20
#: a tree with fewer files (and bytes) is scanned in a blink: no spinner is shown
SCAN_PROGRESS_MIN_FILES = 500


class BundleProgress:
    """What the terminal shows while a large workdir is bundled: a rich progress bar
    with bytes on a terminal, one line elsewhere; nothing for a small one. Call it with
    (done, total) bytes, as `Client.submit_script(progress=...)` does; `close()` at the end.

    Example:
        >>> with BundleProgress(console, "train/") as progress:  # doctest: +SKIP
        ...     job = client.submit_script("train.py", progress=progress)
    """

    def __init__(self, console: Console, what: str) -> None:
        self.console = console
        self.what = what
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._said = False
        self._scanning: Status | None = None

    def scanned(self, num_files: int, num_bytes: int) -> None:
        """What the scan found so far, as `Client.submit_script(on_scan=...)` says it:
        a spinner on a terminal once the tree is large (`SCAN_PROGRESS_MIN_FILES`
        files, or 16 MiB); nothing in a pipe, where a line per report would be noise
        (one line is said when packing starts)."""
        if not self.console.is_terminal:
            return
        if num_files < SCAN_PROGRESS_MIN_FILES and num_bytes < BUNDLE_PROGRESS_MIN_BYTES:
            return
        text = f"scanning {self.what}: {num_files:,} files, {num_bytes / (1 << 20):.1f} MiB"
        if self._scanning is None:
            self._scanning = self.console.status(text)
            self._scanning.start()
        else:
            self._scanning.update(text)

    def _scan_done(self) -> None:
        if self._scanning is not None:
            self._scanning.stop()
            self._scanning = None

    def __enter__(self) -> BundleProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, done: int, total: int) -> None:
        self._scan_done()  # packing has started
        if total < BUNDLE_PROGRESS_MIN_BYTES:
            return
        if not self.console.is_terminal:
            if not self._said:
                self._said = True
                self.console.print(
                    f"bundling {self.what}: {total / (1 << 20):.1f} MiB", soft_wrap=True
                )
            return
        if self._bar is None:
            self._bar = Progress(
                TextColumn("bundling {task.description}"),
                BarColumn(),
                DownloadColumn(binary_units=True),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=total)
        assert self._task is not None
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        self._scan_done()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
