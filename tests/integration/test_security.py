"""A real gateway and a real job: args reach the script verbatim (an argv list, never a
shell), and a secret env value reaches the workers while its log lines show "***"."""

from __future__ import annotations

import json
import secrets

import pytest

from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

ECHO_ARGS = """
import json, os, sys
print("ARGS " + json.dumps(sys.argv[1:]), flush=True)
key = os.environ.get("WANDB_API_KEY", "")
print("KEY OK" if key == os.environ["EXPECTED_REVERSED"][::-1] else "KEY WRONG", flush=True)
print("the key is " + key, flush=True)
"""


def test_shell_metacharacters_in_args_arrive_verbatim(gateway, workdir, tmp_path):
    marker = tmp_path / "pwned"
    args = [
        "; rm -rf /",
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"&& touch {marker} || true",
        "| cat /etc/passwd > /dev/null",
        "'quoted' \"double\" \\ back",
        "$HOME ${PATH} *.py ~",
        "--lr=0.1",
        "",
    ]
    key = f"canary-{secrets.token_hex(8)}"
    job = gateway.submit_script(
        workdir(ECHO_ARGS) / "train.py",
        args=args,
        # the script gets the key reversed too, to check it without printing it in clear
        env={"WANDB_API_KEY": key, "EXPECTED_REVERSED": key[::-1]},
    )
    record = job.wait(timeout=120)
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)
    echoed = [json.loads(t[len("ARGS ") :]) for t in lines if t.startswith("ARGS ")]
    assert echoed == [args]
    assert not marker.exists()
    # the worker had the real value; every place it could show says ***
    assert "KEY OK" in lines and "the key is ***" in lines
    assert key not in json.dumps([line.model_dump() for line in job.logs()])
    assert record.spec.env["WANDB_API_KEY"] == "***"
