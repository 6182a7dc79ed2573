"""`air slo`: your tenant's service level objectives, measured now (`GET /v1/slo`).

    $ air slo
    acme/fast-start: p95 queue wait under 10 min (priority high), over 24 h
      now 14.0 min (40 samples); error budget left -60%, burn rate 1.6x: BURNING
      burned by train-3f2a9c1d, train-77b0e412

The cluster file declares them (docs/operations.md); a system admin sees every tenant's.
"""

from __future__ import annotations

import typer

from air_sdk.cli._common import GatewayOption, JsonOption, console, echo_json, handle_errors
from air_sdk.schema.slo import SloStatus

__all__ = ["slo", "slo_text", "value_text"]

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


def slo_text(s: SloStatus) -> str:
    """One SLO in three lines: what it promises, where it stands, who burned it.

    Example:
        >>> from air_sdk.schema.slo import SloBurner, SloStatus
        >>> print(slo_text(SloStatus(tenant="acme", name="fast-start", kind="queue_wait",
        ...     description="p95 queue wait under 10 min", target=600, objective=0.95,
        ...     window_s=86400, value=840.0, num_samples=40, budget_left=-0.6, burn_rate=1.6,
        ...     alert_burned=0.5, burning=True,
        ...     burned_by=[SloBurner(job_id="train-3f2a9c1d", burned=1.0)])))
        acme/fast-start: p95 queue wait under 10 min, over 24 h
          now 14.0 min (40 samples); error budget left -60%, burn rate 1.6x: BURNING
          burned by train-3f2a9c1d
    """
    burners = [b.job_id for b in s.burned_by]
    shown = ", ".join(burners[:SHOWN_BURNERS]) + (", ..." if len(burners) > SHOWN_BURNERS else "")
    state = ": BURNING" if s.burning else ""
    lines = [
        f"{s.tenant}/{s.name}: {s.description}, over {s.window_s / 3600:g} h",
        f"  now {value_text(s)} ({s.num_samples} samples); error budget left"
        f" {s.budget_left:.0%}, burn rate {s.burn_rate:.1f}x{state}",
    ]
    if shown:
        lines.append(f"  burned by {shown}")
    return "\n".join(lines)


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
    for status in report.slos:
        console.print(slo_text(status), soft_wrap=True, highlight=False)
