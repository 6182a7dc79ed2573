"""Running a gateway: `build` the app, `serve` it in the foreground, or start it
detached (`python -m air_sdk.gateway.server` reads its `GatewayOptions` as JSON from
`$AIR_GATEWAY_OPTIONS`).

The embedded default is a gateway + local runner over SQLite in `AIR_HOME`.
On its first start it creates an admin token and writes the client config, so
`air submit` works with nothing typed. The options are declared in
`air_sdk.gateway_config`; finding, starting and stopping a detached gateway is
`air_sdk.client.local_gateway` (re-exported here, with `start_detached` checking
the options first).

Example:
    >>> proc = start_detached(GatewayOptions(port=8471, home=Path("/tmp/air")))  # doctest: +SKIP
    >>> stop_detached(Path("/tmp/air"))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from air_sdk.client import local_gateway
from air_sdk.client.local_gateway import GatewayProcess, running_gateway, stop_detached
from air_sdk.client.ports import bind_or_explain, choose_port
from air_sdk.config import write_client_config
from air_sdk.errors import AirError, ConfigError
from air_sdk.gateway.connections import ConnectionGuard, guarded_protocol, raise_fd_limit
from air_sdk.gateway.options import SecurityOptions, check_bind, is_loopback
from air_sdk.gateway_config import OPTIONS_ENV, STATE_FILE, TOKEN_FILE, GatewayOptions
from air_sdk.procs import create_time
from air_sdk.store.quota import JobQuotas

if TYPE_CHECKING:
    from fastapi import FastAPI

    from air_sdk.runner import RetentionPolicy
    from air_sdk.runner.backends.base import Backend
    from air_sdk.scheduler import ClusterConfig, NodeSpec
    from air_sdk.schema import JobLimits
    from air_sdk.store import SqliteStore

log = logging.getLogger(__name__)

__all__ = [
    "GatewayOptions",
    "GatewayProcess",
    "build",
    "main",
    "oversubscription_warning",
    "preflight",
    "running_gateway",
    "security_options",
    "serve",
    "start_detached",
    "stop_detached",
]


def security_options(opts: GatewayOptions) -> SecurityOptions:
    """What the security middlewares enforce for `opts` (its own host is served too).

    Example:
        >>> security_options(GatewayOptions(host="gpu-box.lan")).all_hosts()[-1]
        'gpu-box.lan'
    """
    return SecurityOptions(
        allowed_hosts=(*opts.allowed_hosts, opts.host),
        cors_origins=opts.cors_origins,
        limits=opts.limits,
    )


def preflight(opts: GatewayOptions) -> None:
    """Refuse, with the message, what would make a gateway exit at once: a bind that
    would send tokens in clear text, a cluster file that does not load, a cap on jobs'
    limits that is no size."""
    check_bind(
        opts.host, tls_cert=opts.tls_cert, tls_key=opts.tls_key, insecure_bind=opts.insecure_bind
    )
    load_cluster(opts.cluster_file)
    limit_caps(opts)
    node_probe_argv(opts)


def node_probe_argv(opts: GatewayOptions) -> list[str] | None:
    """The node probe's argv from `--node-probe`, or None; refused, saying why, where it
    cannot run.

    Example:
        >>> node_probe_argv(GatewayOptions(node_probe="/bin/check --fast"))
        ['/bin/check', '--fast']
    """
    if opts.node_probe is None:
        return None
    if opts.backend != "local":
        raise ConfigError(
            "--node-probe runs on the local backend's nodes only: drop it with --backend"
            f" {opts.backend} (Ray marks nodes that leave the cluster itself)"
        )
    from air_sdk.runner.node_probe import probe_argv

    try:
        return probe_argv(opts.node_probe)
    except ValueError as exc:  # an empty command, or unbalanced quotes
        raise ConfigError(f"--node-probe {opts.node_probe!r}: {exc}") from exc


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
    quotas = JobQuotas(  # 0: no quota
        max_log_bytes=opts.max_log_bytes_per_job or None,
        max_metric_bytes=opts.max_metric_bytes_per_job or None,
    )
    store = SqliteStore(opts.home / "air.db", quotas=quotas)
    token = _ensure_token(store, opts.home)
    cluster = load_cluster(opts.cluster_file)
    backend = make_backend(opts, cluster)
    probe = node_probe_argv(opts)
    runner = Runner(
        store,
        backend,
        opts.home,
        opts.worker_url,
        policy=cluster.policy if cluster is not None else None,
        retention=retention_policy(opts),
        max_preemption_grace_s=opts.max_preemption_grace_s,
        limit_caps=limit_caps(opts),
        node_probe=probe,
        node_probe_interval_s=opts.node_probe_interval_s,
    )
    refusal = tenant_refusal(opts, backend)
    if refusal is not None and len(store.list_tenants()) > 1:
        store.close()
        raise ConfigError(f"this gateway's home has more than one tenant, but {refusal}")
    from air_sdk.export.service import ExportService

    exports = ExportService(store, opts.home / "exports", allowed_uris=opts.export_uris)
    ctx = GatewayContext(
        store=store,
        runner=runner,
        home=opts.home,
        tenant_refusal=refusal,
        exports=exports,
        metrics_from_loopback=opts.metrics_without_token,
    )
    app = create_app(ctx, security=security_options(opts))
    return app, token


def limit_caps(opts: GatewayOptions) -> JobLimits:
    """The operator's caps on every job's limits (`--max-job-memory` ...); a
    `ConfigError` naming the flag for a value that is no size.

    Example:
        >>> limit_caps(GatewayOptions(max_job_memory="16GiB")).memory
        17179869184
    """
    from pydantic import ValidationError

    from air_sdk.schema import JobLimits

    try:
        return JobLimits(
            memory=opts.max_job_memory, processes=opts.max_job_processes, disk=opts.max_job_disk
        )
    except ValidationError as exc:
        problem = exc.errors()[0]
        flag = {"memory": "--max-job-memory", "processes": "--max-job-processes"}.get(
            str(problem["loc"][0]), "--max-job-disk"
        )
        raise ConfigError(f"{flag}: {problem['msg'].removeprefix('Value error, ')}") from exc


def sandbox_line(backend: Backend) -> str | None:
    """What `serve` says about the local backend's sandbox at start-up."""
    sandbox = getattr(backend, "sandbox", None)
    return None if sandbox is None else str(sandbox.describe())


