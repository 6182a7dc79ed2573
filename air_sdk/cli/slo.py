"""`air slo`: your tenant's service level objectives, measured now (`GET /v1/slo`).

    $ air slo
    tenant  slo         objective                                 now     budget left  burn  burned by
    acme    queue_wait  p95 queue wait under 10 min (priority h…  14 min  -60%         1.6x  train-3f2a…, …

The cluster file declares them (docs/operations.md); a system admin sees every tenant's.
"""

from __future__ import annotations

import typer
from rich.table import Table

from air_sdk.cli._common import GatewayOption, JsonOption, console, echo_json, handle_errors
from air_sdk.schema.slo import SloStatus

__all__ = ["slo", "slo_table", "value_text"]

#: burner job ids shown in the table (all of them with --json)
SHOWN_BURNERS = 3


def value_text(s: SloStatus) -> str:
    """The SLO's current value as a person reads it.

    Example:
        >>> from air_sdk.schema.slo import SloStatus
        >>> base = dict(tenant="a", name="w", kind="queue_wait", description="", target=600,
        ...             objective=0.95, window_s=86400, alert_burned=0.5)
        >>> value_text(SloStatus(**base, value=840.0)), value_text(SloStatus(**base))
        ('14.0 min', 'no data')
    """
    if s.value is None:
        return "no data"
    if s.kind == "goodput":
        return f"{s.value:.3f}"
    return f"{s.value:.1f} s" if s.value < 90 else f"{s.value / 60:.1f} min"


def slo_table(slos: list[SloStatus]) -> Table:
    """One row per SLO: what it promises, where it stands, who burned it."""
    table = Table(box=None, pad_edge=False)
    for column in ("tenant", "slo", "objective", "window", "now", "budget left", "burn"):
        table.add_column(column, no_wrap=column != "objective")
    table.add_column("burned by")
    for s in slos:
        burners = [b.job_id for b in s.burned_by]
        shown = ", ".join(burners[:SHOWN_BURNERS]) + (
            ", ..." if len(burners) > SHOWN_BURNERS else ""
        )
        left = f"{s.budget_left:.0%}"
        table.add_row(
            s.tenant,
            s.name,
            s.description,
            f"{s.window_s / 3600:g} h",
            f"{value_text(s)} ({s.num_samples})",
            f"[red]{left}[/red]" if s.burning else left,
            f"{s.burn_rate:.1f}x",
            shown or "-",
        )
    return table


@handle_errors
def slo(as_json: JsonOption = False, gateway: GatewayOption = None) -> None:
    """Your tenant's SLOs: target, current value, error budget left, the jobs that burned it."""
    from air_sdk.cli.main import make_client

    report = make_client(gateway).slo()
    if as_json:
        echo_json(report.model_dump(mode="json"))
        return
    if not report.slos:
        console.print(
            "no SLOs declared for your tenant: an operator adds [[tenants.NAME.slos]] to the"
            " cluster file (docs/operations.md)",
            soft_wrap=True,
        )
        raise typer.Exit(0)
    console.print(slo_table(report.slos))
