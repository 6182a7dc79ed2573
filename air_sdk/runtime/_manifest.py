"""The checkpoint tree's layout and its commit record, `manifest.json` (written last, by rank 0).

`<root>/step-<step>/` holds one checkpoint. It counts for restore only when its
manifest parses, names that step, and every file it lists has the listed size and
sha256. Hidden `.trash-step-*` / `.replaced-step-*` directories are leftovers moved
aside. No torch here, and no I/O beyond what a `CheckpointStorage` does for it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from air_sdk.runtime._storage import CheckpointStorage

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "committed_manifest",
    "list_step_dirs",
    "parse_step_dir",
    "read_manifest",
    "retention_victims",
    "step_dir_name",
    "verify_files",
]

FORMAT = 1
MANIFEST_NAME = "manifest.json"
_STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A manifest is missing a field, has a wrong type, or names a file outside its directory."""


def step_dir_name(step: int) -> str:
    """The directory name of the checkpoint of `step`.

    Example:
        >>> step_dir_name(1200)
        'step-1200'
    """
    return f"step-{step}"


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None for any other name.

    Example:
        >>> parse_step_dir("step-40"), parse_step_dir(".trash-step-40-1a2b"), parse_step_dir("step-07")
        (40, None, None)
    """
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint, relative to its directory."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What `manifest.json` holds.

    Example:
        >>> m = Manifest(step=3, world_size=2, files=(FileEntry(".metadata", 10, "0" * 64),))
        >>> Manifest.from_json(m.to_json()) == m
        True
    """

    step: int
    world_size: int
    files: tuple[FileEntry, ...]
    created_at: float = field(default_factory=time.time)
    job_id: str | None = None
    attempt: int = 0
    data_position: dict[str, Any] | None = None
    #: the mesh sizes it was saved under (`Parallelism.sizes()`, or a DTensor mesh's)
    parallelism: dict[str, int] | None = None
    #: what each state key is (`model`, `optimizer`, `stateful`, `value`); absent in
    #: checkpoints of AIR before optimizers were saved flattened by parameter name
    state_kinds: dict[str, str] | None = None
    format: int = FORMAT

    @property
    def size_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def commit_record(
        self, path: str, blocked_s: float, durable_s: float, **extra: Any
    ) -> dict[str, Any]:
        """The CheckpointCommit event (as a dict) that reports this checkpoint at `path`.

        Example:
            >>> m = Manifest(step=3, world_size=2, files=(FileEntry(".metadata", 10, "0" * 64),))
            >>> m.commit_record("/ckpt/step-3", 0.01, 0.5, snapshot="copy")["size_bytes"]
            10
        """
        return {
            "step": self.step,
            "path": path,
            "world_size": self.world_size,
            "size_bytes": self.size_bytes,
            "num_files": len(self.files),
            "blocked_s": round(blocked_s, 4),
            "durable_s": round(durable_s, 4),
            "attempt": self.attempt,
            **extra,
        }

    def to_json(self) -> bytes:
        body = asdict(self)
        body["files"] = [asdict(entry) for entry in self.files]
        for optional in ("data_position", "parallelism", "state_kinds"):
            if body[optional] is None:
                del body[optional]
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Parse and validate; raises ManifestError saying what is wrong."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise ManifestError("not a JSON object")
        if body.get("format") != FORMAT:
            raise ManifestError(f"format {body.get('format')!r} is not {FORMAT}")
        files = body.get("files")
        if not isinstance(files, list) or not files:
            raise ManifestError("'files' is not a non-empty list")
        entries = tuple(_entry(item) for item in files)
        data_position = body.get("data_position")
        if data_position is not None and not isinstance(data_position, dict):
            raise ManifestError("'data_position' is not an object")
        job_id = body.get("job_id")
        parallelism = _str_map(body, "parallelism", int)
        state_kinds = _str_map(body, "state_kinds", str)
        return cls(
            step=_int(body, "step"),
            world_size=_int(body, "world_size", minimum=1),
            files=entries,
            created_at=float(_number(body, "created_at")),
            job_id=job_id if isinstance(job_id, str) else None,
            attempt=_int(body, "attempt"),
            data_position=data_position,
            parallelism=parallelism,
            state_kinds=state_kinds,
        )


