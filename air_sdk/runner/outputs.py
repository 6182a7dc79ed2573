"""A job's output directory (`AIR_OUTPUT_DIR`): where it is, what it holds, and which
of its files may be served.

Every job has one, as a SageMaker job has `SM_MODEL_DIR` and a Ray Train run its
`storage_path/name`: `JobSpec.output_dir` when the job chose a place, else
`<gateway home>/outputs/<job id>`, or, on a backend with shared storage (Ray's
`AIR_RAY_STORAGE`), `<storage>/jobs/<job id>/outputs`, next to its checkpoints.
It lies outside `<home>/jobs/`, so retention (`air gc`) never deletes it.

The gateway serves only a directory it chose itself (never a job's own
`output_dir`, which could name any of the gateway's files), and only regular files
inside it: a path with `..`, an absolute path, or a symlink that leads out of the
directory is refused.

Example:
    >>> default_output_dir(job_id="j1", home=Path("/home/air"), storage=None)
    '/home/air/outputs/j1'
    >>> default_output_dir(job_id="j1", home=Path("/home/air"), storage="s3://b/air")
    's3://b/air/jobs/j1/outputs'
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from air_sdk.errors import ConfigError
from air_sdk.schema.outputs import OutputFile

__all__ = ["OUTPUTS_DIR", "checked_root", "default_output_dir", "list_outputs", "output_file"]

#: under the gateway's home: one directory per job
OUTPUTS_DIR = "outputs"


def default_output_dir(*, job_id: str, home: Path, storage: str | None) -> str:
    """Where a job that named no `output_dir` keeps its outputs: under the backend's
    shared `storage` when it has one (every node writes there), else under `home`.

    Example:
        >>> default_output_dir(job_id="j1", home=Path("/h"), storage="/mnt/shared")
        '/mnt/shared/jobs/j1/outputs'
    """
    if storage:
        if "://" in storage:
            return storage.rstrip("/") + f"/jobs/{job_id}/outputs"
        return str(PurePosixPath(storage) / "jobs" / job_id / "outputs")
    return str(home / OUTPUTS_DIR / job_id)


def checked_root(root: Path, base: Path) -> Path:
    """`root`, once it is known to lie inside `base` (the gateway's outputs directory
    or the shared storage) with every link resolved: a job that swapped its directory
    for a symlink to elsewhere gets a `ConfigError`, not the gateway's files.

    Example:
        >>> checked_root(Path("/h/outputs/j1"), Path("/h/outputs"))
        PosixPath('/h/outputs/j1')
    """
    if not root.resolve().is_relative_to(base.resolve()) or root.is_symlink():
        raise ConfigError(
            f"the output directory {root} leads out of {base}: it was replaced by a link;"
            " read it on the nodes"
        )
    return root


def list_outputs(root: Path) -> list[OutputFile]:
    """The regular files under `root` (none when it does not exist yet), sorted by path;
    symlinks are left out (a served file is never a link).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "a").mkdir(); _ = (d / "a" / "x.txt").write_text("hi")
        >>> [(f.path, f.bytes) for f in list_outputs(d)]
        [('a/x.txt', 2)]
    """
    if not root.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk does not follow links
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # removed while we walked
            if stat.S_ISREG(st.st_mode):
                rel = Path(full).relative_to(root).as_posix()
                found.append(OutputFile(path=rel, bytes=st.st_size, mtime=st.st_mtime))
        dirnames.sort()
    return sorted(found, key=lambda f: f.path)


def output_file(root: Path, relative: str) -> Path:
    """The file `relative` names under `root`, checked: a `ConfigError` saying why for a
    path that is absolute, climbs with `..`, passes through a symlink, or is not a
    regular file.

    Example:
        >>> output_file(Path("/h/outputs/j1"), "../j2/secret")
        Traceback (most recent call last):
        ...
        air_sdk.errors.ConfigError: '../j2/secret' is not a path inside the job's output directory
    """
    parts = PurePosixPath(relative).parts
    if (
        not relative
        or "\x00" in relative
        or relative.startswith("/")
        or "\\" in relative
        or any(p in ("..", ".") for p in parts)
    ):
        raise ConfigError(f"{relative!r} is not a path inside the job's output directory")
    path = root
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise ConfigError(
                f"{relative!r} is a symlink; only the directory's own files are served"
            )
    if not path.is_file():
        raise ConfigError(f"{relative!r} is not a file of the job's output directory")
    # a link above root itself, or a hard-to-see rename race, still must stay inside it
    if not path.resolve().is_relative_to(root.resolve()):
        raise ConfigError(f"{relative!r} leads out of the job's output directory")
    return path
