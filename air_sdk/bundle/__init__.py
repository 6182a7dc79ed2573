"""Packaging and safe unpacking of job code.

Example:
    >>> from air_sdk.bundle import pack_directory, unpack_bundle
    >>> bundle = pack_directory(Path("my_project"))  # doctest: +SKIP
    >>> unpack_bundle(bundle.data, Path("/tmp/job-code"),
    ...               expected_sha256=bundle.sha256)  # doctest: +SKIP
    3
"""

from __future__ import annotations

from air_sdk.bundle.pack import Bundle, pack_directory
from air_sdk.bundle.unpack import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    bundle_bytes_sha256,
    unpack_bundle,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "Bundle",
    "bundle_bytes_sha256",
    "pack_directory",
    "unpack_bundle",
]
