"""How a gateway guards its door: the bind rule, Host allow-list, CORS origins, body caps
and rate limits. Pure data and one check; the middlewares that enforce them are in
`air_sdk.gateway.security`. Imports no server code, so the CLI stays light.

Example:
    >>> check_bind("127.0.0.1")
    >>> RequestLimits().user_rate
    RateLimit(per_s=50, burst=100)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_sdk.bundle import DEFAULT_MAX_BYTES
from air_sdk.errors import AirError

__all__ = [
    "LOOPBACK_HOSTS",
    "RateLimit",
    "RequestLimits",
    "SecurityOptions",
    "check_bind",
    "is_loopback",
]

#: Host header names every gateway answers to
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
KIB = 1 << 10
MIB = 1 << 20
#: checked with fullmatch (a `$` would also match before a trailing newline)
REPORT_PATH = re.compile(r"/v1/jobs/[^/]+/attempts/[^/]+/report")


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A token bucket: `per_s` requests a second on average, bursts of up to `burst`.

    Example:
        >>> RateLimit(per_s=50, burst=100).per_s
        50
    """

    #: sustained requests per second
    per_s: float
    #: requests allowed at once after an idle spell
    burst: int

    def __post_init__(self) -> None:
        if self.per_s <= 0 or self.burst < 1:
            raise ValueError(
                f"RateLimit(per_s={self.per_s}, burst={self.burst}): per_s must be > 0 and"
                " burst >= 1 (use None for no limit)"
            )


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """Caps on what one request may bring. Bodies over a cap get 413, callers over a
    rate 429 with Retry-After. None turns a rate limit off."""

    #: any JSON body not listed below (admin routes, cancel, ...): a few hundred bytes
    max_body_bytes: int = 64 * KIB
    #: POST /v1/jobs: a JobSpec with up to 1 MiB of inline code, JSON-escaped. Parsing
    #: holds the GIL for a time that grows with the size (many small keys: ~0.1 s/MiB
    #: on a quiet core), so the cap is what one request can cost everyone else
    max_submit_bytes: int = 2 * MIB
    #: worker reports: the runtime cuts reports near 1 MiB of lines plus up to 10k
    #: metric points (docs/benchmarks.md)
    max_report_bytes: int = 4 * MIB
    #: PUT /v1/bundles/{sha256}; the route also unpacks to check file counts and sizes
    max_bundle_bytes: int = DEFAULT_MAX_BYTES
    #: per user token (viewer, member, admin)
    user_rate: RateLimit | None = RateLimit(per_s=50, burst=100)
    #: per worker token: every rank of an attempt shares one and posts ~2 reports/s
    worker_rate: RateLimit | None = RateLimit(per_s=2000, burst=4000)
    #: per client address (an IPv6 one by its /64), for requests without a token (health
    #: checks) and for failed authentications (any number of guessed tokens: 401s)
    anonymous_rate: RateLimit | None = RateLimit(per_s=50, burst=100)

    def __post_init__(self) -> None:
        caps = (self.max_body_bytes, self.max_submit_bytes, self.max_report_bytes)
        if min(*caps, self.max_bundle_bytes) < 1024:
            raise ValueError("body caps must be at least 1024 bytes")

    def body_cap(self, method: str, path: str) -> tuple[int, str]:
        """(the byte cap for a request, what to do when over it)."""
        if method == "PUT" and path.startswith("/v1/bundles/"):
            return self.max_bundle_bytes, (
                "add large files to .airignore and read them from shared storage"
            )
        if method == "POST" and path == "/v1/jobs":
            return self.max_submit_bytes, (
                "put large inline code in a file and submit the file; pass data by path"
            )
        if method == "POST" and REPORT_PATH.fullmatch(path):
            return self.max_report_bytes, "send smaller batches"
        return self.max_body_bytes, "send a smaller body"

    def to_json(self) -> str:
        """For handing the limits to a detached gateway process."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RequestLimits:
        raw: dict[str, Any] = json.loads(text)
        for key in ("user_rate", "worker_rate", "anonymous_rate"):
            if raw.get(key) is not None:
                raw[key] = RateLimit(**raw[key])
        return cls(**raw)


@dataclass(frozen=True, kw_only=True)
class SecurityOptions:
    """What `install` puts around the app.

    Example:
        >>> SecurityOptions(allowed_hosts=("gpu-box.lan",)).all_hosts()[-1]
        'gpu-box.lan'
    """

    #: Host header names served besides LOOPBACK_HOSTS ("*.example.com" patterns work)
    allowed_hosts: tuple[str, ...] = ()
    #: browser origins allowed to call the API (CORS); none by default
    cors_origins: tuple[str, ...] = ()
    limits: RequestLimits = field(default_factory=RequestLimits)

    def all_hosts(self) -> list[str]:
        hosts = list(LOOPBACK_HOSTS)
        for host in self.allowed_hosts:
            name = host.strip().lower()
            if ":" in name and not name.startswith("["):
                name = f"[{name}]"  # an IPv6 literal, as a Host header writes it
            if name and name not in hosts:
                hosts.append(name)
        return hosts


# ---- the bind rule ----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """True for names and addresses only this machine can reach.

    Example:
        >>> is_loopback("localhost"), is_loopback("127.0.0.2"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(
    host: str,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    insecure_bind: bool = False,
) -> None:
    """Refuse to serve tokens in clear text beyond this machine.

    A loopback address is always fine. Any other needs TLS (`tls_cert` and `tls_key`,
    both readable files) or an explicit `insecure_bind` (e.g. behind a TLS-terminating
    proxy on a private network)."""
    if (tls_cert is None) != (tls_key is None):
        raise AirError("TLS needs both --tls-cert and --tls-key")
    for label, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not Path(path).is_file():
            raise AirError(f"{label} {path} is not a readable file")
    if is_loopback(host) or tls_cert is not None or insecure_bind:
        return
    raise AirError(
        f"refusing to listen on {host} without TLS: bearer tokens would cross the network"
        " in clear text. Pass --tls-cert and --tls-key, or --insecure-bind if a TLS proxy"
        " fronts the gateway on a network you trust (see docs/security.md)"
    )
