"""Packaging and safe unpacking of job code, and the extra files sent with it.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from air_sdk.bundle import pack_directory, unpack_bundle
    >>> project = Path(tempfile.mkdtemp())
    >>> _ = (project / "train.py").write_text("print('hi')")
    >>> bundle = pack_directory(project)
    >>> unpack_bundle(bundle.data, Path(tempfile.mkdtemp()) / "code",
    ...               expected_sha256=bundle.sha256)
    1
"""

from __future__ import annotations

from air_sdk.bundle.files import MAX_FILES_BYTES, collect_files
from air_sdk.bundle.pack import Bundle, Scan, pack_directory, pack_scan, scan_directory
from air_sdk.bundle.unpack import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    bundle_bytes_sha256,
    unpack_bundle,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "MAX_FILES_BYTES",
    "Bundle",
    "Scan",
    "bundle_bytes_sha256",
    "collect_files",
    "pack_directory",
    "pack_scan",
    "scan_directory",
    "unpack_bundle",
]
