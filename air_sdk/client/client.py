"""`Client`: talks to one gateway. Submits jobs and reads the cluster.

Examples marked `+SKIP` need a running gateway (`air gateway start`).

Example:
    >>> client = Client("http://127.0.0.1:8470", token="air_...")  # doctest: +SKIP
    >>> job = client.submit_script("train.py", nodes=2, args=["--epochs", "3"])  # doctest: +SKIP
    >>> job.wait().state  # doctest: +SKIP
    <JobState.SUCCEEDED: 'SUCCEEDED'>
"""

from __future__ import annotations

import re
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Unpack
from urllib.parse import quote

import requests
from pydantic import BaseModel, ValidationError

from air_sdk.client._http import HttpTransport, parse_model
from air_sdk.client.admin import Admin
from air_sdk.client.job import Job
from air_sdk.client.options import JobOptions, job_spec_fields
from air_sdk.config import load_client_settings, token_refused_message
from air_sdk.errors import SpecError
from air_sdk.schema.api import Health, Inventory, JobList, JobRecord
from air_sdk.schema.slo import SloReport
from air_sdk.schema.spec import JobSpec
from air_sdk.schema.state import JobState

__all__ = ["Client", "default_workdir", "format_validation_error", "job_spec", "validation_errors"]

_M = TypeVar("_M", bound=BaseModel)
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def _user_agent() -> str:
    from air_sdk import __version__

    return f"air-sdk/{__version__}"


def format_validation_error(exc: ValidationError) -> str:
    """One "field: message" line per pydantic error, for a `SpecError`.

    Example:
        >>> try:
        ...     JobSpec(entrypoint="train.py", max_restarts=-1)
        ... except ValidationError as exc:
        ...     print(format_validation_error(exc))
        max_restarts: Input should be greater than or equal to 0
    """
    return "\n".join(f"{loc}: {msg}" if loc else msg for loc, msg, _ in validation_errors(exc))


def validation_errors(exc: ValidationError) -> list[tuple[str, str, Any]]:
    """(dotted field, message, pydantic's error) for each error of `exc`.

    Example:
        >>> try:
        ...     JobSpec(entrypoint="train.py", max_restarts=-1)
        ... except ValidationError as exc:
        ...     [(loc, msg) for loc, msg, _ in validation_errors(exc)]
        [('max_restarts', 'Input should be greater than or equal to 0')]
    """
    return [
        (
            ".".join(str(p) for p in err.get("loc", ())),
            str(err.get("msg", "invalid")).removeprefix("Value error, "),
            err,
        )
        for err in exc.errors()
    ]


def job_spec(**fields: Any) -> JobSpec:
    """Build a `JobSpec` from user input, raising `SpecError` that names each bad field.

    Example:
        >>> job_spec(entrypoint="train.py", resources={"nodes": 2}).resources.nodes
        2
        >>> job_spec(entrypoint="train.py", max_restarts=-1)
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: invalid job spec:
        max_restarts: Input should be greater than or equal to 0
    """
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:
        raise SpecError(f"invalid job spec:\n{format_validation_error(exc)}") from exc


def check_syntax(script: Path) -> None:
    """A `SpecError` saying where a Python script's syntax error is, with the user's own
    path and line, before anything is uploaded (the job would fail on every rank).

    Example:
        >>> import tempfile
        >>> bad = Path(tempfile.mkdtemp()) / "train.py"; _ = bad.write_text("for x in y:")
        >>> check_syntax(bad)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        air_sdk.errors.SpecError: .../train.py, line 1: ...
    """
    if script.suffix != ".py":
        return
    try:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}"
        code = (exc.text or "").rstrip()
        shown = f"\n    {code.strip()}" if code else ""
        version = ".".join(map(str, sys.version_info[:2]))
        raise SpecError(
            f"{where}: {exc.msg} (checked with Python {version}; fix it and submit again){shown}"
        ) from None


