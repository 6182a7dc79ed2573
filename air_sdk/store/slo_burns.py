"""Which tenants' SLOs are burning now: the memory behind "one `slo` event per
crossing" (`air_sdk.runner.slo_watch`). Kept in the database, not the gateway's
memory, so a gateway that restarts does not write the burn event again for an SLO
that was already burning, and still writes the recovery of one that burned before it
restarted. The change is decided inside one write transaction, so two threads (or two
gateways on one database) that measure the same crossing write one event between them.

Example:
    >>> from air_sdk.store.database import Database
    >>> burns = SloBurnStore(Database(":memory:"))
    >>> burns.mark_slo("acme", "wait", burning=True, now=10.0)  # it crossed: an event
    True
    >>> burns.mark_slo("acme", "wait", burning=True, now=20.0)  # still burning: none
    False
    >>> burns.burning_slos()
    {('acme', 'wait'): 10.0}
    >>> burns.mark_slo("acme", "wait", burning=False, now=30.0)  # recovered: an event
    True
"""

from __future__ import annotations

from air_sdk.store.database import Database

__all__ = ["SloBurnStore"]


class SloBurnStore:
    """The (tenant, SLO) pairs burning now, with when each started to."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def mark_slo(self, tenant: str, slo: str, *, burning: bool, now: float) -> bool:
        """Record whether `tenant`'s SLO `slo` is burning; True when that changed (it
        crossed its threshold, or recovered below it), False when it was so already."""
        with self._db.tx() as c:
            if burning:
                cur = c.execute(
                    "INSERT INTO slo_burning VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (tenant, slo, now),
                )
            else:
                cur = c.execute(
                    "DELETE FROM slo_burning WHERE tenant = ? AND slo = ?", (tenant, slo)
                )
            return cur.rowcount > 0

    def burning_slos(self) -> dict[tuple[str, str], float]:
        """{(tenant, SLO name): since when it burns}."""
        rows = self._db.read("SELECT tenant, slo, since FROM slo_burning")
        return {(r["tenant"], r["slo"]): r["since"] for r in rows}
