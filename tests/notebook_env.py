"""An isolated AIR + Jupyter environment for tests that run notebooks (nbval, browser).

Everything a notebook run could touch lives under one temporary directory: HOME,
AIR_HOME, the client config file, Jupyter's config/data/runtime dirs, IPython's
profile and matplotlib's cache. `AIR_GATEWAY_URL` names a free port, so
`%air gateway start` in the notebook never meets the user's gateway on 8470 or
their `~/.config/air`. Every process started with this env (JupyterLab, the
kernel, the gateway it starts, torchrun agents and ranks) inherits a marker
variable, so a finalizer can find and kill whatever a failed run left behind.

Example:
    >>> env = isolated_env(tmp_path)  # doctest: +SKIP
    >>> subprocess.run([...], env=env.vars)  # doctest: +SKIP
    >>> env.cleanup()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from air_sdk.runner.backends.local import free_port

REPO = Path(__file__).resolve().parents[1]
MARKER = "AIR_TEST_RUN"

#: JupyterLab settings for a quiet, offline, predictable test browser: no news or update
#: check, and every cell attached to the DOM (the default windowing detaches or skips
#: cells out of view, so a locator could miss them).
_LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


@dataclass(frozen=True)
class IsolatedEnv:
    root: Path
    vars: dict[str, str]

    @property
    def marker(self) -> str:
        return self.vars[MARKER]

    @property
    def gateway_url(self) -> str:
        return self.vars["AIR_GATEWAY_URL"]

    @property
    def air_home(self) -> Path:
        return Path(self.vars["AIR_HOME"])

    @property
    def config_file(self) -> Path:
        return Path(self.vars["AIR_CONFIG_FILE"])

    def processes(self) -> list[psutil.Process]:
        """Live processes started with this env (the caller itself never carries it)."""
        return marked_processes(self.marker)

    def cleanup(self, grace_s: float = 0.0) -> list[str]:
        """Kill everything started with this env that is still there after `grace_s`.

        Returns a description of each process it had to kill (empty: a clean exit).
        """
        deadline = time.monotonic() + grace_s
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        return kill_marked(self.marker)


def isolated_env(root: Path) -> IsolatedEnv:
    """Build the env under `root` (created); nothing of the caller's AIR/Jupyter state leaks in."""
    root.mkdir(parents=True, exist_ok=True)
    home = root / "home"
    dirs = {
        "HOME": home,
        "AIR_HOME": root / "air-home",
        "JUPYTER_CONFIG_DIR": root / "jupyter" / "config",
        "JUPYTER_DATA_DIR": root / "jupyter" / "data",
        "JUPYTER_RUNTIME_DIR": root / "jupyter" / "runtime",
        "IPYTHONDIR": root / "ipython",
        "MPLCONFIGDIR": root / "matplotlib",
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIR_", "JUPYTER", "JPY_")) and k not in ("IPYTHONDIR", "PYTHONPATH")
    }
    env.update({k: str(v) for k, v in dirs.items()})
    env.update(
        {
            "AIR_CONFIG_FILE": str(home / ".config" / "air" / "config.toml"),
            "AIR_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
            MARKER: uuid.uuid4().hex,
            # The venv first, so `python`, `jupyter` and `air` are this checkout's.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    settings = dirs["JUPYTER_CONFIG_DIR"] / "lab" / "user-settings"
    for name, value in _LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return IsolatedEnv(root, env)


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_marked(marker: str, timeout_s: float = 10) -> list[str]:
    """SIGKILL every process carrying `marker` (repeatedly: a dying parent may spawn)."""
    killed: list[str] = []
    for _ in range(5):
        procs = marked_processes(marker)
        if not procs:
            break
        for p in procs:
            try:
                what = " ".join(p.cmdline())[:160]
                p.send_signal(signal.SIGKILL)
                killed.append(f"{p.pid}: {what}")
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=timeout_s)
    return killed
