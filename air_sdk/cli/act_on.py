"""What a user acts on, said in a line: where each rank of a hung job stood, and what
goodput counts.

Pure functions of schema objects to text, shared by `air status` and the summary that
`air submit --follow` prints when the job ends.
"""

from __future__ import annotations

import re

from air_sdk.schema.api import JobRecord
from air_sdk.schema.events import FailureInfo
from air_sdk.schema.state import JobState

__all__ = ["goodput_text", "hang_lines", "top_frames"]

#: a frame line of `py-spy dump`: "    function (path/to/file.py:12)"
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<path>[^()]+?):(?P<line>\d+)\)\s*$")
#: frames of these are Python's, a library's or AIR's, not the user's
_NOT_USERS = ("site-packages/", "dist-packages/", "/lib/python3", "/air_sdk/", "<frozen ")


def _short(func: str, path: str, line: str) -> str:
    return f"{func} ({path.rsplit('/', 1)[-1]}:{line})"


def top_frames(stack: str) -> str:
    """A rank's stack (`py-spy dump`) in a line: the main thread's top frame, and the
    innermost frame of the user's own code when that is another one.

    Example:
        >>> dump = '''Process 7: python train.py
        ... Thread 7 (idle): "MainThread"
        ...     wait (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4120)
        ...     step (/srv/job/code/train.py:31)
        ...     <module> (/srv/job/code/train.py:40)'''
        >>> top_frames(dump)
        'wait (distributed_c10d.py:4120) in step (train.py:31)'
        >>> top_frames("no stack: py-spy is not installed (pip install py-spy)")
        'no stack: py-spy is not installed (pip install py-spy)'
    """
    frames: list[tuple[str, str, str]] = []
    in_main = False
    for line in stack.splitlines():
        if line.startswith("Thread "):
            if frames:  # the first thread with frames (the main one comes first)
                break
            in_main = True
            continue
        match = _FRAME.match(line) if in_main else None
        if match:
            frames.append((match["func"], match["path"], match["line"]))
    if not frames:
        lines = [s.strip() for s in stack.splitlines() if s.strip()]
        return lines[-1][:200] if lines else "no stack"
    top = _short(*frames[0])
    users = [f for f in frames if not any(mark in f[1] for mark in _NOT_USERS)]
    if users and users[0] != frames[0]:
        return f"{top} in {_short(*users[0])}"
    return top


def hang_lines(failure: FailureInfo) -> list[str]:
    """Where each rank of a hung attempt stood: its top frame, one line a rank.

    Example:
        >>> hang_lines(FailureInfo(attempt=1, reason="r", kind="hang", stalled_ranks=[1],
        ...     stacks={0: 'Thread 1 (idle): "MainThread"\\n    main (/c/train.py:9)'}))
        ['stalled: rank 1', 'rank 0 at main (train.py:9)', 'every frame: air status --json']
    """
    lines: list[str] = []
    if failure.stalled_ranks:
        ranks = ", ".join(map(str, failure.stalled_ranks))
        lines.append(f"stalled: rank{'s' if len(failure.stalled_ranks) > 1 else ''} {ranks}")
    for rank, stack in sorted(failure.stacks.items()):
        lines.append(f"rank {rank} at {top_frames(stack)}")
    if failure.stacks:
        lines.append("every frame: air status --json")
    return lines


def goodput_text(record: JobRecord) -> str:
    """Goodput and what it counts: training whose work was kept, of the wall time from
    the first launch; on one attempt that ended well the rest is start-up (launch,
    rendezvous, loading, the first step), else also restarts and redone work ("" when
    the gateway did not say).

    Example:
        >>> from air_sdk.schema import JobSpec
        >>> rec = JobRecord(id="j", tenant="t", name="n", created_at=0, updated_at=0,
        ...     state=JobState.SUCCEEDED, attempt=1, spec=JobSpec(entrypoint="t.py"),
        ...     goodput=0.31, productive_s=9.2, wall_s=29.4)
        >>> goodput_text(rec)
        'goodput 31% (training 9 s of 29 s; start-up 20 s)'
    """
    if record.goodput is None:
        return ""
    text = f"goodput {record.goodput:.0%}"
    if record.productive_s is None or not record.wall_s:
        return text
    lost = max(0.0, record.wall_s - record.productive_s)
    if record.attempt <= 1 and record.state in (JobState.SUCCEEDED, JobState.RUNNING):
        rest = f"start-up {lost:.0f} s"
    else:
        rest = f"start-up, failed attempts and redone work {lost:.0f} s"
    return f"{text} (training {record.productive_s:.0f} s of {record.wall_s:.0f} s; {rest})"
