"""`air.should_stop()` / `air.exit_stopped()`: a SIGTERM asks the loop to save and leave."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import air_sdk.runtime as air
from air_sdk.runtime import _stop


def test_a_script_that_asks_saves_on_sigterm_and_exits_as_preempted(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys
            import air_sdk.runtime as air

            for step in range(1, 1000):
                if step == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # the runner's SIGTERM
                if air.should_stop():
                    print(f"saving at step {step}", flush=True)
                    air.exit_stopped()
            print("never here")
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 143, out.stderr
    assert out.stdout.strip() == "saving at step 3"


def test_a_script_that_never_asks_keeps_the_default_sigterm(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        "import time, air_sdk.runtime as air\nair.log(step=1, x=1.0)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    try:
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()


def test_should_stop_is_false_until_asked():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert air.should_stop() is False
        assert "should_stop" in air.__all__ and "exit_stopped" in air.__all__
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop._installed = False
