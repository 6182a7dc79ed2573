"""What runs inside the Ray actor of one node of a job: that node's NodeRunner.

`RayNodeAgent` is a plain class (Ray wraps it with `ray.remote` in
`air_sdk.runner.backends.ray`), so it imports no Ray and is testable as is. On its
node it unpacks the job's bundle (fetched from Ray's object store) into a
node-local temporary directory and hands each attempt to a `NodeRunner`
(`air_sdk.runner.node`), the same code that runs a local virtual node: it starts
the node's ranks with the env contract the gateway planned, watches them, writes
their exit records, dumps their stacks, stops them, and keeps warm interpreters
for the job's next attempt while the backend keeps this actor.

Ranks follow the bundle order (GROUP_RANK is the bundle index), so MASTER_ADDR is
the first bundle's node, where rank 0 runs, on a port that node picked.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import socket
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["RayNodeAgent", "scratch_dir", "use_runtime"]


def free_port() -> int:
    """A TCP port free on every interface of this node (rank 0's store binds it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def scratch_dir() -> Path:
    """Where node-local files go: Ray's temp dir when the node was given one (so they
    go with the Ray session's files), else the system's."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())


def use_runtime(data: bytes, sha256: str) -> Path:
    """Unpack the gateway's `air_sdk` (a zip sent through Ray's object store) once per
    node and put it first on this process's import path; returns its directory, which
    the ranks get first on PYTHONPATH.

    Example:
        >>> use_runtime(zip_bytes, sha)  # doctest: +SKIP
        PosixPath('/tmp/air-runtime-3f2a9c0d1b7e5a44')
    """
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError("the AIR runtime sent by the gateway arrived damaged (sha256 mismatch)")
    root = scratch_dir() / f"air-runtime-{sha256[:16]}"
    if not (root / "air_sdk").is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".air-runtime-", dir=root.parent))
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if name.startswith("/") or ".." in name.split("/"):
                    raise ValueError(f"unsafe path {name!r} in the AIR runtime")
            archive.extractall(staging)
        try:
            os.rename(staging, root)
        except OSError:  # another actor on this node got there first
            shutil.rmtree(staging, ignore_errors=True)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


class RayNodeAgent:
    """One node of a job: unpack the code, run each attempt's local ranks through a
    NodeRunner, report, stop; the backend may keep it for the job's next attempt.

    Example (what the Ray backend does through the actor):
        >>> agent = RayNodeAgent("job-1", "ray-0b4f9a61c2de")  # doctest: +SKIP
        >>> port = agent.prepare(bundle_bytes, sha256, None, "", launch)  # doctest: +SKIP
        >>> agent.start("10.0.0.1", port)  # doctest: +SKIP
        >>> agent.watch()  # blocks until a rank fails or all ended  # doctest: +SKIP
        (0, 'every rank exited 0', [RankExit(rank=0, exit_code=0, ...)])
    """

    def __init__(self, job_id: str, node: str) -> None:
        self.node = node
        self.workdir = Path(tempfile.mkdtemp(prefix=f"air-{job_id}-", dir=scratch_dir()))
        self.code_dir = self.workdir / "code"
        self._code_sha256 = ""
        self._runtime_root: str | None = None
        self._runner: Any = None
        self._launch: Any = None
        self._notes: list[str] = []

    # -- called by the backend (through Ray) ---------------------------------------------

    def prepare(
        self,
        bundle: bytes,
        sha256: str,
        runtime: bytes | None,
        runtime_sha256: str,
        launch: Any,
        uses_gpus: bool = False,
    ) -> int:
        """Get ready for `launch` (a `NodeLaunch` whose paths this node fills in): put
        AIR's runtime (`runtime`, a zip of `air_sdk` from the gateway) first on the
        import path, unpack the job code unless this node has it; returns a free port
        when this node hosts rank 0."""
        if runtime is not None:
            self._runtime_root = str(use_runtime(runtime, runtime_sha256))
        from air_sdk.bundle import unpack_bundle
        from air_sdk.runner.node.plan import localize

        if sha256 != self._code_sha256:
            shutil.rmtree(self.code_dir, ignore_errors=True)
            unpack_bundle(bundle, self.code_dir, expected_sha256=sha256)
            self._code_sha256 = sha256
            self._notes.append(f"code unpacked into {self.code_dir} (bundle {sha256[:12]})")
        else:
            self._notes.append(f"code of bundle {sha256[:12]} already here (a kept actor)")
        attempt_dir = self.workdir / f"attempt-{launch.attempt}"
        self._launch = localize(
            launch,
            cwd=str(self.code_dir),
            attempt_dir=str(attempt_dir),
            log_path=str(attempt_dir.with_suffix(".log")),
        )
        if self._runner is None:
            self._runner = self._new_runner(uses_gpus)
        return free_port() if launch.ranks and launch.ranks[0].rank == 0 else 0

    def _new_runner(self, uses_gpus: bool) -> Any:
        import air_sdk
        from air_sdk.runner.node.env import allowed_env
        from air_sdk.runner.node.runner import NodeRunner
        from air_sdk.schema import WorkerEnv

        # GPU jobs keep the devices Ray gave this actor; CPU jobs get none (the plan's "")
        keep = frozenset({WorkerEnv.env_name("cuda_visible_devices")} if uses_gpus else ())
        # The ranks must import the same air_sdk as this actor (Ray may have shipped it).
        root = str(Path(air_sdk.__file__).resolve().parent.parent)
        return NodeRunner(base_env=allowed_env(os.environ, keep=keep), python_path=[root])

    def start(self, master_addr: str, master_port: int) -> list[int]:
        """Start every local rank of the prepared attempt; returns their pids."""
        launch = self._launch
        Path(launch.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(launch.log_path, "a") as f:
            f.writelines(f"[air node {self.node}] {line}\n" for line in self._notes)
        self._notes = []
        pids = self._runner.start(launch, master=(master_addr, master_port))
        self._runner.note(f"MASTER_ADDR={master_addr}:{master_port}")
        return list(pids.values())

    def watch(
        self, timeout_s: float | None = None, started: Any = None
    ) -> tuple[int | None, str, list[Any]]:
        """Block until a rank fails or every rank ended: (exit status, what happened,
        the exit records (`RankExit`) of this node's ranks so far). (None, "", []) if
        `timeout_s` passed first. The records come with the verdict because they live on
        this node: the ranks' own reports of their exits reach the gateway later, so a
        runner that diagnosed the failure from those alone could find none yet and blame
        the node. `started`: the result of this attempt's `start()` call, passed as its
        ObjectRef so that Ray runs this watch after it (a kept actor serves calls
        concurrently: a watch that ran first would report the previous attempt's stop,
        "rank 0 was killed by SIGTERM")."""
        code, detail = self._runner.wait(timeout_s)
        return code, detail, self.exit_records() if code is not None else []

    def exit_records(self) -> list[Any]:
        """The `RankExit`s this attempt's ranks left on this node (`ATTEMPT_DIR/exits/`,
        each written before the verdict counts its rank); one that does not parse is
        skipped (the job writes that directory)."""
        from air_sdk.runner.node.records import exit_records, rank_exits

        if self._launch is None:
            return []
        return [e for e, _ in rank_exits(exit_records(Path(self._launch.attempt_dir)))]

    def stop(self, grace_s: float) -> list[str]:
        """SIGTERM every rank's process group, SIGKILL what is left after `grace_s`;
        returns the attempt log's last lines."""
        if self._runner is None:
            return list(self._notes)
        self._runner.stop(grace_s)
        return self.log_tail()

    def log_tail(self, num_lines: int = 20) -> list[str]:
        """The last lines of this attempt's output (the ranks' lines, prefixed, and ours)."""
        if self._runner is None or self._runner.launch is None:
            return self._notes[-num_lines:]
        return self._runner.log_tail(num_lines)

    def stacks(self) -> dict[int, str]:
        """Every live rank's Python stack on this node, by global rank (py-spy)."""
        return self._runner.stacks() if self._runner is not None else {}

    def failure_marks(self) -> list[str]:
        """The files this node's ranks left under `$AIR_ATTEMPT_DIR/failure-saves/`."""
        return self._runner.failure_marks() if self._runner is not None else []

    def close(self) -> None:
        """Stop what still runs, the warm interpreters too, and remove the node-local
        code and logs."""
        if self._runner is not None:
            self._runner.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
