"""A gateway on this machine, from the client's side: start one detached, find the one
running from an AIR home, stop it, or reuse the one running from the home.

A detached gateway is `python -m air_sdk.gateway.server` in its own session, with
its `GatewayOptions` as JSON in `$AIR_GATEWAY_OPTIONS`; it records its pid and URL
in `<home>/gateway.json` and its admin token in `<home>/token`. Nothing here
imports the server: `%air gateway start` and the CLI both come through here.

Examples marked `+SKIP` start or stop real gateway processes.

Example:
    >>> from air_sdk.gateway_config import GatewayOptions
    >>> proc = start_detached(GatewayOptions(port=8471, home=Path("/tmp/air")))  # doctest: +SKIP
    >>> running_gateway(Path("/tmp/air")).url  # doctest: +SKIP
    'http://127.0.0.1:8471'
    >>> stop_detached(Path("/tmp/air"))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import requests

from air_sdk.client.ports import choose_port
from air_sdk.config import write_client_config
from air_sdk.errors import AirError
from air_sdk.gateway_config import LOG_FILE, OPTIONS_ENV, STATE_FILE, TOKEN_FILE, GatewayOptions
from air_sdk.procs import alive

__all__ = [
    "GatewayProcess",
    "LocalGateway",
    "ensure_local_gateway",
    "running_gateway",
    "start_detached",
    "stop_detached",
]


@dataclass(frozen=True)
class GatewayProcess:
    """A detached gateway: its pid, URL, admin token and log file."""

    pid: int
    url: str
    token: str
    log_path: Path
    #: said when the default port was taken and another was picked ("" otherwise)
    port_note: str = ""


@dataclass(frozen=True)
class LocalGateway:
    """The gateway `ensure_local_gateway` settled on, and how: `started` now, or
    already `running` from this home."""

    url: str
    home: Path
    how: Literal["started", "running"]
    process: GatewayProcess | None = None


def _alive(pid: int, started: float | None = None) -> bool:
    """True while `pid` runs and (with `started`) is the process that started then;
    reaps it when it is our own exited child. A zombie, or a process still being torn
    down after a SIGKILL (it shows as running for a while), is not alive: a gateway
    restarted right after killing the old one must not be refused."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: ask the kernel below
    return alive(pid, started)


def running_gateway(home: Path) -> GatewayProcess | None:
    """The detached gateway recorded in `home`, if its process is alive.

    Example:
        >>> running_gateway(Path("/nonexistent")) is None
        True
    """
    try:
        state = json.loads((home / STATE_FILE).read_text())
        pid, url = int(state["pid"]), str(state["url"])
        started = float(state["started"]) if state.get("started") is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid, started):
        return None
    token = (home / TOKEN_FILE).read_text().strip() if (home / TOKEN_FILE).exists() else ""
    return GatewayProcess(pid=pid, url=url, token=token, log_path=home / LOG_FILE)


def start_detached(opts: GatewayOptions, timeout_s: float = 60) -> GatewayProcess:
    """Start a gateway in the background and return once it listens on its port and
    answers /v1/health.

    A taken port is a `ConfigError` naming its holder when the port was asked for;
    otherwise the next free port is used (`GatewayProcess.port_note` says so). A
    gateway that exits at once (a bad option, a port taken meanwhile) is an
    `AirError` carrying the end of its log. Nothing is taken for started until the
    child itself records that it holds the port: something else answering there
    (another user's gateway) never counts.
    """
    existing = running_gateway(opts.home)
    if existing is not None:
        raise AirError(
            f"a gateway (pid {existing.pid}) already runs at {existing.url} for {opts.home}:"
            " stop it with `air gateway stop` or use another --home"
        )
    choice = choose_port(opts)
    opts = choice.opts
    opts.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = opts.home / LOG_FILE
    if opts.cluster_file is not None:  # the child may start elsewhere: an absolute path
        opts = opts.model_copy(update={"cluster_file": Path(opts.cluster_file).resolve()})
    env = {**os.environ, OPTIONS_ENV: opts.model_dump_json()}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "air_sdk.gateway.server"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AirError(
                f"the gateway exited with code {proc.returncode}:\n" + "\n".join(_tail(log_path))
            )
        try:
            # The child writes its pid once it holds the port (and its token exists).
            if _recorded_pid(opts.home) == proc.pid and _healthy(opts):
                token = (opts.home / TOKEN_FILE).read_text().strip()
                return GatewayProcess(
                    pid=proc.pid,
                    url=opts.url,
                    token=token,
                    log_path=log_path,
                    port_note=choice.note,
                )
        except (requests.RequestException, OSError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise AirError(f"the gateway did not answer within {timeout_s:g} s; see {log_path}")


def _recorded_pid(home: Path) -> int | None:
    try:
        return int(json.loads((home / STATE_FILE).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _healthy(opts: GatewayOptions) -> bool:
    # Liveness only (no token is sent), so a self-signed certificate is fine here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return requests.get(f"{opts.worker_url}/v1/health", timeout=1, verify=False).ok


def stop_detached(home: Path, timeout_s: float = 30) -> bool:
    """Stop the gateway recorded in `home` (SIGTERM, then SIGKILL). False if none ran."""
    gw = running_gateway(home)
    if gw is None:
        return False
    os.kill(gw.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(gw.pid):
            break
        time.sleep(0.05)
    else:
        os.kill(gw.pid, signal.SIGKILL)
    (home / STATE_FILE).unlink(missing_ok=True)
    return True


def ensure_local_gateway(**options: Any) -> LocalGateway:
    """A gateway for this machine's notebooks and scripts: the one running from the
    home if any, else a new detached one. A gateway this home did not start (another
    user's, on the default port of a shared machine) is never reused: its token is not
    ours. When the port was not asked for and something else holds it, the new gateway
    takes the next free port (`GatewayProcess.port_note` says so).

    `options` are `GatewayOptions` fields (home, port, num_nodes, slots_per_node ...).
    The client config is written for the gateway started or found in the home, so
    `Client()` uses it.

    Example:
        >>> gw = ensure_local_gateway(port=8471, num_nodes=2)  # doctest: +SKIP
        >>> gw.how, gw.url  # doctest: +SKIP
        ('started', 'http://127.0.0.1:8471')
    """
    opts = GatewayOptions(**options)
    running = running_gateway(opts.home)
    if running is not None:
        write_client_config(running.url, running.token)
        return LocalGateway(url=running.url, home=opts.home, how="running", process=running)
    process = start_detached(opts)
    write_client_config(process.url, process.token)
    return LocalGateway(url=process.url, home=opts.home, how="started", process=process)


def _tail(path: Path, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in deque(f, maxlen=n)]
    except OSError:
        return []
