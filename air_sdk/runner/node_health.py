"""The runner's memory of evidence against nodes (`NodeEvidence`), for
`NodeHealthPolicy` to judge: who failed where, and when.

Kept in memory (a restarted gateway starts with every node healthy; the store still
counts failures per node for `air admin node list`). Evidence older than the longest
cooldown is dropped as new evidence comes.

Example:
    >>> from air_sdk.runner.policy import NodeEvidence
    >>> book = NodeHealthBook()
    >>> book.add(NodeEvidence("n1", "crash", "a", "j1", 1.0))
    >>> book.ran_fine("n1"); book.evidence()
    []
"""

from __future__ import annotations

import threading

from air_sdk.runner.policy import NodeEvidence

__all__ = ["NodeHealthBook"]

#: evidence kept, at most (oldest dropped first): bounded whatever jobs do
MAX_EVIDENCE = 10_000


class NodeHealthBook:
    """Thread-safe list of `NodeEvidence` (controllers add, the scheduler reads)."""

    def __init__(self, keep_s: float = 3600.0) -> None:
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._evidence: list[NodeEvidence] = []

    def add(self, evidence: NodeEvidence) -> None:
        with self._lock:
            cutoff = evidence.ts - self.keep_s
            kept = [e for e in self._evidence if e.ts >= cutoff]
            kept.append(evidence)
            self._evidence = kept[-MAX_EVIDENCE:]

    def evidence(self) -> list[NodeEvidence]:
        with self._lock:
            return list(self._evidence)

    def ran_fine(self, node: str) -> None:
        """A job ran to the end on `node`: its crashes are forgiven (device errors and
        probe failures stay until they age out or an admin clears the node)."""
        with self._lock:
            self._evidence = [e for e in self._evidence if e.node != node or e.kind != "crash"]

    def probe_passed(self, node: str) -> None:
        """The operator's probe found `node` fine: its crashes and earlier probe failures
        are forgotten (device errors stay until they age out or an admin clears it)."""
        with self._lock:
            self._evidence = [
                e for e in self._evidence if e.node != node or e.kind not in ("crash", "probe")
            ]

    def clear(self, node: str) -> None:
        """An admin vouches for `node`: forget everything against it."""
        with self._lock:
            self._evidence = [e for e in self._evidence if e.node != node]