def tenant_refusal(opts: GatewayOptions, backend: Backend) -> str | None:
    """Why this gateway may serve only its default tenant, or None: the local backend
    without a sandbox lets any job read every tenant's secrets (docs/security.md).

    Example:
        >>> from air_sdk.runner import LocalBackend
        >>> tenant_refusal(GatewayOptions(), LocalBackend(1, 1, sandbox="off"))[:40]
        'its ranks run unsandboxed (--sandbox off'
    """
    sandbox = getattr(backend, "sandbox", None)
    if sandbox is None or sandbox.enabled or opts.allow_unsandboxed_tenants:
        return None
    return (
        f"its ranks run unsandboxed ({sandbox.reason}), so any job could read every"
        " tenant's secrets and the admin token: install bubblewrap (apt-get install"
        " bubblewrap) or run with --sandbox auto, or start with --allow-unsandboxed-tenants"
        " if every tenant may see the others' secrets"
    )


def retention_policy(opts: GatewayOptions) -> RetentionPolicy:
    """When ended jobs' files go, from `--job-files-max-age-days` and `--job-files-max-gib`.

    Example:
        >>> retention_policy(GatewayOptions(job_files_max_gib=1.5)).max_bytes
        1610612736
    """
    from air_sdk.runner import RetentionPolicy

    days, gib = opts.job_files_max_age_days, opts.job_files_max_gib
    return RetentionPolicy(
        max_age_s=None if days is None else days * 86400,
        max_bytes=None if gib is None else int(gib * (1 << 30)),
        include_checkpoints=opts.job_files_include_checkpoints,
    )


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


def local_nodes(opts: GatewayOptions) -> list[NodeSpec]:
    """This machine's virtual nodes as `opts` size them."""
    from air_sdk.runner.devices import local_virtual_nodes

    return local_virtual_nodes(
        opts.num_nodes, opts.slots_per_node, oversubscribe=opts.oversubscribe
    )


def oversubscription_warning(opts: GatewayOptions) -> str | None:
    """What a gateway warns about at start when `opts` let this machine's virtual nodes
    run more ranks than it has cores (`--oversubscribe`, or a `--slots-per-node` above
    them); None otherwise (or with a cluster file, or Ray).

    Example:
        >>> oversubscription_warning(GatewayOptions(num_nodes=1))  # all cores, one node
    """
    if opts.backend != "local" or opts.cluster_file is not None:
        return None
    from air_sdk.runner.machine import oversubscription

    return oversubscription(local_nodes(opts), cores=os.cpu_count() or 1)


