"""Every exception AIR raises, in one tree.

```
AirError
├── ConfigError             settings or config file are wrong or missing
├── SpecError (ValueError)  a JobSpec is invalid; raised on the client, before upload
├── BundleError             packaging or unpacking job code
│   ├── BundleTooLargeError   over the size or file-count limit
│   └── UnsafeBundleError     absolute paths, "..", links out, devices
├── CheckpointError         a checkpoint could not be saved, committed or loaded
├── TransportError          the gateway could not be reached (after retries)
├── ApiError                the gateway answered with an error status
│   ├── AuthError             401: no token or a wrong one
│   ├── NotFoundError         404: no such job (or not yours)
│   ├── ConflictError         409: e.g. a stale attempt posting
│   ├── IdempotencyError      422: same Idempotency-Key, different body
│   └── RateLimitedError      429 after retries
├── JobFailedError          `Job.wait(raise_on_failure=True)` on a FAILED job
└── JobTimeoutError         `Job.wait(timeout=...)` ran out
```

Messages say what to change. Errors coming from the wire are translated in
exactly one place (`air_sdk.client._http`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AirError",
    "ApiError",
    "AuthError",
    "BundleError",
    "BundleTooLargeError",
    "CheckpointError",
    "ConfigError",
    "ConflictError",
    "IdempotencyError",
    "JobFailedError",
    "JobTimeoutError",
    "NotFoundError",
    "RateLimitedError",
    "SpecError",
    "TransportError",
    "UnsafeBundleError",
]


class AirError(Exception):
    """Base of every AIR error."""


class ConfigError(AirError):
    """Settings are missing or wrong (config file, env vars)."""


class SpecError(AirError, ValueError):
    """A JobSpec is invalid. Raised before anything is uploaded."""


class BundleError(AirError):
    """Packaging or unpacking job code failed."""


class BundleTooLargeError(BundleError):
    """The bundle is over the size or file-count limit."""


class UnsafeBundleError(BundleError):
    """An archive member would escape the target directory or is not a plain file."""


class CheckpointError(AirError):
    """A checkpoint could not be saved, committed or loaded; the message says what to change."""


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
    """A job ended FAILED (raised by `Job.wait(raise_on_failure=True)`)."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason


class JobTimeoutError(AirError):
    """`Job.wait(timeout=...)` ran out before the job ended."""
