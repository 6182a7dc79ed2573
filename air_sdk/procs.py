"""Process identity: a pid is a process only together with its start time.

The NodeRunner's records and the detached gateway's state file keep both, so a
later process that got the same pid is never taken for the one recorded, and a
zombie or a process still being torn down after SIGKILL is not running.
"""

from __future__ import annotations

import signal

__all__ = ["alive", "create_time", "dying", "exited"]

#: two start times within this many seconds are the same process (psutil's precision)
_SAME_START_S = 0.05
#: /proc/PID/stat flags: the process is exiting (include/linux/sched.h)
_PF_EXITING = 0x4


def create_time(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch, psutil's clock); None if it is gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def alive(pid: int, created: float | None = None) -> bool:
    """Whether `pid` runs and, with `created`, is still the process that started then
    (not a later one that got its pid). A zombie does not run, nor does a process that
    is dying: one SIGKILLed shows as "running" for a while (measured: 18 of 20 kills of
    a process with 300 MB and 50 threads), while the kernel tears it down.

    Example:
        >>> import os
        >>> alive(os.getpid())
        True
    """
    import psutil

    if pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) or dying(pid):
            return False
        return created is None or abs(p.create_time() - created) < _SAME_START_S
    except psutil.Error:
        return False


def exited(pid: int) -> bool:
    """Whether `pid` has finished exiting: gone, or a zombie. Unlike `not alive(pid)`, a
    process still being torn down after SIGKILL has not exited yet: it still holds its
    memory, files and devices.

    Example:
        >>> import os
        >>> exited(os.getpid())
        False
    """
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return True


def dying(pid: int) -> bool:
    """Whether `pid` is on its way out: exiting (PF_EXITING) or with a SIGKILL pending.
    False where /proc cannot tell.

    Example:
        >>> import os
        >>> dying(os.getpid())
        False
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        flags = int(stat[stat.rindex(b")") + 2 :].split()[6])
        if flags & _PF_EXITING:
            return True
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                pending = line.startswith(("ShdPnd:", "SigPnd:"))
                if pending and int(line.split()[1], 16) & (1 << (signal.SIGKILL - 1)):
                    return True
    except (OSError, ValueError, IndexError):
        return False
    return False
