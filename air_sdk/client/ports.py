"""A local gateway's port: is it free, who holds it, which one to use instead.

A gateway must never believe it started when its port belongs to someone else
(another user's gateway answering /v1/health there would look like its own). So
the port is bound before anything else happens (`listen_socket`), and a taken port
is reported with its holder (`port_holder`): a process of this user by name and
pid, an AIR gateway by what it answers, else "another process" (Linux hides the
pids of other users' sockets). When no port was asked for (neither `--port` nor
`AIR_GATEWAY_PORT`), `choose_port` moves to the next free one and says so.

Example:
    >>> import socket
    >>> with socket.socket() as taken:
    ...     taken.bind(("127.0.0.1", 0)); taken.listen()
    ...     port = taken.getsockname()[1]
    ...     port_is_free("127.0.0.1", port)
    False
"""

from __future__ import annotations

import errno
import socket
import time
import warnings
from dataclasses import dataclass

import psutil
import requests

from air_sdk.errors import ConfigError
from air_sdk.gateway_config import GatewayOptions
from air_sdk.procs import alive

__all__ = [
    "PORT_SEARCH",
    "PortChoice",
    "bind_or_explain",
    "choose_port",
    "listen_socket",
    "port_holder",
    "port_is_free",
    "port_taken_error",
]

