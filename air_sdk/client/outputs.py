"""Downloading a job's output directory (`Job.download_outputs`): every file of the
gateway's listing, streamed to `dest` under its relative path.

A file arrives as `<name>.part` and is renamed once all its bytes are there, so an
interrupted download never leaves a truncated file under the real name. A path in
the listing that would land outside `dest` is refused (a gateway is trusted with
bytes, not with where they go).

Example:
    >>> safe_target(Path("/tmp/out"), "model/weights.bin")
    PosixPath('/tmp/out/model/weights.bin')
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote

import requests

from air_sdk.errors import TransportError
from air_sdk.schema.outputs import OutputList

if TYPE_CHECKING:
    from air_sdk.client.client import Client

__all__ = ["download", "safe_target"]

#: bytes read from the socket at a time while writing a file
CHUNK_BYTES = 1 << 20


def safe_target(dest: Path, relative: str) -> Path:
    """Where `relative` (a '/'-separated path from the listing) goes under `dest`;
    a `TransportError` for one that would leave it.

    Example:
        >>> safe_target(Path("/tmp/out"), "../../.bashrc")
        Traceback (most recent call last):
        ...
        air_sdk.errors.TransportError: the gateway listed '../../.bashrc', a path outside the download directory; nothing was written for it
    """
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or any(p in ("..", ".", "") for p in parts):
        raise TransportError(
            f"the gateway listed {relative!r}, a path outside the download directory;"
            " nothing was written for it"
        )
    return dest.joinpath(*parts)


def download(client: Client, job_path: str, listing: OutputList, dest: Path) -> list[Path]:
    """Fetch every file of `listing` into `dest` (created); the paths written, in order."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for item in listing.files:
        target = safe_target(dest, item.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        response = client._http.request(
            "GET", f"{job_path}/outputs/files/{quote(item.path)}", stream=True
        )
        try:
            with open(part, "wb") as out:
                for chunk in response.iter_content(chunk_size=CHUNK_BYTES):
                    out.write(chunk)
        except requests.RequestException as exc:  # the connection dropped mid-file
            part.unlink(missing_ok=True)
            raise client._http.transport_error(exc) from exc
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        finally:
            response.close()
        os.replace(part, target)
        os.utime(target, (item.mtime, item.mtime))  # as `cp -p` and rsync -t keep it
        written.append(target)
    return written
