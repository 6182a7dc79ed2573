"""How a gateway runs: `GatewayOptions`, one pydantic-settings model.

Every option is one field, declared once with its type, default and help; the rest
follows from it:

- `air gateway start` has one flag per field (`air_sdk.cli.gateway`; the flag is
  `--field-name` unless a `Flag` says otherwise, and `Flag(hidden=True)` keeps a
  field off the command line);
- a detached gateway gets its options as JSON in `$AIR_GATEWAY_OPTIONS`
  (`air_sdk.client.local_gateway` writes it, `python -m air_sdk.gateway.server`
  reads it), never as argv;
- a gateway started without that variable reads `AIR_GATEWAY_<FIELD>` env vars
  (e.g. `AIR_GATEWAY_PORT=9000`), like the client's `AIR_*` settings in
  `air_sdk.config`.

Pure data: imports no server code, so the CLI and the client's local-gateway
helper use it freely.

Example:
    >>> opts = GatewayOptions(port=9001, home=Path("/tmp/air"), num_nodes=3)
    >>> opts.url
    'http://127.0.0.1:9001'
    >>> GatewayOptions.model_validate_json(opts.model_dump_json()) == opts
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from air_sdk.config import DEFAULT_PORT, air_home

__all__ = [
    "LOG_FILE",
    "OPTIONS_ENV",
    "STATE_FILE",
    "TOKEN_FILE",
    "Flag",
    "GatewayOptions",
    "RateLimit",
    "RequestLimits",
]

#: files a gateway keeps in its home: the embedded admin token, its pid and URL, its log
TOKEN_FILE = "token"
STATE_FILE = "gateway.json"
LOG_FILE = "gateway.log"
#: the env var that hands a detached gateway its options (GatewayOptions as JSON)
OPTIONS_ENV = "AIR_GATEWAY_OPTIONS"

KIB = 1 << 10
MIB = 1 << 20
#: the bundle cap when none is set (air_sdk.bundle.DEFAULT_MAX_BYTES; not imported here
#: so the CLI stays light; tests/unit/test_gateway_config.py checks they agree)
DEFAULT_MAX_BUNDLE_BYTES = 512 * MIB
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
    rate 429 with Retry-After. None turns a rate limit off.

    Example:
        >>> RequestLimits().user_rate
        RateLimit(per_s=50, burst=100)
    """

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
    max_bundle_bytes: int = DEFAULT_MAX_BUNDLE_BYTES
    #: per user token (viewer, member, admin)
    user_rate: RateLimit | None = RateLimit(per_s=50, burst=100)
    #: per worker token: every rank of an attempt shares one and posts ~2 reports/s
    worker_rate: RateLimit | None = RateLimit(per_s=2000, burst=4000)
    #: per client address (an IPv6 one by its /64), for requests without a token (health
    #: checks) and for failed authentications (any number of guessed tokens: 401s)
    anonymous_rate: RateLimit | None = RateLimit(per_s=50, burst=100)
    #: event streams (`/events/stream`) one tenant may hold open at once; one more is
    #: refused with 429 (`air_sdk.gateway.streams`). None: no cap
    max_streams_per_tenant: int | None = 64
    #: ... and one token (a CLI follow or a notebook monitor holds one each)
    max_streams_per_token: int | None = 32

    def __post_init__(self) -> None:
        caps = (self.max_body_bytes, self.max_submit_bytes, self.max_report_bytes)
        if min(*caps, self.max_bundle_bytes) < 1024:
            raise ValueError("body caps must be at least 1024 bytes")
        for cap in (self.max_streams_per_tenant, self.max_streams_per_token):
            if cap is not None and cap < 1:
                raise ValueError("stream caps must be at least 1 (None: no cap)")

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


@dataclass(frozen=True)
class Flag:
    """How a `GatewayOptions` field looks on `air gateway start` (when not `--field-name`).

    Example:
        >>> Flag("--nodes", metavar="N").name
        '--nodes'
    """

    #: the flag; None: `--` + the field name with dashes
    name: str | None = None
    metavar: str | None = None
    #: a file that must exist when given (checked before anything starts)
    must_exist: bool = False
    #: no flag: set through the env, JSON or the Python API only
    hidden: bool = False


