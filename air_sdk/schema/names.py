"""What a name may hold: jobs, pools, accelerators, tenants, nodes, env vars, ids.

One place, checked one way: `is_valid(PATTERN, value)` is `PATTERN.fullmatch`. The
patterns carry no anchors on purpose: `re.match(r"^[a-z]+$", "nl\\n")` matches,
because `$` also matches before a trailing newline, and that let a job named
`"nl\\n"` be created that no route could reach or cancel (issue 14). `json_pattern`
adds `^...$` for JSON Schema (OpenAPI), where `$` (ECMA-262, and pydantic's Rust
regex) means the end of the input only.

Free-text labels (a token's name) may hold any printable character; `control_chars`
finds the ones they may not: Unicode controls and format characters (`\\n`, `\\x1b`,
NUL, bidi overrides that make a terminal show other text than is stored) and line
or paragraph separators.

Example:
    >>> is_valid(NAME, "mnist-2"), is_valid(NAME, "nl\\n")
    (True, False)
    >>> control_chars("ok\\u202etxt.exe")
    ['\\u202e']
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "ACCELERATOR",
    "ENV_NAME",
    "IDEMPOTENCY_KEY",
    "JOB_ID",
    "NAME",
    "NODE",
    "SHA256",
    "TENANT",
    "TOKEN_ID",
    "control_chars",
    "is_valid",
    "json_pattern",
    "shown",
]

#: job names and pool names: 1-63 of [A-Za-z0-9._-], starting with a letter or digit
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: accelerator types ("a100", "h100", "cpu", "gpu")
ACCELERATOR = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
#: tenants: lowercase, so "Acme" and "acme" cannot be two tenants
TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
#: environment variable names
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: content addresses of bundles
SHA256 = re.compile(r"[0-9a-f]{64}")
#: job ids as the store makes them (`<name[:24]>-<8 hex>`), with room to spare
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,80}")
#: node names (a cluster file's, or a Ray node's)
NODE = re.compile(r"[A-Za-z0-9._-]{1,128}")
#: token ids (uuid4 hex)
TOKEN_ID = re.compile(r"[0-9a-f]{32}")
#: Idempotency-Key header values: printable ASCII (a uuid4 by default)
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,200}")

_LINE_BREAKS = frozenset({"Zl", "Zp"})
#: how much of a refused value an error message quotes
SHOWN_CHARS = 40


def is_valid(pattern: re.Pattern[str], value: object) -> bool:
    """True when `value` is a string that `pattern` matches whole.

    Example:
        >>> is_valid(TENANT, "acme"), is_valid(TENANT, "default\\n"), is_valid(TENANT, 3)
        (True, False, False)
    """
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def json_pattern(pattern: re.Pattern[str]) -> str:
    """`pattern` anchored for JSON Schema.

    Example:
        >>> json_pattern(SHA256)
        '^[0-9a-f]{64}$'
    """
    return f"^{pattern.pattern}$"


def control_chars(text: str) -> list[str]:
    """The characters of `text` a label must not hold (each once, in order).

    Example:
        >>> control_chars("a\\tb\\x1b[31mc")
        ['\\t', '\\x1b']
    """
    found: dict[str, None] = {}
    for ch in text:
        category = unicodedata.category(ch)
        if category[0] == "C" or category in _LINE_BREAKS:
            found[ch] = None
    return list(found)


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error message quotes it: repr'd (control characters visible) and cut,
    so a refused megabyte is not sent back in the answer.

    Example:
        >>> shown("nl\\n"), shown("x" * 100, limit=5)
        ("'nl\\\\n'", "'xxxxx'... (100 characters)")
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
