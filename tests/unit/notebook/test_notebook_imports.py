"""`import air_sdk.notebook` stays light; its exports load their modules on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import air_sdk.notebook

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("ipywidgets", "matplotlib", "torch", "fastapi", "air_sdk.server", "air_sdk.gateway")


def loaded_after(code: str) -> list[str]:
    script = f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_package_and_renderers_import_no_widgets_or_matplotlib() -> None:
    loaded = loaded_after("import air_sdk.notebook, air_sdk.notebook.snapshot_html")
    assert heavy_in(loaded) == []


def test_client_still_light_with_the_monitor_method() -> None:
    loaded = loaded_after("import air_sdk.client; air_sdk.client.Job.monitor")
    assert heavy_in(loaded) == []


def test_lazy_exports_resolve_and_all_is_sorted() -> None:
    assert air_sdk.notebook.__all__ == sorted(air_sdk.notebook.__all__)
    from air_sdk.notebook.chart import render_chart_png
    from air_sdk.notebook.monitor import JobMonitor
    from air_sdk.notebook.snapshot_html import render_html, render_text

    assert air_sdk.notebook.JobMonitor is JobMonitor
    assert air_sdk.notebook.render_chart_png is render_chart_png
    assert air_sdk.notebook.render_html is render_html
    assert air_sdk.notebook.render_text is render_text
    assert set(air_sdk.notebook.__all__) <= set(dir(air_sdk.notebook))


def test_chart_module_imports_no_pyplot() -> None:
    loaded = loaded_after("import air_sdk.notebook.chart, air_sdk.notebook.monitor")
    assert "matplotlib.pyplot" not in loaded
    assert "ipywidgets" in loaded and "matplotlib" in loaded
