"""A newcomer on a shared machine where another user's gateway holds the default port
(8470): `air demo` and the notebook's `%air gateway start|stop` work with a gateway of
their own, and never stop (or use) the other user's. Real gateways, a real demo job and
a real IPython shell, as the user types them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from air_sdk.config import DEFAULT_PORT

pytestmark = pytest.mark.slow

AIR = [sys.executable, "-m", "air_sdk.cli.main"]


def user_env(root: Path) -> dict[str, str]:
    """A user of their own: HOME, AIR_HOME and the client config under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(root), "AIR_HOME": str(root / "air-home")}
    env["AIR_CONFIG_FILE"] = str(root / "config.toml")
    for name in ("AIR_GATEWAY_URL", "AIR_TOKEN", "AIR_GATEWAY_PORT", "AIR_GATEWAY_OPTIONS"):
        env.pop(name, None)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AIR, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=env["HOME"]
    )


@pytest.fixture
def other_users_gateway(tmp_path: Path):
    """Another user's gateway on the default port."""
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", DEFAULT_PORT))
    except OSError:
        pytest.skip(
            f"port {DEFAULT_PORT} is in use here; this test plays another user's gateway on it"
        )
    finally:
        probe.close()
    env = user_env(tmp_path / "other")
    start = run(env, "gateway", "start", "--detach", "--nodes", "1", "--port", str(DEFAULT_PORT))
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield f"http://127.0.0.1:{DEFAULT_PORT}"
    finally:
        run(env, "gateway", "stop", timeout=60)


def answers(url: str) -> bool:
    return requests.get(f"{url}/v1/health", timeout=10).ok


def test_make_demo_beside_another_users_gateway(other_users_gateway, tmp_path):
    env = user_env(tmp_path / "newcomer")
    demo = run(env, "demo", "--steps", "20")
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert f"the gateway at {other_users_gateway} is not yours" in " ".join(out.split())
    assert "SUCCEEDED" in out and "stopped the gateway the demo started" in out
    assert answers(other_users_gateway)  # theirs is untouched


NOTEBOOK = """
import json, sys
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
shell.run_line_magic("load_ext", "air_sdk")
said = []
for line in sys.argv[1:]:
    try:
        shell.run_line_magic("air", line)
        said.append("ok")
    except UsageError as exc:
        said.append("UsageError: " + str(exc))
    if line == "gateway start":
        from air_sdk import Client
        said.append("jobs: %d" % len(Client().jobs()))  # the config points at a gateway of ours
print("SAID " + json.dumps(said))
"""


def notebook(env: dict[str, str], *lines: str) -> tuple[list[str], str]:
    import json

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK), *lines],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=env["HOME"],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout.split("SAID ", 1)[1])
    return said, done.stdout


def test_a_notebook_starts_and_stops_only_its_own_gateway(other_users_gateway, tmp_path):
    env = user_env(tmp_path / "newcomer")
    said, out = notebook(env, "gateway start", "gateway stop")
    assert said[:2] == ["ok", "jobs: 0"], out
    assert f"port {DEFAULT_PORT} is taken" in out and "stopped the gateway (pid" in out
    assert answers(other_users_gateway)

    # the newcomer's own CLI gateway, then a notebook: reused, of the wrong shape refused,
    # and left running by the notebook's last cell
    start = run(env, "gateway", "start", "--detach", "--nodes", "2")
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        said, out = notebook(
            env, "gateway start", "gateway start --nodes 2 --slots-per-node 3", "gateway stop"
        )
        assert said[:2] == ["ok", "jobs: 0"], out
        assert "started outside this notebook" in out
        assert said[2].startswith("UsageError: a gateway already runs from"), said
        assert "per node, not 3" in said[2] and "`air gateway stop`" in said[2]
        assert "was not started by this notebook: left running" in out
        status = run(env, "jobs")
        assert status.returncode == 0, status.stdout + status.stderr  # still up, and ours
    finally:
        run(env, "gateway", "stop", timeout=60)
    assert answers(other_users_gateway)
