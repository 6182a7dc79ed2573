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
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from air_sdk.config import DEFAULT_PORT, air_home, write_client_config
from air_sdk.errors import AirError
from air_sdk.gateway.options import RequestLimits, SecurityOptions, check_bind, is_loopback
from air_sdk.runner.node import _procs

if TYPE_CHECKING:
    from fastapi import FastAPI

    from air_sdk.runner.backends.base import Backend
    from air_sdk.scheduler import ClusterConfig
    from air_sdk.store import SqliteStore

TOKEN_FILE = "token"
STATE_FILE = "gateway.json"
LOG_FILE = "gateway.log"


@dataclass(frozen=True)
class GatewayOptions:
    """How to run a gateway.

    A loopback `host` is always allowed; any other needs `tls_cert` + `tls_key` or an
    explicit `insecure_bind` (see `air_sdk.gateway.security.check_bind`).
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    home: Path = field(default_factory=air_home)
    #: virtual nodes this machine is split into
    num_nodes: int = 2
    #: rank slots per virtual node; default: cores (or GPUs) divided evenly
    slots_per_node: int | None = None
    #: write ~/.config/air/config.toml with this gateway's URL and token
    write_client_config: bool = True
    #: PEM certificate and key: serve HTTPS (uvicorn ssl_certfile / ssl_keyfile)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: serve plain HTTP on a non-loopback address (only behind a TLS proxy you trust)
    insecure_bind: bool = False
    #: Host header names served besides 127.0.0.1, localhost, [::1] and `host`
    allowed_hosts: tuple[str, ...] = ()
    #: browser origins allowed to call the API (CORS); none by default
    cors_origins: tuple[str, ...] = ()
    #: body caps and rate limits (users, workers, anonymous callers)
    limits: RequestLimits = field(default_factory=RequestLimits)
    #: cluster TOML (docs/scheduling.md): pools of nodes, tenant quotas and weights,
    #: scheduler switches; None: this machine's virtual nodes and the default policy
    cluster_file: Path | None = None
    #: where jobs run: "local" (torchrun agents on this machine) or "ray"
    backend: str = "local"
    #: the Ray cluster to join ("auto", "ray://host:10001", "host:6379"); None: $RAY_ADDRESS
    ray_address: str | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def worker_url(self) -> str:
        """Where this machine's workers report: loopback when bound to every address."""
        if self.host in ("0.0.0.0", "::"):
            return dataclasses.replace(self, host="127.0.0.1").url
        return self.url

    @property
    def security(self) -> SecurityOptions:
        return SecurityOptions(
            allowed_hosts=(*self.allowed_hosts, self.host),
            cors_origins=self.cors_origins,
            limits=self.limits,
        )


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
    from air_sdk.runner import Runner
    from air_sdk.store import SqliteStore

    check_bind(
        opts.host, tls_cert=opts.tls_cert, tls_key=opts.tls_key, insecure_bind=opts.insecure_bind
    )
    # Only this user reads the database, bundles and job files (made so when created).
    opts.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    store = SqliteStore(opts.home / "air.db")
    token = _ensure_token(store, opts.home)
    cluster = load_cluster(opts.cluster_file)
    backend = make_backend(opts, cluster)
    runner = Runner(
        store,
        backend,
        opts.home,
        opts.worker_url,
        policy=cluster.policy if cluster is not None else None,
    )
    app = create_app(
        GatewayContext(store=store, runner=runner, home=opts.home), security=opts.security
    )
    return app, token


