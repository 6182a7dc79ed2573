"""Which rank is behind, and in which collective: reading torch's flight recorder dumps.

Every rank's process-group backend keeps a ring of its recent collectives (the
"flight recorder": `TORCH_NCCL_TRACE_BUFFER_SIZE` / `TORCH_FR_BUFFER_SIZE`); a dump
is a dict with `version`, `pg_config` ({group: {"name", "desc", "ranks": "[0, 1]"}})
and `entries`, one per collective or point-to-point call, oldest first:

    {"record_id": 41, "pg_id": 0, "process_group": ("0", "default_pg"),
     "collective_seq_id": 42, "p2p_seq_id": 0, "op_id": 42,
     "profiling_name": "nccl:all_reduce", "input_sizes": [[4096]],
     "input_dtypes": ["Float"], "output_sizes": [[4096]], "state": "started",
     "retired": False, "is_p2p": False, "timeout_ms": 600000, ...}

`collective_seq_id` counts a group's collectives on each rank: in a healthy job every
member of a group issues the same sequence. So in a hang the rank whose last
collective in a group is older than its peers' is the one that is behind (it never
called the collective they wait in), and ranks at the same number that called
different operations or sizes are a mismatch. This module is pure: dicts in, a
`CollectiveDiagnosis` out.

Example:
    >>> def entry(seq, state="completed"):
    ...     return {"process_group": ("0", "default_pg"), "collective_seq_id": seq,
    ...             "profiling_name": "nccl:all_reduce", "input_sizes": [[8]], "state": state}
    >>> dumps = {0: {"entries": [entry(1), entry(2, "started")]},
    ...          1: {"entries": [entry(1)]}}
    >>> print(diagnose(dumps).summary)
    rank 1 is behind in process group 0 (default_pg): rank 0 waits in all_reduce #2 ([8]); rank 1 last called all_reduce #1 (completed)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CollectiveDiagnosis",
    "CollectiveRecord",
    "RankTrace",
    "diagnose",
    "format_ranks",
    "records_of",
    "summarize",
]

#: entries per rank kept for the failure record (the newest)
LAST_COLLECTIVES = 5


@dataclass(frozen=True)
class CollectiveRecord:
    """One flight recorder entry, the fields the analysis reads."""

    group: str
    group_desc: str
    seq: int
    op: str
    state: str
    is_p2p: bool = False
    input_sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()

    @property
    def group_label(self) -> str:
        desc = self.group_desc
        return f"{self.group} ({desc})" if desc and desc != "undefined" else self.group

    @property
    def sizes_text(self) -> str:
        return ", ".join(str(list(s)) for s in self.input_sizes)

    def describe(self) -> str:
        """`all_reduce #42 in process group 0 (default_pg) [4096] Float: started`."""
        kind = "p2p " if self.is_p2p else ""
        dtypes = f" {'/'.join(sorted(set(self.dtypes)))}" if self.dtypes else ""
        return (
            f"{kind}{self.op} #{self.seq} in process group {self.group_label}"
            f" [{self.sizes_text}]{dtypes}: {self.state}"
        )


def _sizes(raw: Any) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(int(d) for d in shape) for shape in raw or ())
    except (TypeError, ValueError):
        return ()


def records_of(dump: Mapping[str, Any]) -> list[CollectiveRecord]:
    """The entries of one rank's dump, oldest first; malformed entries are skipped
    (a dump is read from a file a job wrote)."""
    out = []
    for e in dump.get("entries") or ():
        if not isinstance(e, Mapping):
            continue
        try:
            group = e.get("process_group") or (str(e.get("pg_id", "?")), "")
            name, desc = (str(group[0]), str(group[1])) if len(group) > 1 else (str(group[0]), "")
            profiling = str(e.get("profiling_name") or "?")
            is_p2p = bool(e.get("is_p2p", False))
            seq = int(e["p2p_seq_id"] if is_p2p else e["collective_seq_id"])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        out.append(
            CollectiveRecord(
                group=name,
                group_desc=desc,
                seq=seq,
                op=profiling.split(":", 1)[-1],
                state=str(e.get("state") or "?"),
                is_p2p=is_p2p,
                input_sizes=_sizes(e.get("input_sizes")),
                dtypes=tuple(str(d) for d in e.get("input_dtypes") or ()),
            )
        )
    return out


def _members(dump: Mapping[str, Any]) -> dict[str, frozenset[int]]:
    """Global ranks of every group, from a dump's `pg_config` (where it says)."""
    members: dict[str, frozenset[int]] = {}
    config = dump.get("pg_config")
    if not isinstance(config, Mapping):
        return members
    for key, info in config.items():
        if not isinstance(info, Mapping):
            continue
        ranks = info.get("ranks")
        try:
            parsed = json.loads(ranks) if isinstance(ranks, str) else list(ranks or ())
            members[str(info.get("name") or key)] = frozenset(int(r) for r in parsed)
        except (TypeError, ValueError):
            continue
    return members


@dataclass(frozen=True)
class RankTrace:
    """What the analysis keeps of one rank's dump (a dump can be megabytes; this is a
    few records): its last collective in each group, its newest entries, and the
    group memberships it knows."""

    last_by_group: dict[str, CollectiveRecord]
    newest: list[CollectiveRecord]
    members: dict[str, frozenset[int]]


def summarize(dump: Mapping[str, Any], *, num_last: int = LAST_COLLECTIVES) -> RankTrace:
    """One rank's dump reduced to a `RankTrace`."""
    records = records_of(dump)
    return RankTrace(_last_per_group(records), records[-num_last:], _members(dump))