#: how many ports after the default one are tried when it is taken and none was asked for
PORT_SEARCH = 50
#: markers of a gateway process on its command line
_GATEWAY_CMDLINE = ("air_sdk.gateway.server", "air gateway start")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), as uvicorn binds one (SO_REUSEADDR, so a port
    in TIME_WAIT after a restart is not "taken"). Raises OSError when it is taken.

    Example:
        >>> sock = listen_socket("127.0.0.1", 0)
        >>> sock.getsockname()[1] > 0
        True
        >>> sock.close()
    """
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def port_is_free(host: str, port: int) -> bool:
    """False when something else holds (host, port); True otherwise (a bind that fails
    for another reason, such as a port below 1024, is reported by the bind itself).

    Example:
        >>> port_is_free("127.0.0.1", 0)
        True
    """
    try:
        listen_socket(host, port).close()
    except OSError as exc:
        return exc.errno != errno.EADDRINUSE
    return True


def _describe_process(pid: int) -> str | None:
    try:
        proc = psutil.Process(pid)
        name, user = proc.name(), proc.username()
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    if any(marker in cmdline for marker in _GATEWAY_CMDLINE):
        return f"an AIR gateway (pid {pid}, user {user})"
    return f"{name} (pid {pid}, user {user})"


def _answers_as_gateway(host: str, port: int) -> bool:
    """True when what listens there answers /v1/health like an AIR gateway."""
    connect = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    connect = f"[{connect}]" if ":" in connect else connect
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a self-signed certificate is fine for this question
        for scheme in ("http", "https"):
            try:
                answer = requests.get(
                    f"{scheme}://{connect}:{port}/v1/health", timeout=0.5, verify=False
                )
                body = answer.json()
            except requests.Timeout:
                return False  # it takes connections but says nothing: not a gateway
            except (requests.RequestException, ValueError):
                continue  # e.g. plain HTTP to a TLS port: try the other scheme
            if isinstance(body, dict) and "version" in body:
                return True
    return False


def _listeners(port: int) -> list[int | None]:
    """The pids listening on `port` (None where the kernel hides whose socket it is);
    empty where sockets cannot be listed (macOS: only root may list every one)."""
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    return [
        c.pid
        for c in connections
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    ]


def port_holder(host: str, port: int) -> str:
    """Who listens on `port`: a process of this user by name, pid and user; an AIR
    gateway (also another user's: it answers /v1/health); else "another process".

    Example:
        >>> import socket
        >>> with socket.socket() as taken:
        ...     taken.bind(("127.0.0.1", 0)); taken.listen()
        ...     port_holder("127.0.0.1", taken.getsockname()[1]).endswith(f"user {psutil.Process().username()})")
        True
    """
    for pid in _listeners(port)[:1]:
        if pid is not None:
            described = _describe_process(pid)
            if described is not None:
                return described
    if _answers_as_gateway(host, port):
        return "an AIR gateway of another user or home (it answers /v1/health there)"
    return "another process"


@dataclass(frozen=True)
class PortChoice:
    """The options to start with, and, when the default port was taken and another one
    picked, who holds the default one.

    Example:
        >>> PortChoice(GatewayOptions(port=8471), moved_from=8470, taken_by="x").note
        'port 8470 is taken by x; using 8471 instead (choose one with --port)'
    """

    opts: GatewayOptions
    moved_from: int | None = None
    taken_by: str | None = None

    @property
    def note(self) -> str:
        """What to tell the user ("" when the port asked for or the default was free)."""
        if self.moved_from is None:
            return ""
        return (
            f"port {self.moved_from} is taken by {self.taken_by}; using {self.opts.port}"
            " instead (choose one with --port)"
        )


def port_taken_error(host: str, port: int, holder: str) -> ConfigError:
    """The error for a port that was asked for and is taken: who holds it, what to do."""
    suggestion = _next_free(host, port)
    example = f", e.g. --port {suggestion}" if suggestion else ""
    return ConfigError(
        f"port {port} is taken by {holder}: choose another with --port"
        f" (or AIR_GATEWAY_PORT){example}"
    )


def _next_free(host: str, port: int) -> int | None:
    for candidate in range(port + 1, min(port + 1 + PORT_SEARCH, 65536)):
        try:
            listen_socket(host, candidate).close()
        except OSError:
            continue
        return candidate
    return None


#: how long a port held only by exiting processes (a gateway just SIGKILLed, still
#: being torn down, or a zombie not yet reaped) may take to come free
EXITING_HOLDER_WAIT_S = 15.0


def _held_only_by_exiting(port: int) -> bool:
    """Whether every process listening on `port` is on its way out (its pid known)."""
    pids = set(_listeners(port))
    if not pids or None in pids:
        return False
    return not any(alive(pid) for pid in pids if pid is not None)


def _free_once_holder_exits(host: str, port: int) -> bool:
    """Wait while the port's holders are exiting; True once the port is free."""
    deadline = time.monotonic() + EXITING_HOLDER_WAIT_S
    while _held_only_by_exiting(port) and time.monotonic() < deadline:
        time.sleep(0.05)
        if port_is_free(host, port):
            return True
    return port_is_free(host, port)


def choose_port(opts: GatewayOptions) -> PortChoice:
    """`opts` when its port is free; when it is taken: a `ConfigError` naming the holder
    if the port was asked for (`--port`, `AIR_GATEWAY_PORT`), else the next free port
    after it (then `PortChoice.note` says so).

    Example:
        >>> probe = listen_socket("127.0.0.1", 0); port = probe.getsockname()[1]; probe.close()
        >>> choice = choose_port(GatewayOptions(port=port))
        >>> choice.opts.port == port, choice.note
        (True, '')
    """
    if port_is_free(opts.host, opts.port) or _free_once_holder_exits(opts.host, opts.port):
        return PortChoice(opts)  # a gateway restarted right after a kill gets its port
    holder = port_holder(opts.host, opts.port)
    if "port" in opts.model_fields_set:
        raise port_taken_error(opts.host, opts.port, holder)
    free = _next_free(opts.host, opts.port)
    if free is None:
        raise port_taken_error(opts.host, opts.port, holder)
    moved = opts.model_copy(update={"port": free})
    return PortChoice(moved, moved_from=opts.port, taken_by=holder)


def bind_or_explain(opts: GatewayOptions) -> socket.socket:
    """The gateway's listening socket for `opts`, or a `ConfigError` naming who holds
    the port (a bind that fails for another reason says that reason).

    Example:
        >>> probe = listen_socket("127.0.0.1", 0); port = probe.getsockname()[1]; probe.close()
        >>> sock = bind_or_explain(GatewayOptions(port=port))
        >>> sock.getsockname()[1] == port
        True
        >>> sock.close()
    """
    try:
        return listen_socket(opts.host, opts.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise port_taken_error(
                opts.host, opts.port, port_holder(opts.host, opts.port)
            ) from None
        if exc.errno == errno.EACCES:
            raise ConfigError(
                f"cannot listen on port {opts.port}: ports below 1024 need root;"
                " choose another with --port"
            ) from None
        raise ConfigError(
            f"cannot listen on {opts.host}:{opts.port}: {exc.strerror or exc};"
            " check --host and --port"
        ) from None
