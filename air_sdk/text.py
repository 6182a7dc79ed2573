"""Words for numbers in what users read: `plural` ("1 slot", "2 slots"), `age`
("12 s ago") and `span` ("ranks 0-1"), and a rank's traceback in the user's terms (`user_traceback`).
Pure standard library, so every layer may use it.

Example:
    >>> plural(1, "slot"), plural(3, "process", "processes")
    ('1 slot', '3 processes')
"""

from __future__ import annotations

import re
import time

__all__ = ["age", "clock", "plural", "span", "user_traceback"]


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, in the plural unless `count` is 1.

    Example:
        >>> plural(1, "node"), plural(0, "restart"), plural(2, "GPU")
        ('1 node', '0 restarts', '2 GPUs')
    """
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"


def age(seconds: float) -> str:
    """How long ago, in the largest whole unit: "12 s ago", "3 min ago", "1 day ago".

    Example:
        >>> age(12.4), age(185), age(7300), age(86400 * 2)
        ('12 s ago', '3 min ago', '2 h ago', '2 days ago')
    """
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{plural(s // 86400, 'day')} ago"


def clock(ts: float, now: float | None = None) -> str:
    """A moment in local time: "14:03:12" today, "2026-11-30 14:03" another day (a time
    that stays right when the page showing it is read later, unlike "12 s ago").

    Example:
        >>> clock(time.mktime((2026, 12, 2, 14, 3, 12, 0, 0, -1)), now=time.mktime((2026, 12, 2, 18, 0, 0, 0, 0, -1)))
        '14:03:12'
        >>> clock(time.mktime((2026, 11, 30, 14, 3, 12, 0, 0, -1)), now=time.mktime((2026, 12, 2, 18, 0, 0, 0, 0, -1)))
        '2026-11-30 14:03'
    """
    when = time.localtime(ts)
    today = time.localtime(time.time() if now is None else now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M:%S", when)
    return time.strftime("%Y-%m-%d %H:%M", when)


def span(noun: str, count: int) -> str:
    """The members 0..count-1 of something numbered from 0: "rank 0 only", "ranks 0-1".

    Example:
        >>> span("rank", 1), span("rank", 2), span("node", 8)
        ('rank 0 only', 'ranks 0-1', 'nodes 0-7')
    """
    if count <= 1:
        return f"{noun} 0 only"
    return f"{noun}s 0-{count - 1}"


#: a traceback's frame line: '  File "path", line 3, in main'
_TB_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line \d+')
#: frames of AIR's launcher, not of the user's program
_LAUNCHER = ("/air_sdk/runtime/_rank_main.py", "<frozen runpy>", "/runpy.py")


def user_traceback(lines: list[str], job_id: str) -> list[str]:
    """A rank's output lines with its tracebacks in the user's terms: AIR's launcher
    frames (`_rank_main.py`, runpy) left out, and the job's code directory on the
    gateway (`.../jobs/JOB/code/`) cut from paths, leaving them as in the workdir.

    Example:
        >>> user_traceback([
        ...     '  File "/srv/air/air_sdk/runtime/_rank_main.py", line 252, in main',
        ...     "    runpy.run_module(args[1])",
        ...     '  File "<frozen runpy>", line 88, in _run_code',
        ...     '  File "/home/air/jobs/j-1/code/train.py", line 2, in <module>',
        ...     "    helper.main()"], "j-1")
        ['  File "train.py", line 2, in <module>', '    helper.main()']
    """
    code_dir = re.compile(rf'File "[^"]*/jobs/{re.escape(job_id)}/code/')
    shown: list[str] = []
    skipping_indent: str | None = None
    for line in lines:
        frame = _TB_FRAME.match(line)
        if frame:
            launcher = any(mark in frame["path"] for mark in _LAUNCHER)
            skipping_indent = frame["indent"] if launcher else None
            if launcher:
                continue
        elif skipping_indent is not None and line.startswith(skipping_indent + "  "):
            continue  # the launcher frame's source line (and caret line)
        else:
            skipping_indent = None
        shown.append(code_dir.sub('File "', line))
    return shown
