"""A worker report's body, read by its Content-Type: JSON (a `WorkerReport`, what older
runtimes, curl users and function results post) or msgpack (what the runtime's shipper
posts: the same fields, its points as columns, `air_sdk.schema.columns`).

A msgpack body's points are checked by the batch's shape, never a model per point; the
rest of it is a `WorkerReport` without points, validated as one. Anything malformed is a
422 that says what is wrong; a Content-Type the gateway does not read is a 415, which
tells a newer shipper to post JSON instead.

Example:
    >>> import msgpack
    >>> body = msgpack.packb({"rank": 0, "columns": {"names": ["loss"], "step": [1],
    ...     "ts": [1.0], "values": [[0.5]]}})
    >>> parsed = parse_report(body, "application/msgpack")
    >>> parsed.report.rank, parsed.columns.num_points
    (0, 1)
    >>> parse_report(b"<xml/>", "application/xml")
    Traceback (most recent call last):
    ...
    air_sdk.errors.ApiError: a worker report is JSON (Content-Type: application/json) or msgpack (application/msgpack), not 'application/xml' (HTTP 415)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import ValidationError

from air_sdk.errors import ApiError
from air_sdk.gateway.bodies import describe_validation_error
from air_sdk.schema import WorkerReport
from air_sdk.schema.columns import COLUMNS_KEY, PointColumns

__all__ = ["MSGPACK_TYPE", "ParsedReport", "parse_report"]

#: the Content-Type of a binary report
MSGPACK_TYPE = "application/msgpack"
_MSGPACK_TYPES = frozenset({MSGPACK_TYPE, "application/x-msgpack", "application/vnd.msgpack"})
#: read as JSON: JSON itself, and what curl (`-d`) and plain clients send by default
_JSON_TYPES = frozenset({"", "application/json", "text/plain", "application/x-www-form-urlencoded"})


@dataclass(frozen=True, slots=True)
class ParsedReport:
    """A report's fields (`report`) and, for a binary one, its points as checked
    columns (`columns`; then `report.points` is empty)."""

    report: WorkerReport
    columns: PointColumns | None = None
    #: the body's format: "json" or "msgpack"
    body_format: str = "json"

    @property
    def num_points(self) -> int:
        return self.columns.num_points if self.columns is not None else len(self.report.points)

    @property
    def last_step(self) -> int | None:
        if self.columns is not None:
            return self.columns.last_step
        return self.report.points[-1].step if self.report.points else None


def parse_report(body: bytes, content_type: str | None) -> ParsedReport:
    """`body` read as its `content_type` says: an `ApiError` 415 for a type the gateway
    does not read, 422 for a body that is not a well-formed report."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in _MSGPACK_TYPES:
        return _parse_msgpack(body)
    if media in _JSON_TYPES or media.endswith("+json"):
        try:
            return ParsedReport(WorkerReport.model_validate_json(body))
        except ValidationError as exc:
            raise ApiError(422, f"not a WorkerReport: {describe_validation_error(exc)}") from None
    raise ApiError(
        415,
        "a worker report is JSON (Content-Type: application/json) or msgpack"
        f" ({MSGPACK_TYPE}), not {media[:80]!r}",
    )


def _decode(body: bytes) -> tuple[Any, bytes | None]:
    """The body decoded, and the bytes its columns were encoded in (kept as they came:
    the store keeps them, so they are never encoded again). Key by key, to know where the
    columns lie; anything but a map of string keys with nothing after it is decoded
    again in one call, which refuses it as it always did."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=len(body) or 1)
    unpacker.feed(body)
    try:
        data: dict[str, Any] = {}
        raw_columns = None
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if not isinstance(key, str):
                raise ValueError("a key that is not a string")
            start = unpacker.tell()
            data[key] = unpacker.unpack()
            if key == COLUMNS_KEY:
                raw_columns = body[start : unpacker.tell()]
        if unpacker.tell() != len(body):
            raise ValueError("extra data")
        return data, raw_columns
    except (ValueError, TypeError, msgpack.UnpackException):
        return msgpack.unpackb(body, raw=False, strict_map_key=True), None


def _parse_msgpack(body: bytes) -> ParsedReport:
    try:
        data, raw_columns = _decode(body)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ApiError(
            422, f"not a msgpack WorkerReport: the body does not decode ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise ApiError(422, f"not a msgpack WorkerReport: a map, not {type(data).__name__}")
    columns = data.pop(COLUMNS_KEY, None)
    if columns is not None and data.get("points"):
        raise ApiError(
            422, "a report carries its points as 'columns' or as 'points', not both: send one"
        )
    try:
        report = WorkerReport.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, f"not a WorkerReport: {describe_validation_error(exc)}") from None
    if columns is None:
        return ParsedReport(report, body_format="msgpack")
    try:
        checked = PointColumns.check(columns, raw=raw_columns)
    except ValueError as exc:
        raise ApiError(422, f"not a WorkerReport: {exc}") from None
    return ParsedReport(report, checked if checked.num_points else None, "msgpack")
