"""Secret env values of jobs, kept out of the control-plane database.

A job's spec is stored in SQLite with every secret env value (see
`air_sdk.redact.is_secret_env`) replaced by `REDACTED`; the real values live here,
one JSON file per job, mode 0600 in a 0700 directory beside the database, and
are merged back when the store hands a job to the runner. So a copied database
file, a backup or a `.dump` pasted into a bug report carries no secret, and the
files go as soon as the job ends: nothing launches it again. The values stay in
memory a little longer (`retire`), for scrubbing the reports the gateway still
accepts from the ranks that just ended.

An in-memory store (`":memory:"`) keeps them in a dict.

Example:
    >>> vault = SecretEnvStore(None)
    >>> vault.put("j-1", {"API_KEY": "k"})
    >>> vault.get("j-1")
    {'API_KEY': 'k'}
    >>> vault.delete("j-1"); vault.get("j-1")
    {}
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from air_sdk.schema.names import JOB_ID, is_valid

__all__ = ["SecretEnvStore"]


class SecretEnvStore:
    """Per-job secret env values: files under `root` (None: in memory only), cached."""

    def __init__(self, root: Path | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, str]] = {}
        #: ended jobs: the values, in memory only, until the clock passes the deadline
        self._retired: dict[str, tuple[dict[str, str], float]] = {}

    def _path(self, job_id: str) -> Path:
        if self.root is None or not is_valid(JOB_ID, job_id) or job_id.startswith("."):
            raise ValueError(f"job id {job_id!r} cannot name a secrets file")
        return self.root / f"{job_id}.json"

    def put(self, job_id: str, values: dict[str, str]) -> None:
        """Keep `values` for `job_id` (written before the job row, so a crash between
        leaves an orphan file, never a job without its secrets)."""
        if not values:
            return
        with self._lock:
            self._cache[job_id] = dict(values)
            if self.root is None:
                return
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = self._path(job_id)
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(values, f)
            os.replace(tmp, path)

    def get(self, job_id: str) -> dict[str, str]:
        """The secret values of `job_id`; {} when it has none (or they were deleted)."""
        with self._lock:
            cached = self._cache.get(job_id)
            if cached is not None:
                return dict(cached)
            if self.root is None or job_id in self._retired:
                return {}
            try:
                values = json.loads(self._path(job_id).read_text())
            except (OSError, ValueError):
                # Most jobs have no secrets: remember that, or every worker report of
                # theirs would try to open a file that does not exist.
                self._cache[job_id] = {}
                return {}
            if not isinstance(values, dict):
                return {}
            self._cache[job_id] = {str(k): str(v) for k, v in values.items()}
            return dict(self._cache[job_id])

    def to_scrub(self, job_id: str) -> dict[str, str]:
        """The values to scrub from what `job_id` posts: its secrets, or an ended job's
        while they are kept in memory (`retire`).

        Example:
            >>> vault = SecretEnvStore(None)
            >>> vault.put("j-2", {"HF_TOKEN": "hf-1234"}); vault.retire("j-2", keep_s=10)
            >>> vault.get("j-2"), vault.to_scrub("j-2")
            ({}, {'HF_TOKEN': 'hf-1234'})
        """
        with self._lock:
            retired = self._retired.get(job_id)
            if retired is not None:
                if self._clock() < retired[1]:
                    return dict(retired[0])
                del self._retired[job_id]
                return {}
        return self.get(job_id)

    def retire(self, job_id: str, keep_s: float) -> None:
        """The job ended: delete its file now, keep its values in memory `keep_s` more
        seconds (for scrubbing late reports), then forget them."""
        with self._lock:
            now = self._clock()
            for stale in [j for j, (_, until) in self._retired.items() if until <= now]:
                del self._retired[stale]
            values = self._cache.get(job_id)
        if values is None:
            values = self.get(job_id)
        self.delete(job_id)
        with self._lock:
            # No longer launchable (`get` says {}), but still scrubbed (`to_scrub`).
            self._retired[job_id] = (values, now + keep_s)

    def delete(self, job_id: str) -> None:
        """Forget the secrets of an ended job, at once."""
        with self._lock:
            self._cache.pop(job_id, None)
            self._retired.pop(job_id, None)
            if self.root is not None:
                try:
                    self._path(job_id).unlink(missing_ok=True)
                except (OSError, ValueError):
                    pass
