"""The AIR monitor as a browser test reads it: its CSS classes and small DOM queries.

The monitor tags its widgets with `add_class` (air_sdk/notebook/monitor.py), so these
selectors name what a user sees: the state badge, the step line, the chart, the
metric menu, the checkpoints table.

Example:
    >>> wait_state(notebook, "SUCCEEDED", timeout_s=60)  # doctest: +SKIP
    >>> metric_options(notebook.page)  # doctest: +SKIP
    ['train_loss', 'epoch']
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from notebook_env import IsolatedEnv

from air_sdk.client import Client

MONITOR = ".air-monitor"
STATE = ".air-monitor .air-state"
STEP = ".air-monitor .air-step"
CHART = ".air-monitor .air-chart"
METRICS = ".air-monitor .air-metrics"
METRIC_SELECT = ".air-monitor .air-metric select"
CHECKPOINTS = ".air-monitor .air-checkpoints"
PROGRESS_BAR = ".air-monitor .widget-hprogress.air-progress .progress-bar"
CANCEL = ".air-monitor .air-cancel"
_STEP_NUMBER = re.compile(r"step (\d+)")


def state_text(notebook: Any) -> str:
    return str(notebook.page.locator(STATE).inner_text())


def wait_state(notebook: Any, state: str, timeout_s: float) -> None:
    """Wait, polling in the page (every frame, so a short state is not missed)."""
    try:
        notebook.page.wait_for_function(
            "([sel, state]) => (document.querySelector(sel)?.innerText || '').includes(state)",
            arg=[STATE, state],
            timeout=timeout_s * 1000,
        )
    except Exception as exc:
        raise AssertionError(
            f"the monitor never showed {state} within {timeout_s:g} s; it shows"
            f" {state_text(notebook)!r}:\n{notebook.text()}"
        ) from exc


def chart_src(notebook: Any) -> str | None:
    return notebook.page.evaluate(
        "(sel) => document.querySelector(sel)?.getAttribute('src') ?? null", CHART
    )


def metric_options(page: Any) -> list[str]:
    """The names in the monitor's chart menu, in its order."""
    return [text.strip() for text in page.locator(f"{METRIC_SELECT} option").all_inner_texts()]


def step_number(text: str) -> int | None:
    match = _STEP_NUMBER.search(text)
    return int(match.group(1)) if match else None


def gateway_client(env: IsolatedEnv) -> Client:
    """A client with the token `%air gateway start` wrote (config file, else AIR_HOME)."""
    token = None
    if env.config_file.exists():
        token = tomllib.loads(env.config_file.read_text()).get("token")
    if not token:
        token = (env.air_home / "token").read_text().strip()
    return Client(env.gateway_url, token, max_attempts=2)