def default_workdir(script: str | Path | None) -> Path:
    """What `submit_script` bundles without a workdir: the working directory when the
    script lies inside it (or for a module), else the script's own directory.

    Example:
        >>> default_workdir(None) == Path.cwd().resolve()
        True
    """
    cwd = Path.cwd().resolve()
    if script is None:
        return cwd
    script_path = Path(script).expanduser().resolve()
    return cwd if script_path.is_relative_to(cwd) else script_path.parent


def _default_name(script: Path) -> str:
    name = _NAME_BAD_CHARS.sub("-", script.stem).strip("-._")[:63]
    return name or "job"


class Client:
    """A connection to an AIR gateway.

    Settings come from the arguments, then `AIR_*` env vars, then
    `~/.config/air/config.toml` (written by `air gateway start`).
    Transport errors and 429/502/503/504 are retried with jittered exponential
    backoff (honouring Retry-After) up to `max_attempts` tries in all.

    Example:
        >>> client = Client()  # doctest: +SKIP
        >>> client.health().version  # doctest: +SKIP
        '0.1.0'
    """

    def __init__(
        self,
        gateway_url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float | None = None,
        session: requests.Session | None = None,
        max_attempts: int = 6,
    ) -> None:
        settings = load_client_settings(gateway_url=gateway_url, token=token, timeout_s=timeout_s)
        self.gateway_url = settings.gateway_url
        self._http = HttpTransport(
            settings.gateway_url,
            token=settings.token,
            timeout_s=settings.timeout_s,
            session=session,
            max_attempts=max_attempts,
            user_agent=_user_agent(),
            auth_message=token_refused_message(
                settings.gateway_url, settings.token, explicit=bool(token)
            ),
        )

    def __repr__(self) -> str:
        return f"Client({self.gateway_url!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session (connections are pooled until then)."""
        self._http.close()

    # -- reads ---------------------------------------------------------------

    def health(self) -> Health:
        """The gateway's liveness and version (needs no token).

        Example:
            >>> Client().health().status  # doctest: +SKIP
            'ok'
        """
        return self._get("/v1/health", Health)

    def inventory(self) -> Inventory:
        """The nodes of the cluster, their slots and GPUs, and what runs where.

        Example:
            >>> [n.name for n in Client().inventory().nodes]  # doctest: +SKIP
            ['node-0', 'node-1']
        """
        return self._get("/v1/cluster", Inventory)

    def slo(self) -> SloReport:
        """Your tenant's SLOs (a system admin's: every tenant's) with their targets,
        current values, error budget left and the jobs that burned it.

        Example:
            >>> [s.budget_left for s in Client().slo().slos]  # doctest: +SKIP
            [0.75]
        """
        return self._get("/v1/slo", SloReport)

    def jobs(self, state: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """Your jobs, newest first, optionally only those in `state`.

        Example:
            >>> [j.id for j in Client().jobs(state=JobState.RUNNING)]  # doctest: +SKIP
            ['train-5d41402a']
        """
        return self._get("/v1/jobs", JobList, params={"state": state, "limit": limit}).jobs

    def newest_job(self) -> JobRecord | None:
        """Your most recently submitted job (None before the first), as `sky jobs logs`
        picks one when none is named.

        Example:
            >>> Client().newest_job().id  # doctest: +SKIP
            'train-5d41402a'
        """
        newest = self.jobs(limit=1)
        return newest[0] if newest else None

    def active_jobs(self, limit: int = 1000) -> list[JobRecord]:
        """Your jobs that have not ended (queued, starting, running, restarting),
        newest first.

        Example:
            >>> len(Client().active_jobs())  # doctest: +SKIP
            2
        """
        found = {
            record.id: record
            for state in JobState
            if not state.terminal
            for record in self.jobs(state=state, limit=limit)
        }
        return sorted(found.values(), key=lambda r: r.created_at, reverse=True)[:limit]

    def job(self, job_id: str) -> Job:
        """A handle on an existing job (fetches its record, so a bad id fails here).

        Example:
            >>> Client().job("train-5d41402a").status()  # doctest: +SKIP
            <JobState.RUNNING: 'RUNNING'>
        """
        return Job(self, self.job_record(job_id))

    def job_record(self, job_id: str) -> JobRecord:
        """The gateway's record of one job."""
        return self._get(f"/v1/jobs/{_seg(job_id)}", JobRecord)

    # -- submit --------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        workdir: str | Path | None = None,
        idempotency_key: str | None = None,
        extra_files: Mapping[str, bytes] | None = None,
        progress: Callable[[int, int], None] | None = None,
        on_scan: Callable[[int, int], None] | None = None,
    ) -> Job:
        """Upload the code (if any) and submit `spec`; returns at once with a `Job`.

        `workdir` is packaged as the job's bundle. An `entrypoint` spec without a
        workdir bundles the current directory. `extra_files` (relative path ->
        bytes) are added to the bundle, replacing files of the same name; given
        without a workdir, the bundle holds only them. One Idempotency-Key is used
        for all retries of this call, so a retried POST never makes two jobs.
        `progress(done, total)` hears the bytes packed so far while the workdir is
        bundled (for a progress bar); before that, `on_scan(files, bytes)` hears what
        the scan of the workdir found so far (a large tree takes a while to walk).

        Example:
            >>> spec = JobSpec(name="mnist", entrypoint="train.py", resources={"nodes": 2})
            >>> job = Client().submit(spec, workdir="examples/mnist")  # doctest: +SKIP
        """
        if not isinstance(spec, JobSpec):
            spec = job_spec(**dict(spec))
        key = idempotency_key or str(uuid.uuid4())
        if workdir is None and spec.code is None and spec.bundle_sha256 is None:
            workdir = Path.cwd()  # a script or module: the working directory is its code
        if workdir is None and extra_files:
            from air_sdk.bundle import pack_directory

            with tempfile.TemporaryDirectory(prefix="air-bundle-") as empty:
                bundle = pack_directory(Path(empty), extra_files=extra_files)
            self.upload_bundle(bundle.data, bundle.sha256)
            spec = spec.model_copy(update={"bundle_sha256": bundle.sha256})
        elif workdir is not None:
            root = Path(workdir).expanduser()
            if not root.is_dir():
                raise SpecError(f"workdir {root} is not a directory")
            if spec.entrypoint is not None:
                script = root / spec.entrypoint
                if not script.is_file():
                    raise SpecError(
                        f"entrypoint {spec.entrypoint!r} not found: looked for {script.resolve()};"
                        " pass workdir= the directory that holds it"
                    )
            sha256 = self._bundle_of(root, extra_files, progress, on_scan)
            spec = spec.model_copy(update={"bundle_sha256": sha256})
        record = self._http.request(
            "POST",
            "/v1/jobs",
            json=spec.model_dump(mode="json"),
            headers={"Idempotency-Key": key},
        )
        return Job(self, parse_model(JobRecord, record))

    def submit_script(
        self,
        script: str | Path | None = None,
        *,
        args: Sequence[str] = (),
        progress: Callable[[int, int], None] | None = None,
        on_scan: Callable[[int, int], None] | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Run a torchrun-style script (or, with `module=`, `python -m MODULE`) on
        `nodes` x `procs_per_node` ranks.

        `options` are the job options of `air_sdk.client.options.JobOptions` (the
        same as `air submit`'s flags): nodes, procs_per_node, gpus_per_node, name,
        env, env_from_shell, max_restarts, checkpoint_every, output_dir, pool,
        priority, accelerator, the mesh sizes dp_replicate, dp_shard, tp, pp, cp,
        module and workdir. The bundle is
        `workdir`: by default the current directory when the script is inside it
        (or for a module), else the script's own directory; `progress` and `on_scan`
        are `submit`'s.

        Example:
            >>> job = Client().submit_script("train.py", nodes=2, args=["--lr", "0.1"])  # doctest: +SKIP
            >>> job.id  # doctest: +SKIP
            'train-5d41402a'
            >>> Client().submit_script(module="mypkg.train", nodes=2)  # doctest: +SKIP
        """
        fields = job_spec_fields(options)  # unknown options fail before anything is read
        module = options.get("module")
        workdir = options.get("workdir")
        cwd = Path.cwd().resolve()
        if module is not None:
            if script is not None:
                raise SpecError(
                    f"give a script or module={module!r}, not both: `python -m` runs the module"
                )
            root = cwd if workdir is None else Path(workdir).expanduser().resolve()
            fields.setdefault("name", _default_name(Path(f"{module}.py")))  # "pkg.train"
            return self.submit(
                job_spec(args=list(args), **fields),
                workdir=root,
                progress=progress,
                on_scan=on_scan,
            )
        if script is None:
            raise SpecError("give a script to run (or module= to run `python -m MODULE`)")
        script_path = Path(script).expanduser().resolve()
        if not script_path.is_file():
            raise SpecError(f"script {script} not found (looked for {script_path})")
        if workdir is None:
            root = default_workdir(script_path)
        else:
            root = Path(workdir).expanduser().resolve()
            if not script_path.is_relative_to(root):
                raise SpecError(
                    f"script {script_path} is not inside workdir {root}: the script must be"
                    " part of the bundle; pass a workdir that contains it"
                )
        check_syntax(script_path)  # a typo fails here, not later on every rank
        fields.setdefault("name", _default_name(script_path))
        spec = job_spec(
            entrypoint=script_path.relative_to(root).as_posix(), args=list(args), **fields
        )
        return self.submit(spec, workdir=root, progress=progress, on_scan=on_scan)

    def _bundle_of(
        self,
        root: Path,
        extra_files: Mapping[str, bytes] | None,
        progress: Callable[[int, int], None] | None,
        on_scan: Callable[[int, int], None] | None = None,
    ) -> str:
        """The sha256 of `root`'s bundle, on the gateway: an unchanged tree (by its
        scan's fingerprint) whose bundle the gateway has is neither packed nor sent."""
        from air_sdk.bundle import pack_scan, scan_directory
        from air_sdk.client.bundle_index import BundleIndex

        # BundleError before sending
        scan = scan_directory(root, extra_files=extra_files, on_scan=on_scan)
        index = BundleIndex.default()
        known = index.get(scan.fingerprint) if index is not None else None
        if known is not None and self.has_bundle(known):
            return known
        bundle = pack_scan(scan, progress=progress)
        self.upload_bundle(bundle.data, bundle.sha256)
        if index is not None:
            index.put(scan.fingerprint, bundle.sha256)
        return bundle.sha256

    def has_bundle(self, sha256: str) -> bool:
        """Whether the gateway holds the bundle `sha256` (HEAD).

        Example:
            >>> Client().has_bundle(bundle.sha256)  # doctest: +SKIP
            True
        """
        head = self._http.request(
            "HEAD", f"/v1/bundles/{_seg(sha256)}", allow_statuses=frozenset({404})
        )
        head.close()
        return head.status_code != 404

    def upload_bundle(self, data: bytes, sha256: str) -> bool:
        """Upload a bundle unless the gateway has it already; True when bytes were sent.

        Example:
            >>> Client().upload_bundle(bundle.data, bundle.sha256)  # doctest: +SKIP
            False
        """
        path = f"/v1/bundles/{_seg(sha256)}"
        if self.has_bundle(sha256):
            return False
        response = self._http.request(
            "PUT", path, data=data, headers={"Content-Type": "application/gzip"}
        )
        response.close()
        return True

    @property
    def admin(self) -> Admin:
        """The admin API: tenants, tokens, node health (needs an admin token).

        Example:
            >>> Client().admin.create_token(role="viewer").token  # doctest: +SKIP
            'air_...'
        """
        return Admin(self._http)

    # -- plumbing for Job ----------------------------------------------------

    def _get(self, path: str, model: type[_M], params: Mapping[str, Any] | None = None) -> _M:
        return parse_model(model, self._http.request("GET", path, params=params))

    def _post(self, path: str, model: type[_M]) -> _M:
        return parse_model(model, self._http.request("POST", path))


def _seg(value: str) -> str:
    """One URL path segment: a job id can never reach another route."""
    return quote(str(value), safe="")
