"""The live monitor in a real JupyterLab + chromium: it updates while the kernel is idle,
and its Cancel button stops every process of the job.

The quickstart is run in two steps, as a user would: everything up to and including
the `%%air train` cell, then the rest. The rest starts with `job.wait()`, which keeps
the kernel busy until the job ends; the first step proves the monitor is driven
without it (the kernel is idle because `%%air train` returned at once), and the
Cancel test needs an idle kernel because widget clicks are not processed while a
cell runs.
"""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from airtest import job_processes, no_processes_left, wait_for
from monitor_page import (
    CANCEL,
    PROGRESS_BAR,
    STEP,
    chart_src,
    gateway_client,
    state_text,
    step_number,
    wait_state,
)
from notebook_env import REPO

from air_sdk.gateway.server import running_gateway

pytestmark = pytest.mark.slow

QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"


def test_monitor_updates_live_while_the_kernel_is_idle(
    open_notebook: Any, jupyter_lab: Any, screenshot: Any
) -> None:
    notebook = open_notebook(QUICKSTART)
    page = notebook.page
    # The cell after %%air train blocks in job.wait(): run up to it first.
    assert notebook.num_code_cells_before("%%air train") + 1 == notebook.num_code_cells_before(
        "job.wait("
    ), "the quickstart's %%air train cell must come right before the job.wait() cell"

    # 1. Up to the %%air train cell: it submits and returns at once.
    notebook.run_above("job.wait(")
    assert page.locator(".air-monitor").count() == 1, notebook.text()
    with gateway_client(jupyter_lab.env) as client:
        jobs = client.jobs()
    assert [job.name for job in jobs] == ["quickstart"], jobs
    job_id = jobs[0].id
    assert job_id in state_text(notebook), (job_id, state_text(notebook))

    wait_state(notebook, "RUNNING", timeout_s=60)
    assert "attempt 1" in state_text(notebook), state_text(notebook)

    # 2. The step and the chart move while the kernel is idle: sample the DOM, keeping
    # only samples taken while the status bar says Idle.
    steps_seen: set[int] = set()
    charts_seen: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        idle = notebook.is_idle()
        step = step_number(page.locator(STEP).inner_text())
        src = chart_src(notebook)
        if idle and notebook.is_idle():  # idle before and after the reads
            if step is not None:
                steps_seen.add(step)
            if src:
                charts_seen.add(src)
        if len(steps_seen) >= 3 and len(charts_seen) >= 3:
            break
        if any(s in state_text(notebook) for s in ("SUCCEEDED", "FAILED", "CANCELLED")):
            break
        time.sleep(0.15)
    assert len(steps_seen) >= 3, f"the step did not move while idle: {sorted(steps_seen)}"
    assert len(charts_seen) >= 2, f"the chart did not redraw while idle: {len(charts_seen)}"

    # 3. The end: SUCCEEDED, a full progress bar, and a picture for the docs
    # (docs/images/monitor.png with AIR_UPDATE_SCREENSHOTS=1).
    wait_state(notebook, "SUCCEEDED", timeout_s=120)
    wait_for(
        lambda: "width: 100%" in (page.locator(PROGRESS_BAR).get_attribute("style") or ""),
        timeout_s=10,
        what="a full progress bar",
    )
    final = page.locator(STEP).inner_text()
    assert "(100%)" in final and (step_number(final) or 0) >= max(steps_seen), final
    screenshot(page.locator(".air-monitor"), "monitor.png")

    # 4. The rest of the notebook: wait, read the metrics back, stop the gateway.
    notebook.run_from("job.wait(")
    assert "loss points from 2 ranks" in notebook.outputs_text(), notebook.text()
    assert running_gateway(jupyter_lab.env.air_home) is None, "%air gateway stop left it running"
    assert no_processes_left(job_id)


CANCEL_NOTEBOOK = [
    "%load_ext air_sdk\n%air gateway start",
    textwrap.dedent(
        """\
        %%air train --nodes 2 --name runs-until-cancelled
        import time

        import air_sdk.runtime as air

        air.init()
        for step in range(1, 1_000_000):
            air.log(step=step, loss=1.0 / step)
            time.sleep(0.05)
        air.shutdown()"""
    ),
    'print("submitted", _air_job.id)',
    "%air gateway stop",
]


def test_cancel_button_stops_every_process_of_the_job(
    open_notebook: Any, jupyter_lab: Any, tmp_path: Path
) -> None:
    source = tmp_path / "cancel.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CANCEL_NOTEBOOK]
    nbformat.write(nb, source)
    notebook = open_notebook(source)
    page = notebook.page

    notebook.run_above("%air gateway stop")
    printed = re.search(r"submitted (\S+)", notebook.outputs_text())
    assert printed, notebook.text()
    job_id = printed.group(1)
    assert job_id in state_text(notebook), (job_id, state_text(notebook))

    # Running for real: steps arrive and the ranks are processes on this machine.
    wait_state(notebook, "RUNNING", timeout_s=60)
    wait_for(
        lambda: (step_number(page.locator(STEP).inner_text()) or 0) >= 3,
        timeout_s=60,
        what="step 3 in the monitor",
    )
    assert job_processes(job_id), f"no process of {job_id} runs"
    assert notebook.is_idle(), notebook.status()

    cancel = page.locator(CANCEL)
    assert cancel.is_enabled(), "the Cancel button is disabled while the job runs"
    cancel.click()
    wait_state(notebook, "CANCELLED", timeout_s=60)
    wait_for(
        lambda: no_processes_left(job_id), timeout_s=30, what=f"every process of {job_id} gone"
    )
    with gateway_client(jupyter_lab.env) as client:
        record = client.job_record(job_id)
    assert record.state.value == "CANCELLED", record
    stopped_at = step_number(page.locator(STEP).inner_text())
    time.sleep(1.5)  # nothing may report after CANCELLED
    assert step_number(page.locator(STEP).inner_text()) == stopped_at

    notebook.run_cell("%air gateway stop")
    assert running_gateway(jupyter_lab.env.air_home) is None, "%air gateway stop left it running"
