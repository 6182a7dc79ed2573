"""Storing an uploaded bundle: its bytes streamed to a temporary file under the size
cap and hashed, its archive tried by unpacking into scratch (so a malicious archive
is refused at upload, not at launch), then kept under its sha256.

Example:
    >>> info = await store_bundle(ctx, "acme", sha256, request.stream())  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from air_sdk.bundle import DEFAULT_MAX_BYTES, unpack_bundle
from air_sdk.errors import ApiError, BundleError, BundleTooLargeError
from air_sdk.schema import BundleInfo
from air_sdk.schema.names import SHA256, is_valid

if TYPE_CHECKING:
    from air_sdk.gateway.app import GatewayContext

__all__ = ["check_bundle", "checked_sha256", "store_bundle"]


def checked_sha256(sha256: str) -> str:
    """`sha256` when it can name a bundle; an `ApiError` (400) saying what one is.

    Example:
        >>> checked_sha256("x")
        Traceback (most recent call last):
        ...
        air_sdk.errors.ApiError: a bundle id is the sha256 of its bytes: 64 lowercase hex digits (HTTP 400)
    """
    if not is_valid(SHA256, sha256):
        raise ApiError(400, "a bundle id is the sha256 of its bytes: 64 lowercase hex digits")
    return sha256


async def store_bundle(
    ctx: GatewayContext, tenant: str, sha256: str, chunks: AsyncIterator[bytes]
) -> BundleInfo:
    """Keep the bundle whose bytes `chunks` stream for `tenant` (a no-op when it has it):
    `BundleTooLargeError` over the cap, `BundleError` for bytes that do not hash to
    `sha256` or an archive `check_bundle` refuses."""
    checked_sha256(sha256)
    existing = ctx.store.get_bundle(tenant, sha256)
    if existing is not None:
        return BundleInfo(sha256=sha256, size=existing["size"], num_files=existing["num_files"])
    ctx.bundles_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=ctx.bundles_dir, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in chunks:
                size += len(chunk)
                if size > DEFAULT_MAX_BYTES:
                    raise BundleTooLargeError(
                        f"the bundle is over {DEFAULT_MAX_BYTES >> 20} MiB: add large files"
                        " to .airignore and read them from shared storage"
                    )
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != sha256:
            raise BundleError("the uploaded bytes do not hash to the sha256 in the URL")
        num_files = await anyio.to_thread.run_sync(check_bundle, tmp)
        final = ctx.bundles_dir / f"{sha256}.tar.gz"
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    ctx.store.add_bundle(tenant, sha256, size, num_files, str(final))
    return BundleInfo(sha256=sha256, size=size, num_files=num_files)


def check_bundle(path: str) -> int:
    """Unpack into a scratch dir, so a malicious archive is refused at upload; the
    number of files. Over the size or file-count limit: `BundleTooLargeError` (413);
    unsafe or broken: `BundleError` (400), each saying "bundle refused"."""
    scratch = tempfile.mkdtemp(prefix="air-bundle-check-")
    try:
        return unpack_bundle(Path(path), Path(scratch) / "x")
    except BundleError as exc:
        raise type(exc)(f"bundle refused: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
