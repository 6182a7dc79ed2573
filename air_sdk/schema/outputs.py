"""What `air outputs JOB` (GET /v1/jobs/{id}/outputs) answers: the files a job kept in
its output directory (`AIR_OUTPUT_DIR`).

Example:
    >>> listing = OutputList(job_id="train-5d41402a", directory="/home/air/outputs/train-5d41402a",
    ...     files=[OutputFile(path="model/config.json", bytes=512, mtime=1.7e9)])
    >>> listing.total_bytes
    512
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OutputFile", "OutputList"]


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OutputFile(_Wire):
    """One file under the output directory."""

    path: str = Field(description="Relative to the output directory, '/'-separated.")
    bytes: int = Field(ge=0, description="Size in bytes.")
    mtime: float = Field(description="Last modified, seconds since the epoch.")


class OutputList(_Wire):
    """A job's output directory and its files, sorted by path."""

    job_id: str
    directory: str = Field(description="Where the files are, on the gateway's machine.")
    files: list[OutputFile] = Field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """The files' bytes together."""
        return sum(f.bytes for f in self.files)
