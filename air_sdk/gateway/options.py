"""How a gateway guards its door: the bind rule, Host allow-list, CORS origins, body caps
and rate limits. Pure data and one check; the middlewares that enforce them are in
`air_sdk.gateway.security`. Imports no server code, so the CLI stays light. The caps
and rates (`RequestLimits`, `RateLimit`) are part of `GatewayOptions`, in
`air_sdk.gateway_config`, and re-exported here.

Example:
    >>> check_bind("127.0.0.1")
    >>> RequestLimits().user_rate
    RateLimit(per_s=50, burst=100)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from air_sdk.errors import AirError
from air_sdk.gateway_config import KIB as KIB
from air_sdk.gateway_config import MIB as MIB
from air_sdk.gateway_config import REPORT_PATH as REPORT_PATH
from air_sdk.gateway_config import RateLimit, RequestLimits

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
