"""Starting and stopping a gateway: in the foreground, or detached with a pid file.

The embedded default is a gateway + local runner over SQLite in `AIR_HOME`.
On its first start it creates an admin token and writes the client config, so
`air submit` works with nothing typed.

Example:
    >>> proc = start_detached(GatewayOptions(port=8471, home=Path("/tmp/air")))  # doctest: +SKIP
    >>> stop_detached(Path("/tmp/air"))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import requests

from air_sdk.config import DEFAULT_PORT, air_home, write_client_config
from air_sdk.errors import AirError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from air_sdk.store import SqliteStore

TOKEN_FILE = "token"
STATE_FILE = "gateway.json"
LOG_FILE = "gateway.log"


@dataclass(frozen=True)
class GatewayOptions:
    """How to run a gateway."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    home: Path = field(default_factory=air_home)
    #: virtual nodes this machine is split into
    num_nodes: int = 2
    #: rank slots per virtual node; default: cores (or GPUs) divided evenly
    slots_per_node: int | None = None
    #: write ~/.config/air/config.toml with this gateway's URL and token
    write_client_config: bool = True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class GatewayProcess:
    pid: int
    url: str
    token: str
    log_path: Path


def _ensure_token(store: SqliteStore, home: Path) -> str:
    """The embedded admin token: created once, kept (0600) in AIR_HOME so restarts and
    `air gateway start --detach` can hand it to the client config again."""
    path = home / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if store.lookup_token(token) is not None:
            return token
    token = store.create_token(role="admin", name="embedded")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def build(opts: GatewayOptions) -> tuple[FastAPI, str]:
    """The app and its parts, without serving (tests and `serve` use this)."""
    from air_sdk.gateway.app import GatewayContext, create_app
    from air_sdk.runner import LocalBackend, Runner
    from air_sdk.store import SqliteStore

    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        raise AirError(
            f"refusing to listen on {opts.host}: the embedded gateway binds to 127.0.0.1 only"
        )
    opts.home.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(opts.home / "air.db")
    token = _ensure_token(store, opts.home)
    backend = LocalBackend(opts.num_nodes, opts.slots_per_node)
    runner = Runner(store, backend, opts.home, opts.url)
    app = create_app(GatewayContext(store=store, runner=runner, home=opts.home))
    return app, token


def serve(opts: GatewayOptions) -> None:
    """Run the gateway in the foreground until Ctrl-C or SIGTERM."""
    import uvicorn

    app, token = build(opts)
    if opts.write_client_config:
        write_client_config(opts.url, token)
    state = {"pid": os.getpid(), "url": opts.url}
    state_path = opts.home / STATE_FILE
    state_path.write_text(json.dumps(state))
    print(f"AIR gateway on {opts.url} (home {opts.home}); Ctrl-C stops it", flush=True)
    try:
        uvicorn.run(app, host=opts.host, port=opts.port, log_level="warning", access_log=False)
    finally:
        try:
            if json.loads(state_path.read_text()).get("pid") == os.getpid():
                state_path.unlink()
        except (OSError, ValueError):
            pass


def _alive(pid: int) -> bool:
    """True while `pid` runs; reaps it when it is our own exited child (a zombie)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: ask the kernel below
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def running_gateway(home: Path) -> GatewayProcess | None:
    """The detached gateway recorded in `home`, if its process is alive."""
    try:
        state = json.loads((home / STATE_FILE).read_text())
        pid, url = int(state["pid"]), str(state["url"])
    except (OSError, ValueError, KeyError):
        return None
    if not _alive(pid):
        return None
    token = (home / TOKEN_FILE).read_text().strip() if (home / TOKEN_FILE).exists() else ""
    return GatewayProcess(pid=pid, url=url, token=token, log_path=home / LOG_FILE)


def start_detached(opts: GatewayOptions, timeout_s: float = 60) -> GatewayProcess:
    """Start a gateway in the background and return once it answers /v1/health."""
    existing = running_gateway(opts.home)
    if existing is not None:
        raise AirError(
            f"a gateway (pid {existing.pid}) already runs at {existing.url} for {opts.home}:"
            " stop it with `air gateway stop` or use another --home"
        )
    opts.home.mkdir(parents=True, exist_ok=True)
    log_path = opts.home / LOG_FILE
    cmd = [
        sys.executable,
        "-m",
        "air_sdk.gateway.server",
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        "--home",
        str(opts.home),
        "--nodes",
        str(opts.num_nodes),
    ]
    if opts.slots_per_node:
        cmd += ["--slots-per-node", str(opts.slots_per_node)]
    if not opts.write_client_config:
        cmd.append("--no-client-config")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AirError(
                f"the gateway exited with code {proc.returncode}:\n" + "\n".join(_tail(log_path))
            )
        try:
            if requests.get(f"{opts.url}/v1/health", timeout=1).ok:
                token = (opts.home / TOKEN_FILE).read_text().strip()
                return GatewayProcess(pid=proc.pid, url=opts.url, token=token, log_path=log_path)
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AirError(f"the gateway did not answer within {timeout_s:g} s; see {log_path}")


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


def _tail(path: Path, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in deque(f, maxlen=n)]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m air_sdk.gateway.server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--slots-per-node", type=int, default=None)
    p.add_argument("--no-client-config", action="store_true")
    a = p.parse_args(argv)
    serve(
        GatewayOptions(
            host=a.host,
            port=a.port,
            home=a.home or air_home(),
            num_nodes=a.nodes,
            slots_per_node=a.slots_per_node,
            write_client_config=not a.no_client_config,
        )
    )


if __name__ == "__main__":
    main()
