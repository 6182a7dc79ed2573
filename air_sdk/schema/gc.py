"""What `air gc` (POST /v1/admin/gc) asks and answers: the files of ended jobs and the
unpacked bundles no job uses any more, and the bytes that leave the disk.

Example:
    >>> report = GcReport(dry_run=True, jobs=[GcJob(job_id="train-5d41402a", ended_at=0,
    ...     bytes=4096)], bundles=[], bytes_freed=4096, bytes_kept=0)
    >>> report.jobs[0].bytes
    4096
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GcRequest(_Wire):
    """What to collect: by default what the gateway's retention would collect now."""

    dry_run: bool = Field(False, description="Say what would go; delete nothing.")
    older_than_s: float | None = Field(
        None,
        ge=0,
        description="Ended jobs whose files go: those that ended longer ago than this;"
        " None: the gateway's retention (--job-files-max-age-days).",
    )
    include_checkpoints: bool = Field(
        False,
        description="Also delete the checkpoints kept under those jobs' directories"
        " (kept by default: `air checkpoints export` reads them).",
    )


class GcJob(_Wire):
    """An ended job whose files (code copy, attempt logs, checkpoints under it) go."""

    job_id: str
    ended_at: float
    #: bytes only this job's files held (its share of shared code files not counted)
    bytes: int


class GcReport(_Wire):
    """What went (or, in a dry run, would go), and the bytes that leave the disk."""

    dry_run: bool
    jobs: list[GcJob]
    #: sha256 of unpacked bundles that no job links any more
    bundles: list[str]
    #: sha256 of uploaded bundle archives no job that has not ended names
    archives: list[str] = Field(default_factory=list)
    #: bytes that leave the disk (a file's bytes go with its last link)
    bytes_freed: int
    #: bytes the files of ended jobs still hold afterwards
    bytes_kept: int
