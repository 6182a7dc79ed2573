"""What the terminal shows while `air submit` bundles a work directory: a rich progress
bar with bytes on a terminal, one line elsewhere (CI, pipes), nothing for a small tree.

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

__all__ = ["BUNDLE_PROGRESS_MIN_BYTES", "BundleProgress"]


#: a bundle smaller than this packs in a blink: no progress is shown
BUNDLE_PROGRESS_MIN_BYTES = 16 << 20


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

    def __enter__(self) -> BundleProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, done: int, total: int) -> None:
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
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
