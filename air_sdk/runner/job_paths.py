"""Where a job may name its own directories (`output_dir`, `checkpoint.dir`) on the
local backend: `JobPathPolicy`.

The local backend creates such a directory as the gateway's user and binds it
read-write into the job's sandbox, after the hiding. So a job that could name any
path could write the gateway's home (its parent, `/`), another tenant's directory,
`/etc` or `~/.ssh`. A job-chosen local path must therefore be

* absolute and already in its real form (no `..`, no symbolic link on the way: a
  link a job planted could point anywhere by launch time);
* the job's own directory under the gateway's home, or under a root the operator
  approved for its tenant; by default there is none, so a job keeps its outputs and
  checkpoints under the home. The roots, for a job of tenant T:

  - `allowed_data_roots` (`--allowed-data-root ROOT`): only under `ROOT/T/`, so
    tenant A's job cannot name (and have bound read-write) tenant B's `ROOT/B/...`;
  - `data_roots` under `[tenants.T]` in the cluster file: T's alone, anywhere in them;
  - `shared_data_roots` (`--shared-data-root ROOT`) and the `--sandbox-bind`
    directories (every job writes those anyway): anywhere, for every tenant;
* never the home, an ancestor of it or of the client config directory (the admin
  token), nor any other directory inside the home.

The gateway refuses such a job at submit (400, `submit_refusal`) and the backend
checks again at launch (the job fails with the same message). A URL (`s3://...`) is
not a local path and is not checked here.

Example:
    >>> policy = JobPathPolicy(home=Path("/srv/air"), allowed_roots=("/data/air",))
    >>> policy.refusal("output_dir", "/data/air/acme/runs/7", tenant="acme") is None
    True
    >>> print(policy.refusal("output_dir", "/etc", tenant="acme"))  # doctest: +ELLIPSIS
    output_dir /etc is outside the directories this gateway lets tenant 'acme''s jobs write (/data/air/acme)...
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from air_sdk.schema import JobSpec

__all__ = ["SETTING", "JobPathPolicy", "job_chosen_paths", "submit_refusal"]

#: the gateway setting an operator changes to let jobs write somewhere else
SETTING = "allowed_data_roots (air gateway start --allowed-data-root DIR)"
#: the tenant a job belongs to when none is said (the system tenant)
DEFAULT_TENANT = "default"


def job_chosen_paths(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, path) of every local directory `spec` names for the job itself.

    Example:
        >>> job_chosen_paths(JobSpec(entrypoint="t.py", output_dir="/d/o"))
        [('output_dir', '/d/o')]
    """
    found = [("output_dir", spec.output_dir), ("checkpoint.dir", spec.checkpoint.dir)]
    return [(name, path) for name, path in found if path and os.path.isabs(path)]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class JobPathPolicy:
    """The operator's rule for job-chosen directories (see the module docstring).

    Example:
        >>> JobPathPolicy(home=Path("/srv/air")).refusal("checkpoint.dir", "/srv") is None
        False
        >>> shared = JobPathPolicy(home=Path("/srv/air"), shared_roots=("/scratch",))
        >>> shared.refusal("output_dir", "/scratch/any/where", tenant="acme") is None
        True
    """

    #: the gateway's home
    home: Path
    #: directories under which jobs may name their own, each tenant T under `ROOT/T/`
    allowed_roots: tuple[str, ...] = ()
    #: directories no job path may contain or be (the client config directory)
    protected: tuple[str, ...] = ()
    #: directories any tenant's job may name anywhere in (`--shared-data-root`,
    #: `--sandbox-bind`)
    shared_roots: tuple[str, ...] = ()
    #: tenant -> directories only its jobs may name (`data_roots` in the cluster file)
    tenant_roots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        home: Path,
        roots: Iterable[str | Path],
        protected: Iterable[str | Path] = (),
        *,
        shared: Iterable[str | Path] = (),
        tenant_roots: Mapping[str, Iterable[str | Path]] | None = None,
    ) -> JobPathPolicy:
        """A policy with every directory in its real form."""

        def real(dirs: Iterable[str | Path]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(os.path.realpath(r) for r in dirs))

        return cls(
            Path(os.path.realpath(home)),
            real(roots),
            real(protected),
            real(shared),
            {t: real(dirs) for t, dirs in (tenant_roots or {}).items()},
        )

    def roots_of(self, tenant: str) -> list[str]:
        """Every directory under which `tenant`'s jobs may name their own.

        Example:
            >>> JobPathPolicy(Path("/h"), ("/d",), shared_roots=("/s",)).roots_of("b")
            ['/d/b', '/s']
        """
        mine = [os.path.join(r, tenant) for r in self.allowed_roots]
        return [*mine, *self.tenant_roots.get(tenant, ()), *self.shared_roots]

    def refusal(
        self,
        field: str,
        path: str,
        own: Iterable[str | Path] = (),
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> str | None:
        """Why a job of `tenant` may not use `path` for `field`, or None; `own`: the
        job's own directories under the home (known at launch, not at submit)."""
        if not os.path.isabs(path):
            return None  # a URL, or a relative path the spec already refused
        named = os.path.normpath(path)
        real = os.path.realpath(path)
        home = str(self.home)
        if ".." in Path(path).parts or real != named:
            return (
                f"{field} {path} is not a plain directory path (it has '..' or a symbolic"
                f" link on the way, to {real}): name the real directory"
            )
        if any(_inside(real, os.path.realpath(o)) for o in own):
            return None
        for guarded in (home, *self.protected):
            if _inside(guarded, real):
                return (
                    f"{field} {path} is or contains the gateway's own directory {guarded}:"
                    " leave it unset (the default is under the job) or name a directory of"
                    " the job's own"
                )
        if _inside(real, home):
            return (
                f"{field} {path} is in the gateway's home but not in this job's directory:"
                " leave it unset (the default is under the job's own directory)"
            )
        if any(_inside(real, root) for root in self.roots_of(tenant)):
            return None
        for root in self.allowed_roots:
            if _inside(real, root):
                mine = os.path.join(root, tenant)
                return (
                    f"{field} {path} is in the data root {root}, where each tenant's jobs name"
                    f" directories under their own tenant's: use one under {mine}/, or have the"
                    f" operator list a parent of it in `data_roots` under [tenants.{tenant}] in"
                    f" the cluster file (or make {root} shared by every tenant: air gateway"
                    f" start --shared-data-root {root})"
                )
        roots = ", ".join(self.roots_of(tenant)) or "none"
        return (
            f"{field} {path} is outside the directories this gateway lets tenant {tenant!r}'s"
            f" jobs write ({roots}): leave it unset (the job's directory under the gateway's"
            f" home is the default) or have the operator add a parent of it to `data_roots`"
            f" under [tenants.{tenant}] in the cluster file, or to {SETTING}"
        )

    def spec_refusal(self, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> str | None:
        """The first refusal of `spec`'s job-chosen paths at submit, or None."""
        for name, path in job_chosen_paths(spec):
            why = self.refusal(name, path, tenant=tenant)
            if why is not None:
                return why
        return None


def submit_refusal(spec: JobSpec, backend: object, tenant: str = DEFAULT_TENANT) -> str | None:
    """Why the gateway refuses `spec` at submit for its job-chosen paths, or None: the
    local backend's policy when its ranks run sandboxed (unsandboxed ranks can write
    whatever the gateway's user can: a policy would promise nothing there).

    Example:
        >>> submit_refusal(JobSpec(entrypoint="t.py", output_dir="/etc"), object()) is None
        True
    """
    from air_sdk.runner.backends.local import LocalBackend

    if not isinstance(backend, LocalBackend):
        return None
    return backend.job_path_refusal(spec, tenant)