def load_cluster(path: Path | None) -> ClusterConfig | None:
    """The cluster file's pools and policy; errors name the file and the field."""
    if path is None:
        return None
    from air_sdk.scheduler import load_cluster_config

    try:
        return load_cluster_config(path)
    except OSError as exc:
        raise AirError(f"cannot read the cluster file {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise AirError(str(exc)) from exc


def make_backend(opts: GatewayOptions, cluster: ClusterConfig | None = None) -> Backend:
    """The backend `opts` names. The local backend runs the cluster file's pools as
    virtual nodes of this machine when it has any; on Ray the inventory is the Ray
    cluster's nodes."""
    pools = cluster.inventory if cluster is not None else []
    if opts.backend == "local":
        from air_sdk.runner import LocalBackend

        return LocalBackend(opts.num_nodes, opts.slots_per_node, nodes=pools or None)
    if opts.backend == "ray":
        if pools:
            raise AirError(
                f"{opts.cluster_file}: with --backend ray the nodes come from the Ray cluster;"
                " remove the [[pools]] tables (keep [tenants] and [scheduler])"
            )
        from air_sdk.runner.backends.ray import RayBackend

        return RayBackend(address=opts.ray_address)
    raise AirError(f"unknown backend {opts.backend!r}: use 'local' or 'ray'")


def serve(opts: GatewayOptions) -> None:
    """Run the gateway in the foreground until Ctrl-C or SIGTERM."""
    import uvicorn

    app, token = build(opts)
    if opts.write_client_config:
        write_client_config(opts.url, token)
    state = {"pid": os.getpid(), "url": opts.url, "started": _procs.create_time(os.getpid())}
    state_path = opts.home / STATE_FILE
    state_path.write_text(json.dumps(state))
    print(f"AIR gateway on {opts.url} (home {opts.home}); Ctrl-C stops it", flush=True)
    if not is_loopback(opts.host) and opts.tls_cert is None:
        print(
            f"WARNING: plain HTTP on {opts.host} (--insecure-bind): tokens cross the network"
            " in clear text unless a TLS proxy fronts this gateway",
            file=sys.stderr,
            flush=True,
        )
    try:
        uvicorn.run(
            app,
            host=opts.host,
            port=opts.port,
            log_level="warning",
            access_log=False,
            server_header=False,
            ssl_certfile=str(opts.tls_cert) if opts.tls_cert else None,
            ssl_keyfile=str(opts.tls_key) if opts.tls_key else None,
        )
    finally:
        try:
            if json.loads(state_path.read_text()).get("pid") == os.getpid():
                state_path.unlink()
        except (OSError, ValueError):
            pass


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
    return _procs.alive(pid, started)


def running_gateway(home: Path) -> GatewayProcess | None:
    """The detached gateway recorded in `home`, if its process is alive."""
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
    """Start a gateway in the background and return once it answers /v1/health."""
    existing = running_gateway(opts.home)
    if existing is not None:
        raise AirError(
            f"a gateway (pid {existing.pid}) already runs at {existing.url} for {opts.home}:"
            " stop it with `air gateway stop` or use another --home"
        )
    opts.home.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    if opts.tls_cert and opts.tls_key:
        cmd += ["--tls-cert", str(opts.tls_cert), "--tls-key", str(opts.tls_key)]
    if opts.insecure_bind:
        cmd.append("--insecure-bind")
    for host in opts.allowed_hosts:
        cmd += ["--allow-host", host]
    for origin in opts.cors_origins:
        cmd += ["--cors-origin", origin]
    if opts.limits != RequestLimits():
        cmd += ["--limits-json", opts.limits.to_json()]
    if opts.cluster_file is not None:
        cmd += ["--cluster", str(Path(opts.cluster_file).resolve())]
    if opts.backend != "local":
        cmd += ["--backend", opts.backend]
    if opts.ray_address:
        cmd += ["--ray-address", opts.ray_address]
    # Refuse bad files here, with the message, rather than in a child that exits at once.
    load_cluster(opts.cluster_file)
    # Refuse here, with the message, rather than in a child that exits at once.
    check_bind(
        opts.host, tls_cert=opts.tls_cert, tls_key=opts.tls_key, insecure_bind=opts.insecure_bind
    )
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
            if _healthy(opts):
                token = (opts.home / TOKEN_FILE).read_text().strip()
                return GatewayProcess(pid=proc.pid, url=opts.url, token=token, log_path=log_path)
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AirError(f"the gateway did not answer within {timeout_s:g} s; see {log_path}")


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
    p.add_argument("--tls-cert", type=Path, default=None)
    p.add_argument("--tls-key", type=Path, default=None)
    p.add_argument("--insecure-bind", action="store_true")
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--cors-origin", action="append", default=[])
    p.add_argument("--limits-json", default=None)
    p.add_argument("--cluster", type=Path, default=None)
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--ray-address", default=None)
    a = p.parse_args(argv)
    serve(
        GatewayOptions(
            host=a.host,
            port=a.port,
            home=a.home or air_home(),
            num_nodes=a.nodes,
            slots_per_node=a.slots_per_node,
            write_client_config=not a.no_client_config,
            tls_cert=a.tls_cert,
            tls_key=a.tls_key,
            insecure_bind=a.insecure_bind,
            allowed_hosts=tuple(a.allow_host),
            cors_origins=tuple(a.cors_origin),
            limits=RequestLimits.from_json(a.limits_json) if a.limits_json else RequestLimits(),
            cluster_file=a.cluster,
            backend=a.backend,
            ray_address=a.ray_address,
        )
    )


if __name__ == "__main__":
    main()
