"""Which bundle an unchanged tree packed to last time, so `submit` skips packing it.

A `Scan` of the workdir (stat only) has a fingerprint of every kept file's name,
size, mode and mtime; this index maps it to the sha256 of the bundle it packed to.
When the fingerprint is known and the gateway still has that bundle (HEAD), nothing
is packed or uploaded. As make and rsync, a file rewritten with the same size and
mtime counts as unchanged; touch it, or set AIR_BUNDLE_INDEX=0 to always pack.

The index is a small JSON file in the user's cache directory
(`$XDG_CACHE_HOME/air/bundle-index.json`), the newest `MAX_ENTRIES` kept.

Example:
    >>> import tempfile
    >>> index = BundleIndex(Path(tempfile.mkdtemp()) / "index.json")
    >>> index.get("f" * 64) is None
    True
    >>> index.put("f" * 64, "a" * 64); index.get("f" * 64) == "a" * 64
    True
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["MAX_ENTRIES", "BundleIndex"]

#: fingerprints remembered (a few projects x a few recent trees each)
MAX_ENTRIES = 64


class BundleIndex:
    """Fingerprint of a scanned tree -> the sha256 of the bundle it packed to."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def default(cls) -> BundleIndex | None:
        """The user's index; None when AIR_BUNDLE_INDEX=0 turns it off."""
        if os.environ.get("AIR_BUNDLE_INDEX", "1") == "0":
            return None
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return cls(Path(base) / "air" / "bundle-index.json")

    def _read(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, fingerprint: str) -> str | None:
        found = self._read().get(fingerprint)
        return str(found[0]) if isinstance(found, list) and found else None

    def put(self, fingerprint: str, sha256: str) -> None:
        """Remember it; a cache that cannot be written is only a slower next submit."""
        entries = self._read()
        entries[fingerprint] = [sha256, time.time()]
        newest = sorted(entries.items(), key=lambda kv: -float(kv[1][1]))[:MAX_ENTRIES]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dict(newest)))
            os.replace(tmp, self.path)
        except OSError:
            pass
