"""Policies decide, controllers act: what to do after an attempt fails, and who is to blame."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from air_sdk.runner.backends.base import NodeStatus
from air_sdk.schema import FailureInfo, RankExit


class FailureAction(str, Enum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class FailureDecision:
    action: FailureAction
    reason: str
    delay_s: float = 0.0


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a failed attempt while the job's restart budget lasts.

    Example:
        >>> f = FailureInfo(attempt=1, reason="rank 1 exit code 3")
        >>> RestartPolicy(max_restarts=1).make_decision(f, num_restarts=0).action
        <FailureAction.RESTART: 'restart'>
        >>> RestartPolicy(max_restarts=1).make_decision(f, num_restarts=1).action
        <FailureAction.FAIL: 'fail'>
    """

    max_restarts: int = 0

    def make_decision(self, failure: FailureInfo, *, num_restarts: int) -> FailureDecision:
        if num_restarts < self.max_restarts:
            return FailureDecision(
                FailureAction.RESTART,
                f"{failure.reason}; restart {num_restarts + 1} of {self.max_restarts}",
            )
        if self.max_restarts == 0:
            return FailureDecision(FailureAction.FAIL, f"{failure.reason} (max_restarts is 0)")
        return FailureDecision(
            FailureAction.FAIL,
            f"{failure.reason}; all {self.max_restarts} restarts used: raise --max-restarts"
            " or fix the failure",
        )


def diagnose(
    attempt: int,
    exits_before_teardown: Sequence[tuple[float, RankExit]],
    all_exits: Sequence[RankExit],
    nodes: Sequence[NodeStatus],
    node_log_tails: dict[str, list[str]],
) -> FailureInfo:
    """Name the root cause of a failed attempt.

    The first rank that ended badly *before* the runner tore the attempt down is
    the cause; ranks that died afterwards (SIGTERM, or a peer's broken
    connection) are consequences. Without any rank exit, a node's launcher died:
    the node is reported lost, with its launcher's last lines.

    Example:
        >>> bad = RankExit(rank=1, exit_code=3, tail=["boom"])
        >>> diagnose(1, [(2.0, bad)], [bad], [], {}).reason
        'rank 1 exit code 3'
    """
    failed = sorted(((ts, e) for ts, e in exits_before_teardown if not e.ok), key=lambda te: te[0])
    if failed:
        root = failed[0][1]
        return FailureInfo(
            attempt=attempt,
            reason=root.describe(),
            rank=root.rank,
            exit_code=root.exit_code,
            signal=root.signal,
            log_tail=list(root.tail),
            rank_exits=sorted(all_exits, key=lambda e: e.rank),
        )
    bad_nodes = [n for n in nodes if n.exit_code not in (None, 0)]
    if bad_nodes:
        node = bad_nodes[0]
        how = node.detail or f"its launcher exited with code {node.exit_code}"
        return FailureInfo(
            attempt=attempt,
            reason=f"node {node.node} lost: {how}",
            exit_code=node.exit_code if node.exit_code and node.exit_code > 0 else None,
            log_tail=node_log_tails.get(node.node, []),
            rank_exits=sorted(all_exits, key=lambda e: e.rank),
        )
    return FailureInfo(attempt=attempt, reason="the attempt failed for an unknown reason")
