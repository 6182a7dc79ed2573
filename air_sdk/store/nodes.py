"""Node health: failures blamed on each node. The runner leaves a node that failed
too often out of placements for a while (`air_sdk.runner.policy.NodeHealthPolicy`);
a job that succeeds on a node, or an admin, clears its count.

Example:
    >>> from air_sdk.store.database import Database
    >>> nodes = NodeHealthStore(Database(":memory:"))
    >>> nodes.record_node_failure("n3"); nodes.record_node_failure("n3")
    >>> nodes.node_failures()["n3"][0]
    2
    >>> nodes.clear_node_failures("n3"); nodes.node_failures()
    {}
"""

from __future__ import annotations

import time

from air_sdk.store.database import Database

__all__ = ["NodeHealthStore"]


class NodeHealthStore:
    """Failure counts per node, with the time of the last one."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record_node_failure(self, node: str) -> None:
        with self._db.tx() as c:
            c.execute(
                "INSERT INTO node_failures VALUES (?, 1, ?) ON CONFLICT (node) DO UPDATE SET"
                " count = count + 1, last_ts = excluded.last_ts",
                (node, time.time()),
            )

    def node_failures(self) -> dict[str, tuple[int, float]]:
        """node -> (failures, time of the last one)."""
        rows = self._db.read("SELECT node, count, last_ts FROM node_failures")
        return {r["node"]: (r["count"], r["last_ts"]) for r in rows}

    def clear_node_failures(self, node: str) -> None:
        with self._db.tx() as c:
            c.execute("DELETE FROM node_failures WHERE node = ?", (node,))
