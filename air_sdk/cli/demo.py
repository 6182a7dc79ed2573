"""`air demo`: a 2-node DDP job end to end, on the user's gateway (or a fresh one of its own).

The job is the packaged `air_sdk/examples/ddp_demo.py`, bundled alone from a
temporary directory so nothing of the caller's working directory is uploaded.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from air_sdk.cli._common import EXIT_INTERRUPTED, console, err_console
from air_sdk.config import DEFAULT_PORT
from air_sdk.errors import AuthError, SpecError, TransportError
from air_sdk.text import plural

if TYPE_CHECKING:
    from air_sdk.client import Client

__all__ = ["DEMO_SCRIPT", "demo_source", "run_demo"]

DEMO_SCRIPT = "ddp_demo.py"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

ClientFactory = Callable[..., "Client"]


def demo_source() -> bytes:
    """The packaged demo training script.

    Example:
        >>> b"air.init()" in demo_source()
        True
    """
    return resources.files("air_sdk").joinpath("examples", DEMO_SCRIPT).read_bytes()


def run_demo(make_client: ClientFactory, *, gateway: str | None, nodes: int, steps: int) -> int:
    """Submit the demo, show it live, print a summary; the command's exit code.

    Example:
        >>> run_demo(make_client, gateway=None, nodes=2, steps=200)  # doctest: +SKIP
        0
    """
    from air_sdk.cli.terminal_views import follow_to_end

    client, started_home = _connect(make_client, gateway, nodes)
    job = None
    try:
        _check_capacity(client, nodes, started=started_home is not None)
        with tempfile.TemporaryDirectory(prefix="air-demo-") as tmp:
            script = Path(tmp) / DEMO_SCRIPT
            script.write_bytes(demo_source())
            job = client.submit_script(
                script,
                workdir=tmp,
                args=["--steps", str(steps)],
                nodes=nodes,
                procs_per_node=1,
                name="demo",
            )
        console.print(
            f"submitted [bold]{job.id}[/]: {plural(nodes, 'node')} x 1 process,"
            f" {plural(steps, 'step')}"
            f" on {client.gateway_url}",
            soft_wrap=True,
        )
        return follow_to_end(job, console)
    except KeyboardInterrupt:
        if job is not None:
            err_console.print(f"\ninterrupted: cancelling {job.id}", soft_wrap=True)
            job.cancel()
        return EXIT_INTERRUPTED
    finally:
        client.close()  # an open keep-alive connection would hold up the gateway's shutdown
        if started_home is not None:
            from air_sdk.gateway.server import stop_detached

            stop_detached(started_home)
            console.print("stopped the gateway the demo started", style="dim")


def _connect(
    make_client: ClientFactory, gateway: str | None, nodes: int
) -> tuple[Client, Path | None]:
    """A client for a gateway that answers and accepts this client's token, starting a
    local one when none does.

    A gateway that answers but refuses the token (another user's, on the default port
    of a shared machine) is not this user's: unless `--gateway` named it, the demo
    starts its own on the next free port. Returns the client and the home of a gateway
    started here (to stop at the end).
    """
    probe = make_client(gateway, max_attempts=1)
    url = urlsplit(probe.gateway_url)
    ours_to_start = gateway is None and url.hostname in _LOOPBACK
    try:
        probe.inventory()  # authenticated: a gateway that refuses the token is not ours
        return make_client(gateway), None
    except TransportError:
        if not ours_to_start:
            raise
        why = f"no gateway at {probe.gateway_url}"
    except AuthError:
        if not ours_to_start:
            raise
        why = f"the gateway at {probe.gateway_url} is not yours (it refused this client's token)"
    finally:
        probe.close()
    from air_sdk.client.ports import port_is_free
    from air_sdk.gateway.server import GatewayOptions, start_detached

    # The demo's own gateway leaves the client config alone: it is gone afterwards. It
    # takes the configured port when that is free, else the next free one.
    port = url.port or DEFAULT_PORT
    fields: dict[str, Any] = {"port": port} if port_is_free("127.0.0.1", port) else {}
    opts = GatewayOptions(num_nodes=max(2, nodes), write_client_config=False, **fields)
    with console.status(f"{why}; starting one with {plural(opts.num_nodes, 'node')}"):
        proc = start_detached(opts)
    console.print(f"{why}: started a gateway at {proc.url} (log: {proc.log_path})", soft_wrap=True)
    return make_client(proc.url, proc.token), opts.home


def _check_capacity(client: Client, nodes: int, *, started: bool) -> None:
    num_nodes = len(client.inventory().nodes)
    if num_nodes < nodes and not started:
        raise SpecError(
            f"the gateway at {client.gateway_url} has {plural(num_nodes, 'node')}; the demo asked for"
            f" {nodes}: run `air demo --nodes {num_nodes}`, or restart the gateway with"
            f" `air gateway start --nodes {nodes}`"
        )
