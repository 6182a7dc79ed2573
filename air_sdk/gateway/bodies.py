"""JSON request bodies: read after authentication, parsed and validated off the event
loop, refused with an answer of bounded size.

FastAPI parses a body parameter (`spec: JobSpec`) on the event loop, before the
route's dependencies run: any caller, with a token or not, made the gateway parse and
validate whatever it sent while every other request waited (issue 14: one 8 MB body
of 700k unknown keys held `/v1/health` for 15.6 s and was answered with 28 MB of
errors). Routes with a body therefore declare it with `json_body(Model)` for the
OpenAPI schema and read it themselves with `parse_model` in a worker thread, after
the token is checked. What that still costs is bounded by the body caps
(`RequestLimits`), by the schema (`air_sdk.schema._guards`: one error for any number
of unknown keys) and here: an error answer lists at most `MAX_LISTED_ERRORS`
problems of at most `MAX_ERROR_CHARS` characters each, and never echoes the input.

Example:
    >>> from air_sdk.schema import TenantCreate
    >>> parse_model(TenantCreate, b'{"name": "acme"}').name
    'acme'
    >>> parse_model(TenantCreate, b'{"nmae": "acme"}')
    Traceback (most recent call last):
    ...
    air_sdk.errors.ApiError: name: Field required; nmae: Extra inputs are not permitted (HTTP 422)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from email.message import Message
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from air_sdk.errors import ApiError

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_LISTED_ERRORS",
    "add_body_schemas",
    "describe_errors",
    "describe_validation_error",
    "json_body",
    "parse_model",
]

#: problems an error answer lists before "and N more"
MAX_LISTED_ERRORS = 20
#: characters of one listed problem (its location and message), and of one key in it
MAX_ERROR_CHARS = 200
_MAX_KEY_CHARS = 40

_M = TypeVar("_M", bound=BaseModel)
#: models routes declared with json_body: their schemas go into the OpenAPI components
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads a `model` body itself (`parse_model`).

    Example:
        >>> from air_sdk.schema import TenantCreate
        >>> json_body(TenantCreate)["requestBody"]["content"]["application/json"]
        {'schema': {'$ref': '#/components/schemas/TenantCreate'}}
    """
    _BODY_MODELS[model.__name__] = model
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def add_body_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """Add the schemas of every `json_body` model (and the models they use) to an OpenAPI
    document's components, where FastAPI did not put them already."""
    if not _BODY_MODELS:
        return openapi
    _, top = models_json_schema(
        [(m, "validation") for m in _BODY_MODELS.values()],
        ref_template="#/components/schemas/{model}",
    )
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    return openapi


def parse_model(model: type[_M], body: bytes, content_type: str | None = None) -> _M:
    """`body` as a `model`, or an `ApiError` (422) whose message says what to change.
    Blocking (jiter parses under the GIL): call it from a worker thread."""
    if content_type and not _is_json(content_type):
        raise ApiError(
            422, f"the body must be JSON (Content-Type: application/json), not {content_type:.60}"
        )
    if not body:
        raise ApiError(422, f"the body is empty: send a {model.__name__} as JSON")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise ApiError(422, describe_validation_error(exc)) from None


def _is_json(content_type: str) -> bool:
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem ("field: what is wrong"), at most MAX_LISTED_ERRORS of them.

    Listing every error of a body that has hundreds of thousands (pydantic's
    `errors()` makes a dict each) would cost more than validating it; past a few times
    the limit, the first ones are read from pydantic's own JSON of them instead.

    Example:
        >>> from air_sdk.schema import TenantCreate
        >>> try:
        ...     TenantCreate.model_validate({"name": "Acme"})
        ... except ValidationError as exc:
        ...     print(describe_validation_error(exc))
        name: tenant 'Acme' must be 1-63 characters of lowercase letters, digits, '_' or '-', starting with a letter or digit
    """
    total = exc.error_count()
    if total <= 4 * MAX_LISTED_ERRORS:
        errors: list[Mapping[str, Any]] = list(
            exc.errors(include_url=False, include_input=False, include_context=False)
        )
    else:
        errors = _first_errors(exc, MAX_LISTED_ERRORS)
    return describe_errors(errors, total=total)


def _first_errors(exc: ValidationError, n: int) -> list[Mapping[str, Any]]:
    text = exc.json(include_url=False, include_input=False, include_context=False)
    decoder = json.JSONDecoder()
    found: list[Mapping[str, Any]] = []
    at = 1  # past the "["
    while len(found) < n and at < len(text):
        while at < len(text) and text[at] in ", \n\t":
            at += 1
        if at >= len(text) or text[at] == "]":
            break
        item, at = decoder.raw_decode(text, at)
        found.append(item)
    return found


def describe_errors(errors: Iterable[Mapping[str, Any]], *, total: int | None = None) -> str:
    """`errors` (pydantic's dicts: loc, msg) as one bounded line each, joined by "; ".

    Example:
        >>> describe_errors([{"loc": ("body", "resources", "nodes"), "msg": "too big"}])
        'resources.nodes: too big'
        >>> describe_errors([{"loc": ("x",), "msg": "bad"}] * 30).endswith("x: bad; and 10 more")
        True
    """
    lines: list[str] = []
    count = 0
    for err in errors:
        count += 1
        if len(lines) < MAX_LISTED_ERRORS:
            lines.append(_one_line(err))
    total = max(total or 0, count)
    if total > len(lines):
        lines.append(f"and {total - len(lines)} more")
    return "; ".join(lines) or "invalid request"


def _one_line(err: Mapping[str, Any]) -> str:
    loc: Sequence[Any] = err.get("loc") or ()
    # A location can hold the caller's own key (an env name): quote it short.
    where = ".".join(_short(str(p)) for p in loc if p != "body")
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    line = f"{where}: {msg}" if where else msg
    if len(line) > MAX_ERROR_CHARS:
        line = line[: MAX_ERROR_CHARS - 3] + "..."
    return line


def _short(part: str) -> str:
    return part if len(part) <= _MAX_KEY_CHARS else part[:_MAX_KEY_CHARS] + "..."
