"""A job's limits on one node (`NodeLimits`) and the NodeRunner's watch over them.

cgroups v2 would be the kernel's way, but a gateway seldom gets a delegated subtree
(none here), so two layers do it with what every Linux has:

* **the watch** (`LimitWatch`, a thread of the NodeRunner): every `PROCESS_EVERY_S` it
  walks the attempt's processes (the pids the NodeRunner tracks, never the host) and
  sums their threads and their anonymous resident memory (`RssAnon` of
  `/proc/PID/status`: heap, stacks, tensors; not the libraries and files they map,
  which the kernel can drop and which would be counted once per process; a page
  shared copy-on-write after a fork counts in each process); every `DISK_EVERY_S` or more it adds up the bytes allocated under the
  job's writable directories (`disk_usage`: an `os.scandir` walk, each inode once,
  links never followed), and waits at least `DISK_SCAN_FACTOR` times as long as the
  last walk took before the next, so the walk costs at most ~5% of one core whatever
  the job writes. Past a limit it calls back with the reason, and the NodeRunner
  kills the attempt's processes;
* **rlimits** set in each rank before its program runs (`rlimits`, applied by the
  cold start's trampoline and by a warm interpreter when it becomes the rank; they
  hold for every process the rank starts): `RLIMIT_FSIZE` at the disk limit (no one
  file outgrows the job's disk; Python then gets "File too large"), `RLIMIT_DATA` at
  the memory limit plus `DATA_HEADROOM` (one allocation cannot race past the watch;
  the headroom because it counts writable address space a process reserves and never
  touches, such as thread stacks) and `RLIMIT_NPROC` at the process limit when the
  rank has a user namespace of its own and the gateway is not root (the kernel counts
  per user and namespace, and never limits uid 0). Never `RLIMIT_AS`: CUDA reserves
  terabytes of address space.

`explain_exit` reads a rank's end for the rlimits' signs ("File too large",
`MemoryError`), so that failure also names its limit. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from air_sdk.runner.node.sandbox import is_sandbox_wrapper
from air_sdk.runner.nofollow import iter_files

__all__ = [
    "DATA_HEADROOM",
    "LimitWatch",
    "NodeLimits",
    "Usage",
    "disk_usage",
    "explain_exit",
    "measure",
    "rlimit_arg",
]

#: how often the watch counts processes and memory
PROCESS_EVERY_S = 0.5
#: the shortest time between two walks of the job's directories
DISK_EVERY_S = 2.0
#: ...and at least this many times as long as the last walk took (~5% of a core)
DISK_SCAN_FACTOR = 20.0
#: RLIMIT_DATA is the memory limit plus this (see the module docstring)
DATA_HEADROOM = 1 << 30
_ASK = "ask the operator"
_MEMORY_SIGNS = (
    "MemoryError",
    "Cannot allocate memory",
    "can't allocate memory",
    "std::bad_alloc",
    "Unable to allocate",
)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _size(num_bytes: float) -> str:
    """As `air_sdk.schema.limits.format_size` (not imported: no pydantic here)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            text = f"{value:.1f}".rstrip("0").rstrip(".") if unit != "B" else f"{value:.0f}"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _past(used: int, limit: int) -> str:
    """ "X > limit Y", in bytes when the rounded sizes would read the same.

    Example:
        >>> _past(300 << 20, 64 << 20), _past((16 << 20) + 4096, 16 << 20)
        ('300 MiB > limit 64 MiB', '16781312 bytes > limit 16777216 bytes')
    """
    if _size(used) == _size(limit):
        return f"{used} bytes > limit {limit} bytes"
    return f"{_size(used)} > limit {_size(limit)}"


@dataclass(frozen=True)
class NodeLimits:
    """What one job may use on one node (`JobSpec.limits` under the operator's caps);
    None: no limit. `disk_dirs`: the job's writable directories on this node.

    Example:
        >>> NodeLimits(memory=64 << 20, disk=1 << 30).rlimits(user_namespace=True, root=True)
        {'DATA': 1140850688, 'FSIZE': 1073741824}
    """

    memory: int | None = None
    processes: int | None = None
    disk: int | None = None
    disk_dirs: list[str] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.memory, self.processes, self.disk))

    def rlimits(self, *, user_namespace: bool, root: bool | None = None) -> dict[str, int]:
        """The rlimits a rank gets, by `resource.RLIMIT_*` name without the prefix."""
        root = os.geteuid() == 0 if root is None else root
        out: dict[str, int] = {}
        if self.memory is not None:
            out["DATA"] = self.memory + DATA_HEADROOM
        if self.disk is not None:
            out["FSIZE"] = self.disk
        if self.processes is not None and user_namespace and not root:
            out["NPROC"] = self.processes
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> NodeLimits:
        return cls(**dict(data or {}))