def format_ranks(ranks: Iterable[int]) -> str:
    """`0-2, 5, 7-8` for [0, 1, 2, 5, 7, 8].

    Example:
        >>> format_ranks([7, 0, 1, 2, 8, 5])
        '0-2, 5, 7-8'
    """
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


def _ranks_word(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}"


@dataclass(frozen=True)
class CollectiveDiagnosis:
    """What the dumps say about a hang: `summary` is one line for the failure reason."""

    summary: str
    #: ranks that are behind (or disagree); empty when every rank reached the same point
    culprits: list[int] = field(default_factory=list)
    #: each rank's newest entries, described (`CollectiveRecord.describe`)
    last_collectives: dict[int, list[str]] = field(default_factory=dict)


def _last_per_group(records: list[CollectiveRecord]) -> dict[str, CollectiveRecord]:
    last: dict[str, CollectiveRecord] = {}
    for r in records:
        if not r.is_p2p and (r.group not in last or r.seq >= last[r.group].seq):
            last[r.group] = r
    return last


def _group_verdict(
    group: str, at: dict[int, CollectiveRecord | None]
) -> tuple[str, list[int]] | None:
    """The verdict for one group from each member's last collective there (None: all
    members stand at the same collective, issued alike)."""
    seqs = {rank: r.seq if r is not None else 0 for rank, r in at.items()}
    front = max(seqs.values())
    behind = sorted(rank for rank, seq in seqs.items() if seq < front)
    ahead = sorted(rank for rank, seq in seqs.items() if seq == front)
    lead = at[ahead[0]]
    assert lead is not None
    label = lead.group_label
    if behind:
        oldest = min(seqs[r] for r in behind)
        laggard = [r for r in behind if seqs[r] == oldest]
        waiting = f"{_ranks_word(ahead)} wait{'s' if len(ahead) == 1 else ''} in {lead.op} #{front}"
        if lead.input_sizes:
            waiting += f" ({lead.sizes_text})"
        last = at[laggard[0]]
        if last is not None:
            their = f"last called {last.op} #{last.seq} ({last.state})"
        else:
            their = "called none there"
        return (
            f"{_ranks_word(behind)} {'is' if len(behind) == 1 else 'are'} behind in process"
            f" group {label}: {waiting}; {_ranks_word(laggard)} {their}",
            behind,
        )
    kinds: dict[tuple[str, tuple[tuple[int, ...], ...]], list[int]] = {}
    for rank, r in at.items():
        assert r is not None
        kinds.setdefault((r.op, r.input_sizes), []).append(rank)
    if len(kinds) > 1:
        pieces = [
            f"{_ranks_word(ranks)} called {op} ({', '.join(str(list(s)) for s in sizes)})"
            for (op, sizes), ranks in sorted(kinds.items(), key=lambda kv: min(kv[1]))
        ]
        minority = min(kinds.values(), key=len)
        return (
            f"collective mismatch in process group {label} at #{front}: " + "; ".join(pieces),
            sorted(minority),
        )
    return None


def diagnose(
    dumps: Mapping[int, RankTrace | Mapping[str, Any]],
) -> CollectiveDiagnosis | None:
    """Name the rank that is behind (and in which collective), or the mismatch, from
    every rank's flight recorder dump (global rank -> dump dict, or its `summarize`d
    `RankTrace`). None without dumps.
    """
    if not dumps:
        return None
    traces = {rank: d if isinstance(d, RankTrace) else summarize(d) for rank, d in dumps.items()}
    last = {rank: [r.describe() for r in t.newest] for rank, t in traces.items()}
    members: dict[str, set[int]] = {}
    for t in traces.values():
        for group, group_ranks in t.members.items():
            members.setdefault(group, set()).update(group_ranks)
    last_by_group = {rank: t.last_by_group for rank, t in traces.items()}
    groups = sorted({g for lg in last_by_group.values() for g in lg}, key=_group_order)
    verdicts: list[tuple[str, list[int]]] = []
    for group in groups:
        ranks = members.get(group) or {r for r, lg in last_by_group.items() if group in lg}
        dumped = sorted(r for r in ranks if r in last_by_group)
        if len(dumped) < 2:
            continue
        verdict = _group_verdict(group, {r: last_by_group[r].get(group) for r in dumped})
        if verdict is not None:
            verdicts.append(verdict)
    missing = sorted({r for rs in members.values() for r in rs} - set(dumps))
    note = f" (no dump from {_ranks_word(missing)})" if missing else ""
    if verdicts:
        summary, culprits = verdicts[0]
        if len(verdicts) > 1:
            summary += f"; and {len(verdicts) - 1} more group(s) disagree"
        return CollectiveDiagnosis(summary + note, culprits, last)
    open_ = [
        t.last_by_group[g]
        for g in groups
        for t in traces.values()
        if g in t.last_by_group and t.last_by_group[g].state != "completed"
    ]
    if open_:
        r = open_[0]
        summary = (
            f"every rank entered {r.op} #{r.seq} in process group {r.group_label} and it did not"
            " complete: the ranks agree, so suspect the network or a GPU (NCCL)"
        )
    else:
        summary = "every rank's last collective completed: the hang is outside collectives"
    return CollectiveDiagnosis(summary + note, [], last)


def _group_order(group: str) -> tuple[int, str]:
    # the default group ("0") first: what every rank shares says most
    return (0, "") if group == "0" else (1, group)
