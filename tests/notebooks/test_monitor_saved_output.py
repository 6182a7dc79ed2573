"""A notebook executed by nbclient (as `jupyter nbconvert --execute` does) saves the
monitor's final state in the cell that displayed it, not "RUNNING, no steps yet"
(issue 21 item 7). A real kernel; the job is a stand-in whose events the notebook
releases, so no gateway is needed."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_env import isolated_env

pytestmark = pytest.mark.slow

SHOW = '''
import threading
from types import SimpleNamespace
from air_sdk.notebook.monitor import JobMonitor
from air_sdk.schema import Event, JobSnapshot

def event(seq, type_, rank=None, **data):
    return Event(seq=seq, job_id="j-saved", ts=float(seq), type=type_, rank=rank, data=data)

class Job:
    """RUNNING with no steps until `ended` is set, then step 5 and SUCCEEDED."""
    id = "j-saved"
    def __init__(self):
        self.ended = threading.Event()
    def record(self):
        return SimpleNamespace(name="demo")
    def snapshot(self):
        return JobSnapshot.fold(self.id, [event(1, "state", state="RUNNING")])
    def follow(self, after=0):
        self.ended.wait(120)
        yield event(2, "metrics", rank=0, points=[{"step": 5, "ts": 2.0, "values": {"loss": 0.5}}])
        yield event(3, "state", state="SUCCEEDED")
    def cancel(self):
        pass

job = Job()
monitor = JobMonitor(job)
monitor
'''
WAIT = "job.ended.set()\nmonitor.wait(120).state.value"


def test_the_saved_notebook_shows_the_final_state(tmp_path: Path) -> None:
    env = isolated_env(tmp_path / "env")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(SHOW), nbformat.v4.new_code_cell(WAIT)]
    try:
        NotebookClient(nb, timeout=180, kernel_name="python3").execute(env=env.vars)
    finally:
        env.cleanup(grace_s=5)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)

    saved = nbformat.read(path, as_version=4)
    shown = [o for o in saved.cells[0].outputs if "text/html" in o.get("data", {})]
    assert len(shown) == 1, saved.cells[0].outputs
    html = re.sub(r"<[^>]+>", " ", shown[0]["data"]["text/html"])
    assert "SUCCEEDED" in html and "RUNNING" not in html, html
    assert re.search(r"\bstep\s+5\b", html), html
    assert "SUCCEEDED" in shown[0]["data"]["text/plain"]
