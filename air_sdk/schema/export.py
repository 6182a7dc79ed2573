"""Where a job's metrics are forwarded: `ExportTarget` (`JobSpec.export`, `--export`).

The gateway forwards a job's `air.log` series, checkpoint commits and final state from
its event log to the trackers named here (`air_sdk.export`), so the ranks pay nothing
and a rank crash loses nothing:

| `to`          | `dest`                                   | without `dest`                        |
|---------------|------------------------------------------|---------------------------------------|
| `mlflow`      | a tracking server URI the operator allows | a SQLite tracking store the gateway keeps |
| `wandb`       | the W&B project                          | project `air`                         |
| `tensorboard` | (none)                                   | event files the gateway keeps         |

On the command line a target is written `TO[=DEST]`, e.g. `--export mlflow` or
`--export wandb=my-project`.

Example:
    >>> ExportTarget.model_validate("mlflow=http://mlflow.internal:5000")
    ExportTarget(to='mlflow', dest='http://mlflow.internal:5000')
    >>> ExportTarget.model_validate("tensorboard").dest is None
    True
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from air_sdk.schema._guards import WireModel
from air_sdk.schema.names import control_chars, shown

__all__ = ["EXPORT_TARGETS", "ExportStatus", "ExportTarget", "ExportTo", "parse_targets"]

ExportTo = Literal["mlflow", "wandb", "tensorboard"]
#: every tracker a job can be exported to
EXPORT_TARGETS: tuple[str, ...] = ("mlflow", "wandb", "tensorboard")
MAX_DEST_CHARS = 2048


class ExportTarget(WireModel):
    """One tracker a job's metrics go to (see the module docstring for `dest`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: ExportTo = Field(description="The tracker: mlflow, wandb or tensorboard.")
    dest: str | None = Field(
        None,
        max_length=MAX_DEST_CHARS,
        description="mlflow: a tracking server URI the gateway's operator allows (default: a"
        " SQLite store the gateway keeps); wandb: the project (default `air`); tensorboard:"
        " none (event files the gateway keeps).",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        if isinstance(data, str):
            to, sep, dest = data.strip().partition("=")
            return {"to": to.strip().lower(), "dest": dest.strip() if sep else None}
        return data

    @field_validator("to", mode="before")
    @classmethod
    def _known(cls, v: object) -> object:
        if isinstance(v, str) and v not in EXPORT_TARGETS:
            raise ValueError(
                f"unknown tracker {shown(v)}: export to one of {', '.join(EXPORT_TARGETS)}"
                " (written TO[=DEST], e.g. mlflow or wandb=my-project)"
            )
        return v

    @field_validator("dest")
    @classmethod
    def _dest_ok(cls, v: str | None) -> str | None:
        if v is not None and (not v or control_chars(v)):
            raise ValueError(f"export destination {shown(v)} is empty or holds control characters")
        return v

    @model_validator(mode="after")
    def _dest_fits(self) -> ExportTarget:
        if self.to == "tensorboard" and self.dest is not None:
            raise ValueError(
                "tensorboard takes no destination: the gateway keeps the event files (`air"
                " status JOB` says where); write --export tensorboard"
            )
        if self.to == "mlflow" and self.dest is not None and "://" not in self.dest:
            raise ValueError(
                f"mlflow destination {shown(self.dest)} is not a tracking URI: give"
                " http(s)://HOST[:PORT], or leave it out for a store the gateway keeps"
            )
        if self.to == "wandb" and self.dest is not None and not _is_project(self.dest):
            raise ValueError(
                f"wandb destination {shown(self.dest)} is not a project name: use letters,"
                " digits, '-', '_' and '.' (at most 128)"
            )
        return self


def _is_project(name: str) -> bool:
    return 0 < len(name) <= 128 and all(c.isalnum() or c in "-_." for c in name)


def parse_targets(items: object) -> object:
    """`JobSpec.export` from what users write: a list of targets or `TO[=DEST]` texts,
    where a text without `=` may name several (`mlflow,tensorboard`).

    Example:
        >>> parse_targets(["mlflow,tensorboard", "wandb=proj"])
        ['mlflow', 'tensorboard', 'wandb=proj']
    """
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list | tuple):
        return items
    out: list[object] = []
    for item in items:
        if isinstance(item, str) and "=" not in item and "," in item:
            out.extend(part for part in (p.strip() for p in item.split(",")) if part)
        else:
            out.append(item)
    return out


class ExportStatus(WireModel):
    """Where the gateway exports the job to one tracker (`JobSpec.export`), and how it
    went: `running` (with where the data goes), `done`, or `failed` (with why).

    Example:
        >>> ExportStatus(to="tensorboard", state="running", location="/h/exports/j/tb").state
        'running'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: str
    state: Literal["running", "done", "failed"]
    location: str = ""
    error: str = ""

    def describe(self) -> str:
        """The line `air status`, the monitor and the /ui page show for it.

        Example:
            >>> ExportStatus(to="tensorboard", state="done", location="/h/tb").describe()
            'export to tensorboard: done, /h/tb'
            >>> ExportStatus(to="mlflow", state="failed", error="no server").describe()
            'export to mlflow: failed: no server'
        """
        if self.state == "failed":
            return f"export to {self.to}: failed: {self.error}"
        return f"export to {self.to}: {self.state}" + (
            f", {self.location}" if self.location else ""
        )
