"""The monitor's failure panel (live, saved and text) shows a rank's traceback in the
user's terms: no AIR launcher frames, paths as in the workdir (issue 21 item 6)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

from air_sdk.notebook.snapshot_html import render_html, render_text
from air_sdk.runtime import _rank_main
from air_sdk.schema import Event, FailureInfo, JobSnapshot

JOB = "script-5d41402a"


def _real_traceback(tmp_path: Path) -> list[str]:
    """What a rank prints when the user's module raises, run as AIR runs it: by the rank
    launcher, in the job's code directory on the gateway."""
    code = tmp_path / "home" / "jobs" / JOB / "code"
    code.mkdir(parents=True)
    (code / "helper.py").write_text('def main():\n    raise ValueError("bad lr")\n')
    (code / "train.py").write_text("import helper\nhelper.main()\n")
    ran = subprocess.run(
        [sys.executable, "-u", _rank_main.__file__, "-m", "train"],
        cwd=code,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1 and "_rank_main.py" in ran.stderr
    return ran.stderr.splitlines()


def test_the_failure_panel_shows_the_users_frames(tmp_path: Path) -> None:
    tail = _real_traceback(tmp_path)
    failure = FailureInfo(attempt=1, reason="", rank=0, exit_code=1, log_tail=tail)
    events = [
        Event(seq=1, job_id=JOB, ts=1.0, type="state", data={"state": "RUNNING"}),
        Event(
            seq=2, job_id=JOB, ts=2.0, type="state",
            data={"state": "FAILED", "failure": failure.model_dump(mode="json")},
        ),
    ]  # fmt: skip
    snapshot = JobSnapshot.fold(JOB, events)

    for shown in (
        html.unescape(re.sub(r"<[^>]+>", "", render_html(snapshot))),
        render_text(snapshot),
    ):
        assert 'File "train.py", line 2, in <module>' in shown
        assert 'File "helper.py", line 2, in main' in shown
        assert "ValueError: bad lr" in shown
        assert "_rank_main" not in shown and "runpy" not in shown
        assert f"/jobs/{JOB}/code/" not in shown
