"""Every exception AIR raises, in one tree.

```
AirError
├── ConfigError             settings or config file are wrong or missing
│   └── UnsafePathError       a path in a job's directory is a link, climbs out, or is
│                             not a regular file: the gateway refuses to follow it
├── SpecError (ValueError)  a JobSpec is invalid; raised on the client, before upload
│   └── CellCaptureError      a cell, or a function and its arguments, cannot travel
├── BundleError             packaging or unpacking job code
│   ├── BundleTooLargeError   over the size or file-count limit
│   └── UnsafeBundleError     absolute paths, "..", links out, devices
├── CheckpointError         a checkpoint could not be saved, committed or loaded
├── DataError               a data shard could not be found, fetched, cached or verified
│   └── ShardChecksumError    a shard's bytes do not match the sha256 its index gives
├── TransportError          the gateway could not be reached (after retries)
├── ApiError                the gateway answered with an error status
│   ├── AuthError             401: no token or a wrong one
│   ├── NotFoundError         404: no such job (or not yours)
│   ├── ConflictError         409: e.g. a stale attempt posting
│   ├── IdempotencyError      422: same Idempotency-Key, different body
│   └── RateLimitedError      429 after retries
├── JobFailedError          a job ended FAILED: `Job.wait(raise_on_failure=True)`,
│                           `Job.result()`, a call of an `@air_sdk.distributed` function
└── JobTimeoutError         `Job.wait(timeout=...)` ran out
```

Messages say what to change. Errors coming from the wire are translated in
exactly one place (`air_sdk.client._http`).

In IPython (notebooks, `%%air train`) an AIR error shows as its one line, not as a
traceback of the SDK's frames (`_render_traceback_`, as ipyparallel's `RemoteError`
does); a `JobFailedError` that carries a rank's traceback shows that traceback.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AirError",
    "ApiError",
    "AuthError",
    "BundleError",
    "BundleTooLargeError",
    "CellCaptureError",
    "CheckpointError",
    "ConfigError",
    "ConflictError",
    "DataError",
    "IdempotencyError",
    "JobFailedError",
    "JobTimeoutError",
    "NotFoundError",
    "RateLimitedError",
    "ShardChecksumError",
    "SpecError",
    "TransportError",
    "UnsafeBundleError",
    "UnsafePathError",
]


class AirError(Exception):
    """Base of every AIR error.

    Example:
        >>> AirError("raise --max-restarts")._render_traceback_()
        ['AirError: raise --max-restarts']
    """

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing a traceback: the message says what to
        # change, and the SDK's own frames would bury it.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(AirError):
    """Settings are missing or wrong (config file, env vars)."""


class UnsafePathError(ConfigError):
    """A path inside a directory a job can write is a symlink, climbs out with `..`, or
    is not the kind of file asked for; the gateway neither follows nor serves it
    (`air_sdk.runner.nofollow`)."""


class SpecError(AirError, ValueError):
    """A JobSpec is invalid. Raised before anything is uploaded."""


class CellCaptureError(SpecError):
    """A notebook cell, or a function with its arguments, cannot travel to the workers:
    it is not Python, or a value it uses cannot be pickled, is too large, or holds a
    secret. Raised before anything is uploaded; the message names the value and says
    what to do instead (see `air_sdk.notebook.capture`)."""


class BundleError(AirError):
    """Packaging or unpacking job code failed."""


class BundleTooLargeError(BundleError):
    """The bundle is over the size or file-count limit."""


class UnsafeBundleError(BundleError):
    """An archive member would escape the target directory or is not a plain file."""


class CheckpointError(AirError):
    """A checkpoint could not be saved, committed or loaded; the message says what to change."""


class DataError(AirError):
    """A data shard could not be found, fetched or kept in the cache (`air_sdk.runtime.data.
    storage`); the message names the shard and says what to change."""


class ShardChecksumError(DataError):
    """A shard's bytes do not match the sha256 given for it: the message names the shard,
    its URL, the expected and the actual checksum. Nothing of it was kept in the cache."""


class TransportError(AirError):
    """The gateway could not be reached, even after retries."""


class ApiError(AirError):
    """The gateway answered with an error status.

    Example:
        >>> ApiError(400, "nodes must be >= 1").status
        400
    """

    def __init__(self, status: int, message: str, *, body: Any = None) -> None:
        super().__init__(f"{message} (HTTP {status})")
        self.status = status
        self.message = message
        self.body = body


class AuthError(ApiError):
    """401: the token is missing or wrong."""


class NotFoundError(ApiError):
    """404: no such resource, or it belongs to someone else."""


class ConflictError(ApiError):
    """409: the request conflicts with the current state."""


class IdempotencyError(ApiError):
    """422 on submit: the Idempotency-Key was used before with another body."""


class RateLimitedError(ApiError):
    """429: still rate limited after retries."""


class JobFailedError(AirError):
    """A job ended FAILED (or CANCELLED under a waiting call).

    Raised by `Job.wait(raise_on_failure=True)`, `Job.result()` and calls of an
    `@air_sdk.distributed` function. When a rank raised a Python exception,
    `remote_traceback` holds its traceback as the rank printed it, `remote_type` the
    exception's class name and `rank` the rank; the message ends with the traceback
    (as Ray's task errors do), and IPython shows the remote traceback instead of the
    caller's frames.

    Example:
        >>> error = JobFailedError("j-1", "rank 1 raised ValueError: bad lr", rank=1,
        ...     remote_type="ValueError",
        ...     remote_traceback="ValueError: bad lr")
        >>> error._render_traceback_()[-1]
        'JobFailedError: job j-1 failed: rank 1 raised ValueError: bad lr'
    """

    def __init__(
        self,
        job_id: str,
        reason: str,
        *,
        remote_traceback: str | None = None,
        remote_type: str | None = None,
        rank: int | None = None,
    ) -> None:
        message = f"job {job_id} failed: {reason}"
        if remote_traceback:
            where = "" if rank is None else f" (rank {rank})"
            message += f"\n\nRemote traceback{where}:\n{remote_traceback.rstrip()}"
        super().__init__(message)
        self.job_id = job_id
        self.reason = reason
        self.remote_traceback = remote_traceback
        self.remote_type = remote_type
        self.rank = rank

    def _render_traceback_(self) -> list[str]:
        summary = f"{type(self).__name__}: job {self.job_id} failed: {self.reason}"
        if not self.remote_traceback:
            return [summary]
        where = "" if self.rank is None else f" on rank {self.rank}"
        return [
            f"Remote traceback{where}:",
            *self.remote_traceback.rstrip("\n").splitlines(),
            "",
            summary,
        ]


class JobTimeoutError(AirError):
    """`Job.wait(timeout=...)` ran out before the job ended."""