def make_backend(opts: GatewayOptions, cluster: ClusterConfig | None = None) -> Backend:
    """The backend `opts` names. The local backend runs the cluster file's pools as
    virtual nodes of this machine when it has any; on Ray the inventory is the Ray
    cluster's nodes."""
    pools = cluster.inventory if cluster is not None else []
    if opts.backend == "local":
        from air_sdk.runner import LocalBackend

        warning = None if pools else oversubscription_warning(opts)
        if warning is not None:
            log.warning("%s", warning)
        return LocalBackend(
            opts.num_nodes,
            opts.slots_per_node,
            nodes=pools or local_nodes(opts),
            sandbox=opts.sandbox,
            home=opts.home,
            hidden_files=[opts.tls_key] if opts.tls_key else None,
            shared_dirs=list(opts.sandbox_binds),
            allowed_data_roots=list(opts.allowed_data_roots),
            shared_data_roots=list(opts.shared_data_roots),
            tenant_data_roots=cluster.data_roots if cluster is not None else None,
        )
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
    """Run the gateway in the foreground until Ctrl-C or SIGTERM.

    The port is bound first: a taken one is a `ConfigError` naming its holder (or,
    when no port was asked for, the next free one is used and that is said), and
    neither the client config nor the pid file is written for a gateway that could
    not listen.
    """
    import uvicorn

    raise_fd_limit()  # the default soft limit (1,024) is what a connection flood exhausts
    choice = choose_port(opts)
    opts = choice.opts
    sock = bind_or_explain(opts)
    try:
        app, token = build(opts)
    except BaseException:
        sock.close()
        raise
    if choice.note:
        print(choice.note, flush=True)
    if opts.write_client_config:
        write_client_config(opts.url, token)
    state = {"pid": os.getpid(), "url": opts.url, "started": create_time(os.getpid())}
    state_path = opts.home / STATE_FILE
    state_path.write_text(json.dumps(state))
    print(f"AIR gateway on {opts.url} (home {opts.home}); Ctrl-C stops it", flush=True)
    line = sandbox_line(app.state.air.runner.backend)
    if line:
        print(line, flush=True)
    if not is_loopback(opts.host) and opts.tls_cert is None:
        print(
            f"WARNING: plain HTTP on {opts.host} (--insecure-bind): tokens cross the network"
            " in clear text unless a TLS proxy fronts this gateway",
            file=sys.stderr,
            flush=True,
        )
    config = uvicorn.Config(app, **uvicorn_options(opts))
    try:
        uvicorn.Server(config).run(sockets=[sock])  # the socket bound above, not a new one
    finally:
        sock.close()
        try:
            if json.loads(state_path.read_text()).get("pid") == os.getpid():
                state_path.unlink()
        except (OSError, ValueError):
            pass


def uvicorn_options(opts: GatewayOptions) -> dict[str, Any]:
    """What `serve` hands to uvicorn.Config (each call: a fresh connection guard).

    uvicorn believes X-Forwarded-For from 127.0.0.1 by default (`proxy_headers=True`,
    `forwarded_allow_ips="127.0.0.1"`, or $FORWARDED_ALLOW_IPS): any local process
    could then claim any client address, a fresh one per request, and never meet its
    rate limit. Forwarded headers are read only from `opts.trusted_proxies`.

    Example:
        >>> uvicorn_options(GatewayOptions(home=Path("/tmp/h")))["proxy_headers"]
        False
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return {
        "host": opts.host,
        "port": opts.port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "proxy_headers": bool(opts.trusted_proxies),
        # Passed even when off: uvicorn's own default would read $FORWARDED_ALLOW_IPS.
        "forwarded_allow_ips": list(opts.trusted_proxies) or ["127.0.0.1"],
        "ssl_certfile": str(opts.tls_cert) if opts.tls_cert else None,
        "ssl_keyfile": str(opts.tls_key) if opts.tls_key else None,
        # Slowloris: a header-read timeout and a per-address cap (gateway/connections.py).
        "http": guarded_protocol(
            AutoHTTPProtocol,
            ConnectionGuard(opts.max_connections_per_address),
            opts.header_timeout_s,
        ),
    }


def start_detached(opts: GatewayOptions, timeout_s: float = 60) -> GatewayProcess:
    """Check `opts` here (so a bad one fails with its message, not in a child that exits
    at once), then start a detached gateway (`air_sdk.client.local_gateway`)."""
    preflight(opts)
    return local_gateway.start_detached(opts, timeout_s)


def main() -> None:
    """`python -m air_sdk.gateway.server`: serve the options in `$AIR_GATEWAY_OPTIONS`
    (JSON, as a detached start writes them), else those of `AIR_GATEWAY_*` env vars."""
    raw = os.environ.pop(OPTIONS_ENV, None)  # the ranks this gateway starts need not see it
    try:
        opts = GatewayOptions.model_validate_json(raw) if raw else GatewayOptions()
    except ValueError as exc:
        print(f"error: bad gateway options: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        serve(opts)
    except ConfigError as exc:  # e.g. the port was taken between the check and the bind
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
