"""`air admin tenant|token|node ...`: manage who may use a gateway (needs an admin token).

    air admin tenant create acme                      # system admin only
    air admin token create --tenant acme --role member --name ci
    air admin token list --tenant acme
    air admin token revoke 3f2a...                     # the id from `token list`
    air admin node clear node-1                        # put a failing node back to work

The commands talk to the gateway over HTTP like every other command, with the
token of `--token`, `AIR_TOKEN` or the client config.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from air_sdk.cli._common import (
    GatewayOption,
    JsonOption,
    console,
    echo_json,
    err_console,
    handle_errors,
)
from air_sdk.schema.admin import ROLES

if TYPE_CHECKING:
    from air_sdk.client.admin import Admin

__all__ = ["admin_app"]

admin_app = typer.Typer(
    help="Tenants, API tokens and node health (needs an admin token).", no_args_is_help=True
)
tenant_app = typer.Typer(help="Create and list tenants.", no_args_is_help=True)
token_app = typer.Typer(help="Issue, list and revoke API tokens.", no_args_is_help=True)
node_app = typer.Typer(help="Nodes' failure records (system admin).", no_args_is_help=True)
admin_app.add_typer(tenant_app, name="tenant")
admin_app.add_typer(token_app, name="token")
admin_app.add_typer(node_app, name="node")

TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        metavar="TOKEN",
        envvar="AIR_TOKEN",
        help="Admin token (default: $AIR_TOKEN or the client config).",
        show_default=False,
    ),
]


def _admin(gateway: str | None, token: str | None) -> Admin:
    from air_sdk.cli.main import make_client

    return make_client(gateway, token).admin


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


# ---- tenants ----------------------------------------------------------------------------


@tenant_app.command("create")
@handle_errors
def tenant_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="1-63 of [a-z0-9_-].")],
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Create a tenant (system admin only), then issue its first token with `token create`."""
    info = _admin(gateway, token).create_tenant(name)
    console.print(
        f"created tenant {info.id}; give it an admin with:\n"
        f"  air admin token create --tenant {info.id} --role admin --name <who>",
        soft_wrap=True,
    )


@tenant_app.command("list")
@handle_errors
def tenant_list(
    as_json: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None
) -> None:
    """Tenants you manage (all of them for an admin of the system tenant `default`)."""
    tenants = _admin(gateway, token).tenants()
    if as_json:
        echo_json([t.model_dump(mode="json") for t in tenants])
        return
    from rich.table import Table

    table = Table("TENANT", "CREATED", "CRASHES (1 H)", "RESTART CAP (1 H)")
    for t in tenants:
        cap = "-" if t.max_restarts_per_hour is None else str(t.max_restarts_per_hour)
        table.add_row(t.id, _when(t.created_at), str(t.crashes_last_hour), cap)
    console.print(table)


# ---- tokens -----------------------------------------------------------------------------


@token_app.command("create")
@handle_errors
def token_create(
    tenant: Annotated[
        str | None, typer.Option(help="Tenant of the token (default: your own).")
    ] = None,
    role: Annotated[
        str,
        typer.Option(
            help="viewer (read only), member (submit, cancel), admin, or metrics (reads"
            " /metrics only; the system admin issues it)."
        ),
    ] = "member",
    name: Annotated[str, typer.Option(help="A label: who or what uses it.")] = "",
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Issue a token and print it once: the gateway keeps only its sha256 digest."""
    if role not in ROLES:
        roles = f"{', '.join(ROLES[:-1])} or {ROLES[-1]}"
        raise typer.BadParameter(f"{role!r}: use {roles}", param_hint="'--role'")
    created = _admin(gateway, token).create_token(
        tenant=tenant,
        role=role,  # type: ignore[arg-type]  # checked just above
        name=name,
    )
    if as_json:
        echo_json(created.model_dump(mode="json"))
        return
    # The token alone on stdout, so `$(air admin token create ...)` captures just it.
    typer.echo(created.token)
    err_console.print(
        f"token {created.info.id}: {created.info.role} of tenant {created.info.tenant}"
        f"{f' ({created.info.name})' if created.info.name else ''}. It is shown only now:"
        " store it (e.g. AIR_TOKEN) and revoke it with"
        f" `air admin token revoke {created.info.id}`",
        soft_wrap=True,
    )


@token_app.command("list")
@handle_errors
def token_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Revoked ones too.")] = False,
    as_json: JsonOption = False,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Tokens of the tenants you manage: id, tenant, role, name (never the token itself)."""
    tokens = _admin(gateway, token).tokens(tenant, include_revoked=show_all)
    if as_json:
        echo_json([t.model_dump(mode="json") for t in tokens])
        return
    from rich.table import Table

    table = Table("ID", "TENANT", "ROLE", "NAME", "CREATED", "REVOKED")
    for t in tokens:
        table.add_row(t.id, t.tenant, t.role, t.name, _when(t.created_at), _when(t.revoked_at))
    console.print(table)


@token_app.command("revoke")
@handle_errors
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID", help="From `token list`.")],
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Revoke a token at once: its next request gets a 401."""
    info = _admin(gateway, token).revoke_token(token_id)
    console.print(f"revoked token {info.id} ({info.role} of tenant {info.tenant})")


# ---- nodes ------------------------------------------------------------------------------


@node_app.command("list")
@handle_errors
def node_list(
    as_json: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None
) -> None:
    """Nodes, their failure counts and whether the scheduler uses them."""
    nodes = _admin(gateway, token).nodes()
    if as_json:
        echo_json([n.model_dump(mode="json") for n in nodes])
        return
    from rich.table import Table

    table = Table("NODE", "HEALTHY", "FAILURES", "LAST FAILURE", "PROBE", "PROBED")
    for n in nodes:
        probe = "-" if n.probe is None else ("ok" if n.probe.ok else f"failed: {n.probe.detail}")
        table.add_row(
            n.name,
            "yes" if n.healthy else "no",
            str(n.num_failures),
            _when(n.last_failure_at),
            probe,
            _when(n.probe.at if n.probe else None),
        )
    console.print(table)


@node_app.command("clear")
@handle_errors
def node_clear(
    name: Annotated[str, typer.Argument(metavar="NODE", help="From `node list`.")],
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Forget a node's failures (e.g. after fixing it): jobs are placed on it again."""
    node = _admin(gateway, token).clear_node(name)
    console.print(f"cleared node {node.name}: {'healthy' if node.healthy else 'still unhealthy'}")
