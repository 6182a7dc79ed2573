"""Policies decide, controllers act: what to do after a failure, who is to blame, when a
rank hangs or straggles, and when a node is too unreliable to place on.

Every policy here is a pure function of its inputs (plus an injected random source
for jitter), so each rule has a plain unit test.
"""

from __future__ import annotations

import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from air_sdk.runner.backends.base import NodeStatus
from air_sdk.schema import FailureInfo, FailurePolicySpec, Placement, RankExit, Resources
from air_sdk.text import plural

#: the exit status of a process ended by SIGTERM (128 + 15)
SIGTERM_EXIT = 143
DEFAULT_HANG_TIMEOUT_S = 60.0
#: how long ranks that never logged a step may show no sign of life (no output, no CPU
#: or GPU use) before the job is hung, unless hang_timeout_s says otherwise
DEFAULT_SILENT_HANG_TIMEOUT_S = 300.0
HANG_STEP_FACTOR = 3.0


class FailureAction(str, Enum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class FailureDecision:
    action: FailureAction
    reason: str
    delay_s: float = 0.0
    #: whether this restart uses up one of `max_restarts`
    charged: bool = True


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a failed attempt while the budget lasts, after an exponential backoff
    with full jitter; fail at once on failures declared non-retryable and on a job past
    one of its own limits (`JobSpec.limits`: the restart would pass it again, as an OOM
    loop does). Preemptions and other uncharged failures restart without using the
    budget.

    Example:
        >>> f = FailureInfo(attempt=1, reason="rank 1 exit code 3", exit_code=3)
        >>> RestartPolicy(max_restarts=1).make_decision(f, num_restarts=0).action
        <FailureAction.RESTART: 'restart'>
        >>> RestartPolicy(max_restarts=1).make_decision(f, num_restarts=1).action
        <FailureAction.FAIL: 'fail'>
    """

    max_restarts: int = 0
    spec: FailurePolicySpec = field(default_factory=FailurePolicySpec)
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def backoff_s(self, num_restarts: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**n)] (AWS's recommendation:
        restarts of many jobs do not stampede the cluster in lockstep)."""
        cap = min(self.spec.backoff_max_s, self.spec.backoff_base_s * (2**num_restarts))
        return self.rng.uniform(cap / 2, cap) if cap > 0 else 0.0

    def make_decision(self, failure: FailureInfo, *, num_restarts: int) -> FailureDecision:
        not_retryable = self._non_retryable(failure)
        if not_retryable:
            return FailureDecision(FailureAction.FAIL, f"{failure.reason}; {not_retryable}")
        if not failure.charged:
            return FailureDecision(
                FailureAction.RESTART,
                f"{failure.reason}; restarting (not charged to the restart budget)",
                delay_s=0.0,
                charged=False,
            )
        if num_restarts < self.max_restarts:
            return FailureDecision(
                FailureAction.RESTART,
                f"{failure.reason}; restart {num_restarts + 1} of {self.max_restarts}",
                delay_s=self.backoff_s(num_restarts),
            )
        if self.max_restarts == 0:
            return FailureDecision(FailureAction.FAIL, f"{failure.reason} (max_restarts is 0)")
        return FailureDecision(
            FailureAction.FAIL,
            f"{failure.reason}; all {plural(self.max_restarts, 'restart')} used: raise"
            " --max-restarts"
            " or fix the failure",
        )

    def _non_retryable(self, failure: FailureInfo) -> str:
        if failure.kind == "limit":  # the job's own use: a restart would hit it again
            return "not restarted: raise the limit or use less"
        if (
            failure.exit_code is not None
            and failure.exit_code in self.spec.non_retryable_exit_codes
        ):
            return f"exit code {failure.exit_code} is declared non-retryable"
        for pattern in self.spec.non_retryable_patterns:
            for line in failure.log_tail:
                if re.search(pattern, line):
                    return f"its log matches the non-retryable pattern {pattern!r}"
        return ""


def diagnose(
    attempt: int,
    exits_before_teardown: Sequence[tuple[float, RankExit]],
    all_exits: Sequence[RankExit],
    nodes: Sequence[NodeStatus],
    node_log_tails: dict[str, list[str]],
    *,
    terminated_by_runner: bool = False,
    last_seen: Mapping[str, float] | None = None,
    detected_at: float | None = None,
) -> FailureInfo:
    """Name the root cause of a failed attempt.

    The first rank that ended badly *before* the runner tore the attempt down is
    the cause; ranks that died afterwards (SIGTERM, or a peer's broken
    connection) are consequences. A root cause killed by SIGTERM that the runner
    did not send is a preemption (not charged to the restart budget). Without any
    rank exit, a node's launcher died: the node is reported lost, with its
    launcher's last lines. A machine that left the cluster (`NodeStatus.lost`) comes
    before any rank exit: its own ranks could report nothing, and the ranks that
    did crash on other nodes lost their peer.

    The failure happened (`failed_at`) when the root cause rank ended, or for a lost
    node at its last heartbeat (`last_seen`: node -> the newest report of its ranks);
    `detected_at` is when the runner noticed, both for the `time_to_detect` SLO.

    Example:
        >>> bad = RankExit(rank=1, exit_code=3, tail=["boom"])
        >>> crash = diagnose(1, [(2.0, bad)], [bad], [], {}, detected_at=2.5)
        >>> crash.reason, crash.failed_at, crash.detected_at
        ('rank 1 exit code 3', 2.0, 2.5)
    """
    failure = _diagnose(
        attempt,
        exits_before_teardown,
        all_exits,
        nodes,
        node_log_tails,
        terminated_by_runner=terminated_by_runner,
    )
    if failure.kind == "lost_node" and failure.node is not None:
        failed_at = (last_seen or {}).get(failure.node)
    else:
        failed_at = min((ts for ts, e in exits_before_teardown if not e.ok), default=None)
    return failure.model_copy(update={"failed_at": failed_at, "detected_at": detected_at})


def last_seen_by_node(
    heartbeats: Mapping[int, tuple[int | None, float, float | None]],
    placement: Placement,
    resources: Resources,
) -> dict[str, float]:
    """{node: its ranks' newest report}, from the store's {rank: (step, last report,
    last progress)}; ranks follow the placement's node order (rank = node index x ranks
    per node + local rank).

    Example:
        >>> from air_sdk.schema import NodeAssignment
        >>> where = Placement(job_id="j", nodes=(NodeAssignment(node="n0", slots=2),
        ...                                      NodeAssignment(node="n1", slots=2)))
        >>> beats = {0: (3, 5.0, 5.0), 1: (3, 7.0, 7.0), 2: (3, 6.0, 6.0)}
        >>> last_seen_by_node(beats, where, Resources(nodes=2, gpus_per_node=0, procs_per_node=2))
        {'n0': 7.0, 'n1': 6.0}
    """
    nodes = [a.node for a in placement.nodes]
    seen: dict[str, float] = {}
    for rank, (_, ts, _) in heartbeats.items():
        index = rank // resources.ranks_per_node
        if 0 <= index < len(nodes):
            seen[nodes[index]] = max(ts, seen.get(nodes[index], ts))
    return seen


def _diagnose(
    attempt: int,
    exits_before_teardown: Sequence[tuple[float, RankExit]],
    all_exits: Sequence[RankExit],
    nodes: Sequence[NodeStatus],
    node_log_tails: dict[str, list[str]],
    *,
    terminated_by_runner: bool,
) -> FailureInfo:
    failed = sorted(((ts, e) for ts, e in exits_before_teardown if not e.ok), key=lambda te: te[0])
    everyone = sorted(all_exits, key=lambda e: e.rank)
    gone = [n for n in nodes if n.lost]
    if gone:
        return _lost_node(attempt, gone[0], node_log_tails, everyone)
    if failed:
        root = failed[0][1]
        preempted = not terminated_by_runner and (
            root.signal == "SIGTERM" or root.exit_code == SIGTERM_EXIT
        )
        kind = "preempted" if preempted else ("oom" if root.oom_killed else "crash")
        kind = "limit" if root.limit and not preempted else kind
        reason = root.describe() + (" (preempted: SIGTERM from outside AIR)" if preempted else "")
        return FailureInfo(
            attempt=attempt,
            reason=reason,
            kind=kind,
            node=root.node,
            rank=root.rank,
            exit_code=root.exit_code,
            signal=root.signal,
            log_tail=list(root.tail),
            rank_exits=everyone,
            charged=not preempted,
        )
    bad_nodes = [n for n in nodes if n.exit_code not in (None, 0)]
    if bad_nodes:
        return _lost_node(attempt, bad_nodes[0], node_log_tails, everyone)
    return FailureInfo(attempt=attempt, reason="the attempt failed for an unknown reason")


def _lost_node(
    attempt: int,
    node: NodeStatus,
    node_log_tails: dict[str, list[str]],
    everyone: list[RankExit],
) -> FailureInfo:
    how = node.detail or f"its launcher exited with code {node.exit_code}"
    return FailureInfo(
        attempt=attempt,
        reason=f"node {node.node} lost: {how}",
        kind="lost_node",
        node=node.node,
        exit_code=node.exit_code if node.exit_code and node.exit_code > 0 else None,
        log_tail=node_log_tails.get(node.node, []),
        rank_exits=everyone,
    )


@dataclass
class RankProgress:
    """What the controller has seen of one rank's progress."""

    step: int | None = None
    #: when the step last advanced (or the rank last sent an explicit heartbeat)
    progress_ts: float | None = None
    #: seconds between consecutive progress reports, most recent last
    intervals: list[float] = field(default_factory=list)
    #: when the rank last showed any sign of life: a step, an output line, CPU or GPU
    #: use, or its first report
    active_ts: float | None = None

    def observe(self, step: int | None, progress_ts: float | None) -> None:
        if progress_ts is None or (
            self.progress_ts is not None and progress_ts <= self.progress_ts
        ):
            return
        if (
            self.progress_ts is not None
            and step is not None
            and self.step is not None
            and step > self.step
        ):
            per_step = (progress_ts - self.progress_ts) / (step - self.step)
            self.intervals = (self.intervals + [per_step])[-200:]
        self.step, self.progress_ts = step, progress_ts


@dataclass(frozen=True)
class HangPolicy:
    """A rank that made progress once and then none for `timeout` is hung.

    The timeout is the configured one, else max(60 s, 3x the p99 step time seen
    so far): a checkpoint save that takes a few step times is never a hang.

    Jobs whose ranks never report a step (scripts without air.log/heartbeat) are
    judged by `silent`: hung when no rank printed, used CPU or kept a GPU busy for the
    configured timeout, else 300 s. One busy rank is enough to keep the job alive: its
    peers may be waiting for it in a collective.

    Example:
        >>> ranks = {0: RankProgress(5, 100.0), 1: RankProgress(5, 10.0)}
        >>> HangPolicy().stalled(ranks, now=100.0)
        [1]
        >>> quiet = {0: RankProgress(active_ts=10.0), 1: RankProgress(active_ts=20.0)}
        >>> HangPolicy(timeout_s=30).silent(quiet, now=45.0), HangPolicy(timeout_s=30).silent(quiet, now=55.0)
        ([], [0, 1])
    """

    timeout_s: float | None = None

    def timeout_for(self, ranks: Mapping[int, RankProgress]) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        intervals = sorted(i for p in ranks.values() for i in p.intervals)
        if not intervals:
            return DEFAULT_HANG_TIMEOUT_S
        p99 = intervals[min(len(intervals) - 1, int(0.99 * len(intervals)))]
        return max(DEFAULT_HANG_TIMEOUT_S, HANG_STEP_FACTOR * p99)

    def stalled(self, ranks: Mapping[int, RankProgress], now: float) -> list[int]:
        timeout = self.timeout_for(ranks)
        return sorted(
            r
            for r, p in ranks.items()
            if p.progress_ts is not None and now - p.progress_ts > timeout
        )

    def silent_timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else DEFAULT_SILENT_HANG_TIMEOUT_S

    def silent(self, ranks: Mapping[int, RankProgress], now: float) -> list[int]:
        """Every rank, when none has logged a step and none showed a sign of life (output,
        CPU or GPU use) for `silent_timeout()`; else none."""
        if not ranks or any(p.progress_ts is not None for p in ranks.values()):
            return []
        seen = [p.active_ts for p in ranks.values() if p.active_ts is not None]
        if not seen or now - max(seen) <= self.silent_timeout():
            return []
        return sorted(ranks)

    def stopped_at(
        self, ranks: Mapping[int, RankProgress], hung: Sequence[int], *, silent: bool = False
    ) -> float | None:
        """When a hang began, for the `time_to_detect` SLO: the earliest last progress of
        the stalled ranks (the first to stop holds up the others), or for a silent hang
        the last sign of life of any rank. The hang timeout is part of detecting it.

        Example:
            >>> ranks = {0: RankProgress(5, 100.0), 1: RankProgress(5, 10.0)}
            >>> HangPolicy().stopped_at(ranks, [1])
            10.0
        """
        if silent:
            seen = [p.active_ts for p in ranks.values()]
        else:
            seen = [ranks[r].progress_ts for r in hung if r in ranks]
        known = [ts for ts in seen if ts is not None]
        if not known:
            return None
        return max(known) if silent else min(known)


@dataclass(frozen=True)
class StragglerPolicy:
    """A rank whose median step time stays above `factor` x the median of the other
    ranks' medians, over at least `min_samples` steps, is a straggler (reported, not
    killed).

    Example:
        >>> fast = RankProgress(intervals=[1.0] * 10)
        >>> slow = RankProgress(intervals=[3.0] * 10)
        >>> StragglerPolicy().stragglers({0: fast, 1: fast, 2: slow})
        [2]
    """

    factor: float = 2.0
    min_samples: int = 10

    def stragglers(self, ranks: Mapping[int, RankProgress]) -> list[int]:
        medians = {
            r: statistics.median(p.intervals[-50:])
            for r, p in ranks.items()
            if len(p.intervals) >= self.min_samples
        }
        if len(medians) < 2:
            return []
        out = []
        for r, m in medians.items():
            others = [v for k, v in medians.items() if k != r]
            if m > self.factor * statistics.median(others):
                out.append(r)
        return sorted(out)


#: rank deaths that point at the machine rather than the code
HARDWARE_SIGNALS = frozenset({"SIGBUS", "SIGSEGV", "SIGILL"})
#: output that names a failing device (CUDA/NCCL errors, a GPU XID, ECC, a lost GPU)
DEVICE_ERROR = re.compile(
    r"CUDA error|NCCL error|ncclSystemError|ncclUnhandledCudaError|\bXid\b"
    r"|uncorrectable ECC|ECC_UNCORRECTABLE|GPU is lost|fallen off the bus",
    re.IGNORECASE,
)

NodeEvidenceKind = Literal["crash", "device", "probe"]


@dataclass(frozen=True)
class NodeEvidence:
    """One sign that a node may be bad: a job's crash that looks like the machine's
    (`crash`: a lost launcher, SIGSEGV/SIGBUS/SIGILL), a device error in its output
    (`device`), or the operator's own health probe (`probe`, not a job's doing)."""

    node: str
    kind: NodeEvidenceKind
    tenant: str
    job_id: str
    ts: float


def node_evidence(
    failure: FailureInfo, *, tenant: str, job_id: str, now: float
) -> NodeEvidence | None:
    """What a failed attempt says about the node it names, or None (an exit code is the
    code's doing: it counts against the job's restart budget, never the node).

    Example:
        >>> f = FailureInfo(attempt=1, reason="x", kind="crash", node="n1", signal="SIGSEGV")
        >>> node_evidence(f, tenant="a", job_id="j", now=1.0).kind
        'crash'
    """
    if failure.node is None or failure.kind == "limit":  # a limit hit is the job's doing
        return None
    lines = [*failure.log_tail, *(line for e in failure.rank_exits for line in e.tail)]
    kind: NodeEvidenceKind | None = None
    if any(DEVICE_ERROR.search(line) for line in lines):
        kind = "device"
    elif failure.kind == "lost_node" or (
        failure.kind == "crash" and failure.signal in HARDWARE_SIGNALS
    ):
        kind = "crash"
    if kind is None:
        return None
    return NodeEvidence(node=failure.node, kind=kind, tenant=tenant, job_id=job_id, ts=now)


@dataclass(frozen=True)
class NodeHealthPolicy:
    """A node is left out of placements (for `cooldown_s` after the last evidence) only
    on evidence that is not one job's, nor one tenant's, own doing:

    - a health probe's failure (`probe`): the operator's word, enough alone;
    - failures of jobs of at least `min_tenants` tenants (fewer when the gateway has
      fewer): `min_jobs` jobs for crashes, one for device errors.

    A job that crashes on purpose, however often, uses up its own restarts; a tenant
    alone cannot take a node from the others, since any job's output can claim a
    device error.

    Example:
        >>> ev = [NodeEvidence("n1", "crash", "a", f"j{i}", 100.0) for i in range(5)]
        >>> NodeHealthPolicy().unhealthy(ev, now=110.0, num_tenants=2)
        set()
        >>> ev.append(NodeEvidence("n1", "crash", "b", "k", 105.0))
        >>> NodeHealthPolicy().unhealthy(ev, now=110.0, num_tenants=2)
        {'n1'}
    """

    min_tenants: int = 2
    min_jobs: int = 2
    cooldown_s: float = 300.0

    def unhealthy(
        self, evidence: Sequence[NodeEvidence], now: float, *, num_tenants: int
    ) -> set[str]:
        by_node: dict[str, list[NodeEvidence]] = {}
        for e in evidence:
            if now - e.ts < self.cooldown_s:
                by_node.setdefault(e.node, []).append(e)
        return {node for node, seen in by_node.items() if self._bad(seen, num_tenants)}

    def _bad(self, seen: Sequence[NodeEvidence], num_tenants: int) -> bool:
        if any(e.kind == "probe" for e in seen):
            return True
        tenants = {e.tenant for e in seen}
        if len(tenants) < max(1, min(self.min_tenants, num_tenants)):
            return False
        jobs = {e.job_id for e in seen}
        return len(jobs) >= self.min_jobs or any(e.kind == "device" for e in seen)