def _str_map(body: dict[str, Any], key: str, kind: type) -> dict[str, Any] | None:
    value: Any = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is kind for k, v in value.items()
    ):
        raise ManifestError(f"{key!r} is not an object of {kind.__name__} values")
    return value


def _int(body: dict[str, Any], key: str, minimum: int = 0) -> int:
    value: Any = body.get(key)
    if type(value) is not int or value < minimum:
        raise ManifestError(f"{key!r} is not an integer >= {minimum}")
    return value


def _number(body: dict[str, Any], key: str) -> float:
    value: Any = body.get(key)
    if type(value) not in (int, float):
        raise ManifestError(f"{key!r} is not a number")
    return float(value)


def _entry(item: Any) -> FileEntry:
    if not isinstance(item, dict):
        raise ManifestError("a 'files' entry is not an object")
    path, sha = item.get("path"), item.get("sha256")
    # DCP writes flat directories; anything else could point outside the checkpoint.
    if not isinstance(path, str) or path in ("", ".", "..") or "/" in path or "\\" in path:
        raise ManifestError(f"file path {path!r} is not a plain file name")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ManifestError(f"{path}: sha256 is not 64 lowercase hex digits")
    return FileEntry(path=path, size=_int(item, "size"), sha256=sha)


def read_manifest(storage: CheckpointStorage, directory: str) -> Manifest | None:
    """The manifest of `directory`; None when there is none (not committed).
    Raises ManifestError when one exists but is not valid."""
    path = storage.join(directory, MANIFEST_NAME)
    if not storage.exists(path):
        return None
    return Manifest.from_json(storage.read_bytes(path))


def committed_manifest(storage: CheckpointStorage, directory: str, step: int) -> Manifest | None:
    """The manifest of checkpoint `step`, or None (not committed); ManifestError if invalid."""
    manifest = read_manifest(storage, directory)
    if manifest is not None and manifest.step != step:
        raise ManifestError(f"it names step {manifest.step}")
    return manifest


def list_step_dirs(storage: CheckpointStorage) -> list[tuple[int, str]]:
    """(step, path) of every `step-N` directory under the root, newest first."""
    root = storage.root
    found = [(parse_step_dir(name), name) for name in storage.list_dir(root)]
    return sorted(
        ((step, storage.join(root, name)) for step, name in found if step is not None),
        reverse=True,
    )


def retention_victims(
    steps: list[tuple[int, bool]], *, keep: int, just_committed: int
) -> list[int]:
    """Which `step-N` directories to delete right after `just_committed` committed.

    `steps` is (step, committed) for every directory. Keeps the newest `keep`
    committed ones and always the one just committed (so the newest is never
    deleted before a newer one commits); deletes uncommitted leftovers older than
    it, but not newer ones (they may belong to a save of a run that went further).

    Example:
        >>> retention_victims([(8, True), (6, True), (5, False), (4, True), (9, False)],
        ...                   keep=2, just_committed=8)
        [5, 4]
    """
    victims, kept = [], 0
    for step, committed in sorted(steps, reverse=True):
        if committed:
            kept += 1
            if kept <= keep or step == just_committed:
                continue
        elif step >= just_committed:
            continue
        victims.append(step)
    return victims


def verify_files(
    storage: CheckpointStorage, directory: str, entries: list[FileEntry] | tuple[FileEntry, ...]
) -> list[str]:
    """Check each entry's size, then its sha256; one problem line per bad file (empty: all good).

    Example:
        >>> verify_files(storage, "ckpt/step-4", manifest.files)  # doctest: +SKIP
        ['__1_0.distcp: 1048576 bytes, the manifest says 2097152']
    """
    problems = []
    for entry in entries:
        path = storage.join(directory, entry.path)
        try:
            size = storage.size(path)
            if size != entry.size:
                problems.append(f"{entry.path}: {size} bytes, the manifest says {entry.size}")
                continue
            _, sha = storage.digest(path)
        except FileNotFoundError:
            problems.append(f"{entry.path}: missing")
            continue
        except OSError as exc:
            problems.append(f"{entry.path}: unreadable ({exc})")
            continue
        if sha != entry.sha256:
            problems.append(f"{entry.path}: sha256 does not match the manifest")
    return problems
