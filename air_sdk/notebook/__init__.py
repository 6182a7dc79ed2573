"""Notebook views of a job: pure renderers (JobSnapshot -> HTML, text, PNG) and the
live ipywidgets monitor; and code from a notebook to the ranks (`capture`, `submit`,
`function`: `%%air train` cells and `@air_sdk.distributed` calls).

Exports are lazy, so `import air_sdk.notebook` loads neither ipywidgets nor
matplotlib; the first use of `JobMonitor` or `render_chart_png` does.

Example:
    >>> from air_sdk.notebook import JobMonitor
    >>> JobMonitor(client.job("train-5d41402a"), total_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from air_sdk.notebook.chart import render_chart_png
    from air_sdk.notebook.monitor import JobMonitor
    from air_sdk.notebook.snapshot_html import render_html, render_text

__all__ = ["JobMonitor", "render_chart_png", "render_html", "render_text"]

_HOMES = {
    "JobMonitor": "air_sdk.notebook.monitor",
    "render_chart_png": "air_sdk.notebook.chart",
    "render_html": "air_sdk.notebook.snapshot_html",
    "render_text": "air_sdk.notebook.snapshot_html",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'air_sdk.notebook' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