def rlimit_arg(rlimits: Mapping[str, int]) -> str:
    """`rlimits` as one argument ("DATA=1,FSIZE=2"; "-" for none) for the trampoline.

    Example:
        >>> rlimit_arg({"DATA": 1, "FSIZE": 2}), rlimit_arg({})
        ('DATA=1,FSIZE=2', '-')
    """
    return ",".join(f"{k}={v}" for k, v in sorted(rlimits.items())) or "-"


@dataclass(frozen=True)
class Usage:
    """What the attempt's processes use now: processes + threads, memory (bytes)."""

    tasks: int
    memory: int


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _memory(pid: int) -> int:
    """`pid`'s anonymous resident memory: read from counters the kernel keeps, O(1)
    whatever the process's size (`smaps_rollup`'s proportional size walks its page
    tables: 173 ms for 1 GiB resident here, under the process's mmap lock)."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"RssAnon:"):
            return int(line.split()[1]) * 1024
    fields = _read(f"/proc/{pid}/statm").split()  # resident less shared
    return (int(fields[1]) - int(fields[2])) * _PAGE if len(fields) > 2 else 0


def _is_wrapper(pid: int) -> bool:
    argv = [os.fsdecode(a) for a in _read(f"/proc/{pid}/cmdline").split(b"\0") if a]
    return is_sandbox_wrapper(argv)


def measure(pids: Sequence[int]) -> Usage:
    """Threads and memory of `pids` (a sandbox's own processes left out: they are
    AIR's, not the job's).

    Example:
        >>> measure([os.getpid()]).tasks >= 1
        True
    """
    tasks = memory = 0
    for pid in pids:
        try:
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue  # gone
        if _is_wrapper(pid):
            continue
        tasks += threads
        memory += _memory(pid)
    return Usage(tasks, memory)


def disk_usage(dirs: Sequence[str]) -> int:
    """Bytes allocated under `dirs` (as `du` counts: blocks, each inode once, links
    not followed; a directory named twice or nested is walked once).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = open(os.path.join(d, "f"), "wb").write(b"x" * 100_000)
        ...     disk_usage([d, d]) >= 100_000
        True
    """
    # The job writes these directories while they are walked: each is opened with
    # O_NOFOLLOW and walked by fd (`nofollow.iter_files`, os.fwalk), so a directory
    # swapped for a link mid-walk is skipped, never followed out of the job's tree.
    roots: list[str] = []
    for d in sorted({os.path.abspath(d) for d in dirs if d}):
        if not any(d == r or d.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(d)  # a directory inside another root is walked with it
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # not there (yet), or a link
        try:
            for _, st in iter_files(fd):
                if st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += getattr(st, "st_blocks", 0) * 512 or st.st_size
        finally:
            os.close(fd)
    return total


def over(limits: NodeLimits, usage: Usage | None, disk: int | None, node: str) -> str | None:
    """The reason the job fails for, when `usage` or `disk` is past a limit.

    Example:
        >>> print(over(NodeLimits(memory=64 << 20), Usage(3, 300 << 20), None, "node-0"))
        memory limit: job used 300 MiB > limit 64 MiB on node-0 (set --memory-limit / ask the operator)
        >>> print(over(NodeLimits(processes=64), Usage(65, 0), None, "n"))
        process limit: job ran 65 processes and threads > limit 64 on n (set --max-processes / ask the operator)
        >>> print(over(NodeLimits(disk=8 << 20), None, 9 << 20, "n"))
        disk limit: job's directories hold 9 MiB > limit 8 MiB (set --disk-limit / ask the operator)
    """
    if usage is not None and limits.processes is not None and usage.tasks > limits.processes:
        return (
            f"process limit: job ran {usage.tasks} processes and threads > limit"
            f" {limits.processes} on {node} (set --max-processes / {_ASK})"
        )
    if usage is not None and limits.memory is not None and usage.memory > limits.memory:
        return (
            f"memory limit: job used {_past(usage.memory, limits.memory)} on {node} (set"
            f" --memory-limit / {_ASK})"
        )
    if disk is not None and limits.disk is not None and disk > limits.disk:
        return (
            f"disk limit: job's directories hold {_past(disk, limits.disk)}"
            f" (set --disk-limit / {_ASK})"
        )
    return None


def explain_exit(
    limits: NodeLimits, rank: int, returncode: int, tail: Sequence[str], *, nproc: bool = False
) -> str | None:
    """The limit a rank's end shows it hit through an rlimit, or None: a file past
    RLIMIT_FSIZE (SIGXFSZ, or Python's "File too large"), an allocation refused under
    RLIMIT_DATA (MemoryError and its kin), a fork refused under RLIMIT_NPROC (`nproc`:
    it was set).

    Example:
        >>> limits = NodeLimits(memory=64 << 20, disk=8 << 20)
        >>> print(explain_exit(limits, 0, 1, ["OSError: [Errno 27] File too large"]))
        disk limit: rank 0 wrote a file past 8 MiB, the job's disk limit (set --disk-limit / ask the operator)
        >>> print(explain_exit(limits, 1, 1, ["MemoryError"]))
        memory limit: rank 1 could not allocate memory under the job's limit of 64 MiB (an allocation past 1.1 GiB, the limit plus 1 GiB of headroom, is refused at once; set --memory-limit / ask the operator)
        >>> explain_exit(NodeLimits(), 0, 1, ["MemoryError"]) is None
        True
    """
    if returncode == 0:
        return None
    text = "\n".join(tail[-20:])
    import signal

    xfsz = getattr(signal, "SIGXFSZ", None)
    if limits.disk is not None and (
        (xfsz is not None and returncode == -int(xfsz)) or "File too large" in text
    ):
        return (
            f"disk limit: rank {rank} wrote a file past {_size(limits.disk)}, the job's disk"
            f" limit (set --disk-limit / {_ASK})"
        )
    if limits.memory is not None and any(sign in text for sign in _MEMORY_SIGNS):
        return (
            f"memory limit: rank {rank} could not allocate memory under the job's limit of"
            f" {_size(limits.memory)} (an allocation past"
            f" {_size(limits.memory + DATA_HEADROOM)}, the limit plus 1 GiB of headroom, is"
            f" refused at once; set --memory-limit / {_ASK})"
        )
    if nproc and limits.processes is not None and "Resource temporarily unavailable" in text:
        return (
            f"process limit: rank {rank} could not start a process past the job's limit of"
            f" {limits.processes} (set --max-processes / {_ASK})"
        )
    return None


class LimitWatch:
    """The thread that watches one attempt's use against `limits`: `processes()` gives
    the attempt's live pids, `on_over(reason)` is called once when one is past, and the
    thread ends then, or once `done()` is true.

    Example:
        >>> hits = []
        >>> watch = LimitWatch(NodeLimits(processes=1), "n", lambda: [os.getpid()],
        ...                    hits.append, done=lambda: bool(hits))
        >>> watch.start(); watch.join(10); hits[0].startswith("process limit")
        True
    """

    def __init__(
        self,
        limits: NodeLimits,
        node: str,
        processes: Callable[[], list[int]],
        on_over: Callable[[str], None],
        *,
        done: Callable[[], bool],
    ) -> None:
        self.limits = limits
        self.node = node
        self._processes = processes
        self._on_over = on_over
        self._done = done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="air-limits", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        next_disk = time.monotonic() + (DISK_EVERY_S if self.limits.disk is not None else 1e18)
        while not (self._stop.is_set() or self._done()):
            usage = disk = None
            if self.limits.processes is not None or self.limits.memory is not None:
                usage = measure(self._processes())
            if time.monotonic() >= next_disk:
                began = time.monotonic()
                disk = disk_usage(self.limits.disk_dirs)
                took = time.monotonic() - began
                next_disk = time.monotonic() + max(DISK_EVERY_S, DISK_SCAN_FACTOR * took)
            reason = over(self.limits, usage, disk, self.node)
            if reason is not None:
                self._on_over(reason)
                return
            self._stop.wait(PROCESS_EVERY_S)
