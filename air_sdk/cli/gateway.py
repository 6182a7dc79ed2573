"""`air gateway start|stop|status`: the embedded gateway on this machine.

The server code (`air_sdk.gateway.server`) is imported inside each command, so
`air --help` stays fast and nothing else in the CLI pulls in FastAPI or torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from air_sdk.cli._common import EXIT_FAILED, GatewayOption, console, handle_errors
from air_sdk.config import DEFAULT_PORT, air_home

__all__ = ["gateway_app"]

gateway_app = typer.Typer(
    help="Run the embedded gateway (scheduler + resilient runner) on this machine.",
    no_args_is_help=True,
)

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        metavar="DIR",
        help="Where the gateway keeps its database, bundles and jobs (default: $AIR_HOME).",
        show_default=False,
    ),
]


@gateway_app.command()
@handle_errors
def start(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(
            help="Address to bind. Anything but loopback needs --tls-cert/--tls-key"
            " or --insecure-bind."
        ),
    ] = "127.0.0.1",
    nodes: Annotated[
        int, typer.Option(min=1, help="Virtual nodes to split this machine into.")
    ] = 2,
    slots_per_node: Annotated[
        int | None,
        typer.Option(min=1, help="Rank slots per node (default: cores or GPUs divided evenly)."),
    ] = None,
    home: HomeOption = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background and return.")
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="PEM certificate: serve HTTPS."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="PEM private key of it.")
    ] = None,
    insecure_bind: Annotated[
        bool,
        typer.Option(
            "--insecure-bind",
            help="Serve plain HTTP on a non-loopback --host (only behind a TLS proxy).",
        ),
    ] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME",
            help="Host header name to serve besides loopback and --host (repeat).",
        ),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            metavar="ORIGIN",
            help="Browser origin allowed to call the API (repeat); none by default.",
        ),
    ] = None,
    trust_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trust-proxy",
            metavar="ADDR",
            help="Address of a reverse proxy whose X-Forwarded-For is believed (repeat);"
            " none by default.",
        ),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            metavar="FILE",
            help="Cluster TOML: pools, tenant quotas and weights, scheduler switches"
            " (docs/scheduling.md).",
        ),
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            help="Where jobs run: 'local' (this machine) or 'ray' (a Ray cluster,"
            " docs/scaling-out.md)."
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            help="Ray cluster to join with --backend ray (default: $RAY_ADDRESS).",
        ),
    ] = None,
) -> None:
    """Start a gateway; it writes the client config, so `air submit` works right away."""
    from air_sdk.gateway.server import GatewayOptions, serve, start_detached

    opts = GatewayOptions(
        host=host,
        port=port,
        home=home or air_home(),
        num_nodes=nodes,
        slots_per_node=slots_per_node,
        tls_cert=tls_cert,
        tls_key=tls_key,
        insecure_bind=insecure_bind,
        allowed_hosts=tuple(allow_host or ()),
        cors_origins=tuple(cors_origin or ()),
        trusted_proxies=tuple(trust_proxy or ()),
        cluster_file=cluster,
        backend=backend,
        ray_address=ray_address,
    )
    if not detach:
        try:
            serve(opts)
        except KeyboardInterrupt:
            pass
        return
    with console.status(f"starting a gateway on {opts.url} ..."):
        proc = start_detached(opts)
    console.print(
        f"gateway running at [bold]{proc.url}[/] (pid {proc.pid}, {nodes} nodes)\n"
        f"  log:  {proc.log_path}\n  stop: air gateway stop"
        + (f" --home {opts.home}" if home else ""),
        soft_wrap=True,
    )


@gateway_app.command()
@handle_errors
def stop(home: HomeOption = None) -> None:
    """Stop the background gateway started with `air gateway start --detach`."""
    from air_sdk.gateway.server import running_gateway, stop_detached

    root = home or air_home()
    proc = running_gateway(root)
    if not stop_detached(root):
        console.print(f"no gateway is running from {root}")
        return
    console.print(f"stopped the gateway{f' (pid {proc.pid})' if proc else ''}")


@gateway_app.command()
@handle_errors
def status(home: HomeOption = None, gateway: GatewayOption = None) -> None:
    """Is a gateway up? Its URL, version and nodes."""
    from rich.markup import escape

    from air_sdk.cli.main import make_client
    from air_sdk.errors import AirError, TransportError
    from air_sdk.gateway.server import running_gateway

    proc = None if gateway else running_gateway(home or air_home())
    # One try: "is it up?" should answer at once, not after a round of retries.
    if proc is not None:
        client = make_client(proc.url, proc.token or None, max_attempts=1)
    else:
        client = make_client(gateway, max_attempts=1)
    try:
        health = client.health()
    except TransportError:
        where = f" (pid {proc.pid} from {home or air_home()} is not answering)" if proc else ""
        console.print(
            f"[red]no gateway at {client.gateway_url}{where}[/]; start one with"
            " `air gateway start --detach`",
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_FAILED) from None
    except AirError as exc:
        console.print(f"[red]the gateway at {client.gateway_url}: {escape(str(exc))}[/]")
        raise typer.Exit(EXIT_FAILED) from None
    started = f", pid {proc.pid}, log {proc.log_path}" if proc else ""
    console.print(
        f"gateway [bold]{client.gateway_url}[/] is up (version {health.version}{started})",
        soft_wrap=True,
    )
    try:
        inventory = client.inventory()
    except AirError as exc:
        console.print(f"[yellow]cannot list nodes: {escape(str(exc))}[/]", soft_wrap=True)
        return
    for node in inventory.nodes:
        gpus = f", {len(node.gpus)} GPUs" if node.gpus else ""
        health_note = "" if node.healthy else " [red](unhealthy)[/]"
        jobs = f"  jobs: {', '.join(node.jobs)}" if node.jobs else ""
        console.print(
            f"  {node.name}: {node.used_slots}/{node.slots} slots{gpus}{health_note}{jobs}",
            soft_wrap=True,
        )