class GatewayOptions(BaseSettings):
    """How to run a gateway (one field = one option; see the module docstring).

    A loopback `host` is always allowed; any other needs `tls_cert` + `tls_key` or an
    explicit `insecure_bind` (`air_sdk.gateway.options.check_bind`).

    Example:
        >>> GatewayOptions(host="0.0.0.0", port=8470, insecure_bind=True).worker_url
        'http://127.0.0.1:8470'
    """

    model_config = SettingsConfigDict(env_prefix="AIR_GATEWAY_", frozen=True, extra="forbid")

    host: str = Field(
        "127.0.0.1",
        description="Address to bind. Anything but loopback needs --tls-cert/--tls-key"
        " or --insecure-bind.",
    )
    port: Annotated[int, Flag(metavar="PORT")] = Field(
        DEFAULT_PORT, ge=1, le=65535, description="Port to listen on."
    )
    home: Annotated[Path, Flag(metavar="DIR")] = Field(
        default_factory=air_home,
        description="Where the gateway keeps its database, bundles and jobs"
        " (default: $AIR_HOME or ~/.local/share/air).",
    )
    num_nodes: Annotated[int, Flag("--nodes", metavar="N")] = Field(
        2, ge=1, description="Virtual nodes to split this machine into."
    )
    slots_per_node: Annotated[int | None, Flag(metavar="N")] = Field(
        None,
        ge=1,
        description="Rank slots per virtual node (default: the node's GPUs, or on a CPU"
        " machine all its cores, shared by the nodes: one rank per core in all).",
    )
    oversubscribe: bool = Field(
        False,
        description="Let this machine's CPU virtual nodes run more ranks at once than it has"
        " cores (ranks then share cores; warned at start and on each job placed so)."
        " Default: one rank per core across the virtual nodes.",
    )
    write_client_config: Annotated[bool, Flag(hidden=True)] = Field(
        True, description="Write ~/.config/air/config.toml with this gateway's URL and token."
    )
    tls_cert: Annotated[Path | None, Flag(metavar="FILE", must_exist=True)] = Field(
        None, description="PEM certificate: serve HTTPS."
    )
    tls_key: Annotated[Path | None, Flag(metavar="FILE", must_exist=True)] = Field(
        None, description="PEM private key of --tls-cert."
    )
    insecure_bind: bool = Field(
        False,
        description="Serve plain HTTP on a non-loopback --host (only behind a TLS proxy).",
    )
    allowed_hosts: Annotated[tuple[str, ...], Flag("--allow-host", metavar="NAME")] = Field(
        (), description="Host header name to serve besides loopback and --host (repeat)."
    )
    cors_origins: Annotated[tuple[str, ...], Flag("--cors-origin", metavar="ORIGIN")] = Field(
        (), description="Browser origin allowed to call the API (repeat); none by default."
    )
    trusted_proxies: Annotated[tuple[str, ...], Flag("--trust-proxy", metavar="ADDR")] = Field(
        (),
        description="Address of a reverse proxy whose X-Forwarded-For is believed (repeat);"
        " none by default, so a caller cannot pick the address its rate limit is keyed by.",
    )
    max_log_bytes_per_job: int = Field(
        128 * MIB,
        ge=0,
        description="Bytes of log lines one job may keep; past it the oldest are dropped and"
        " the job gets an alert event. 0: no quota.",
    )
    max_metric_bytes_per_job: int = Field(
        256 * MIB,
        ge=0,
        description="Bytes of metric points one job may keep (as for logs). 0: no quota.",
    )
    limits: Annotated[RequestLimits, Flag(hidden=True)] = Field(
        default_factory=RequestLimits,
        description="Body caps and rate limits (users, workers, anonymous callers).",
    )
    cluster_file: Annotated[Path | None, Flag("--cluster", metavar="FILE", must_exist=True)] = (
        Field(
            None,
            description="Cluster TOML: pools, tenant quotas and weights, scheduler switches"
            " (docs/scheduling.md).",
        )
    )
    job_files_max_age_days: Annotated[float | None, Flag(metavar="DAYS")] = Field(
        7.0,
        ge=0,
        description="Delete the files of jobs that ended longer ago (code copy, attempt logs;"
        " checkpoints under the job only with --job-files-include-checkpoints); their"
        " records and logs stay. Checked hourly.",
    )
    job_files_max_gib: Annotated[float | None, Flag(metavar="GIB")] = Field(
        None,
        ge=0,
        description="Keep the files of ended jobs under this many GiB, deleting the"
        " oldest first (default: no cap).",
    )
    job_files_include_checkpoints: bool = Field(
        False,
        description="Let retention and `air gc` delete the checkpoints kept under an ended"
        " job's directory too (default: they stay, for resumes and `air checkpoints export`).",
    )
    backend: Literal["local", "ray"] = Field(
        "local",
        description="Where jobs run: 'local' (this machine) or 'ray' (a Ray cluster,"
        " docs/scaling-out.md).",
    )
    ray_address: Annotated[str | None, Flag(metavar="ADDRESS")] = Field(
        None, description="Ray cluster to join with --backend ray (default: $RAY_ADDRESS)."
    )
    sandbox: Literal["auto", "bwrap", "unshare", "off"] = Field(
        "auto",
        description="How local ranks are kept from the gateway's files (token, database,"
        " other jobs' secrets) and other jobs' processes: 'bwrap', 'unshare' (mount + pid"
        " namespaces), 'auto' (bwrap, else unshare, on Linux) or 'off' (docs/security.md).",
    )
    sandbox_binds: Annotated[tuple[Path, ...], Flag("--sandbox-bind", metavar="DIR")] = Field(
        (),
        description="Directory every sandboxed job may write besides its own (shared data or"
        " outputs; repeat). The rest of the filesystem is read-only to jobs.",
    )
    allowed_data_roots: Annotated[tuple[Path, ...], Flag("--allowed-data-root", metavar="DIR")] = (
        Field(
            (),
            description="Directory under which sandboxed jobs may name their own output_dir or"
            " checkpoint.dir, each tenant's under DIR/<tenant>/ (repeat; default: none, they stay"
            " under the job's directory in the home). Never the home or an ancestor of it"
            " (docs/security.md).",
        )
    )
    shared_data_roots: Annotated[tuple[Path, ...], Flag("--shared-data-root", metavar="DIR")] = (
        Field(
            (),
            description="Like --allowed-data-root, but every tenant's jobs may name any directory"
            " in it, other tenants' included (repeat; for a machine whose tenants share data).",
        )
    )
    export_uris: Annotated[tuple[str, ...], Flag("--export-uri", metavar="PREFIX")] = Field(
        (),
        description="MLflow tracking server a job may export to (`--export mlflow=URI`): a URI"
        " prefix (repeat). Default none: jobs export to a SQLite store the gateway keeps, and"
        " no job makes the gateway call a server of its choosing.",
    )
    max_preemption_grace_s: Annotated[float, Flag(metavar="SECONDS")] = Field(
        120.0,
        ge=0,
        description="Cap on a job's failure.preemption_grace_s (SIGTERM to SIGKILL when"
        " preempted): a submit above it is refused. `air cancel` of a job in its grace"
        " kills it 10 s after the cancel whatever its grace.",
    )
    max_job_memory: Annotated[str | None, Flag(metavar="SIZE")] = Field(
        None,
        description="Cap on a job's --memory-limit (all its processes on a node, e.g. 16GiB):"
        " a submit above it is refused, a job without a limit runs under it (docs/security.md).",
    )
    max_job_processes: Annotated[int | None, Flag(metavar="N")] = Field(
        None,
        ge=1,
        description="Cap on a job's --max-processes (processes and threads on a node), as"
        " for --max-job-memory.",
    )
    max_job_disk: Annotated[str | None, Flag(metavar="SIZE")] = Field(
        None,
        description="Cap on a job's --disk-limit (bytes under its writable directories), as"
        " for --max-job-memory.",
    )
    node_probe: Annotated[str | None, Flag(metavar="CMD")] = Field(
        None,
        description="Node health probe run on every node periodically and on a node a job"
        " just failed on: 'builtin' (a Python process starts; with GPUs, NVML answers) or a"
        " command line (exit 0: healthy; gets AIR_NODE_NAME, CUDA_VISIBLE_DEVICES). A failure"
        " keeps the node out of placements until the probe passes. Local backend only.",
    )
    node_probe_interval_s: Annotated[float, Flag(metavar="SECONDS")] = Field(
        60.0, gt=0, description="How often --node-probe runs on every node."
    )
    allow_unsandboxed_tenants: bool = Field(
        False,
        description="Serve more than one tenant on the local backend although its ranks run"
        " unsandboxed (any job can then read every tenant's secrets).",
    )
    metrics_from_loopback: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Answer /metrics without a token to a peer at 127.0.0.1 or ::1. auto: only"
        " when the gateway binds a loopback address and trusts no proxy (a proxy on this host"
        " would make remote clients look local); any local user can then read it.",
    )
    header_timeout_s: Annotated[float, Flag(metavar="SECONDS")] = Field(
        10.0,
        gt=0,
        description="Close a connection whose request headers are not complete this many"
        " seconds after it opened or after its previous answer (slowloris).",
    )
    max_connections_per_address: Annotated[int, Flag(metavar="N")] = Field(
        256,
        ge=1,
        description="Connections one client address may hold; past it the address's oldest"
        " connection still waiting for its headers is closed, or the new one is refused.",
    )

    @property
    def url(self) -> str:
        """Where clients reach it."""
        scheme = "https" if self.tls_cert else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def metrics_without_token(self) -> bool:
        """Whether /metrics answers a loopback peer without a token (`metrics_from_loopback`).

        Example:
            >>> GatewayOptions().metrics_without_token
            True
            >>> GatewayOptions(host="0.0.0.0", insecure_bind=True).metrics_without_token
            False
        """
        if self.metrics_from_loopback != "auto":
            return self.metrics_from_loopback == "on"
        from ipaddress import ip_address

        host = self.host.strip("[]")
        try:
            loopback = host == "localhost" or ip_address(host).is_loopback
        except ValueError:
            loopback = False
        return loopback and not self.trusted_proxies

    @property
    def worker_url(self) -> str:
        """Where this machine's workers report: loopback when bound to every address."""
        if self.host in ("0.0.0.0", "::"):
            return self.model_copy(update={"host": "127.0.0.1"}).url
        return self.url

    @classmethod
    def flag_of(cls, name: str) -> Flag:
        """The `Flag` of field `name` (a default one when the field declares none).

        Example:
            >>> GatewayOptions.flag_of("num_nodes").name, GatewayOptions.flag_of("host").name
            ('--nodes', None)
        """
        flags = [m for m in cls.model_fields[name].metadata if isinstance(m, Flag)]
        return flags[0] if flags else Flag()
