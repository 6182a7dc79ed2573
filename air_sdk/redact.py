"""What counts as a secret, and hiding it: env values whose names say so, and AIR tokens.

One definition serves every layer: the store keeps secret env values out of its
database and scrubs failure records, the gateway never answers with one and
scrubs worker log lines at ingest, the Kubernetes renderer moves them into a
Secret, and a notebook cell refuses to carry one in its pickle. A value is
replaced by `REDACTED`.

* An env var is secret when its NAME says so (`is_secret_name`, the one rule
  every part of AIR uses: `SECRET_NAME`, case-insensitive: `WANDB_API_KEY`,
  `hf_token`, `DB_PASSWORD`, `MYSQL_PWD`, `HTTP_AUTH`), or when its value holds
  an AIR token.
* An AIR token is `air_` (users) or `airw_` (workers) and 43 url-safe base64
  characters (`secrets.token_urlsafe(32)`: 256 random bits); `TOKEN_PATTERN`
  finds one in any text.
* In free text (log lines, failure tails) a secret value is replaced wherever it
  occurs, once it is at least `MIN_FREE_TEXT_CHARS` long: replacing every "1" of a
  log because `API_KEY=1` would destroy the log and protect nothing.

Example:
    >>> redact_env({"WANDB_API_KEY": "k-123", "LR": "0.1"})
    {'WANDB_API_KEY': '***', 'LR': '0.1'}
    >>> Redactor(["k-123"]).text("login with k-123 ok")
    'login with *** ok'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MIN_FREE_TEXT_CHARS",
    "REDACTED",
    "SECRET_NAME",
    "SECRET_NAME_PARTS",
    "TOKEN_PATTERN",
    "TOKEN_PATTERN_BYTES",
    "Redactor",
    "is_secret_env",
    "is_secret_name",
    "redact_env",
    "secret_values",
]

REDACTED = "***"
#: an env name holding one of these (any case) marks its value secret
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSW", "CREDENTIAL")
#: the whole rule: the parts anywhere; AUTH too (HTTP_AUTH, AUTHORIZATION) but not
#: AUTHOR (GIT_AUTHOR_NAME); PWD as a word after "_" (MYSQL_PWD), not PWD or OLDPWD
#: (directories). Matched against the upper-cased name.
SECRET_NAME = re.compile("|".join(SECRET_NAME_PARTS) + r"|AUTH(?!OR(?!IZ))|(?<=_)PWD(?![A-Z0-9])")
MIN_FREE_TEXT_CHARS = 4

_TOKEN = r"(?<![A-Za-z0-9_-])airw?_[A-Za-z0-9_-]{43}"
TOKEN_PATTERN = re.compile(_TOKEN)
TOKEN_PATTERN_BYTES = re.compile(_TOKEN.encode())


def is_secret_name(name: str) -> bool:
    """True for env names that say they hold a secret.

    Example:
        >>> is_secret_name("HF_TOKEN"), is_secret_name("db_password"), is_secret_name("LR")
        (True, True, False)
        >>> is_secret_name("GITHUB_AUTH"), is_secret_name("GIT_AUTHOR_NAME")
        (True, False)
    """
    return SECRET_NAME.search(name.upper()) is not None


def is_secret_env(name: str, value: str) -> bool:
    """True when the env var must never be shown or stored in the clear.

    Example:
        >>> is_secret_env("OPENAI_API_KEY", "x"), is_secret_env("LR", "0.1")
        (True, False)
    """
    return is_secret_name(name) or TOKEN_PATTERN.search(value) is not None


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of `env` that are secret (to scrub them from free text).

    Example:
        >>> secret_values({"API_KEY": "abcd", "LR": "0.1"})
        ['abcd']
    """
    return [value for name, value in env.items() if is_secret_env(name, value)]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as an answer may show it: secret values become `REDACTED`, tokens in the
    others too.

    Example:
        >>> redact_env({"HF_TOKEN": "hf_abc", "EPOCHS": "3"})
        {'HF_TOKEN': '***', 'EPOCHS': '3'}
    """
    return {
        name: REDACTED if is_secret_name(name) else TOKEN_PATTERN.sub(REDACTED, value)
        for name, value in env.items()
    }


class Redactor:
    """Replaces given secret values, and every AIR token, in text and JSON-like data.

    Example:
        >>> r = Redactor(["hunter22"])
        >>> r.value({"lines": ["pw=hunter22"], "n": 1})
        {'lines': ['pw=***'], 'n': 1}
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        literal = sorted(
            {v for v in values if len(v) >= MIN_FREE_TEXT_CHARS}, key=len, reverse=True
        )
        self.num_values = len(literal)
        # Longest first, so a secret that contains another is replaced whole.
        parts = [re.escape(v) for v in literal] + [_TOKEN]
        self._pattern = re.compile("|".join(parts)) if literal else TOKEN_PATTERN
        # Substring tests are far faster than the regex: most text holds none of these.
        self._markers = (*literal, "air_", "airw_")

    def _may_hold_secret(self, text: str) -> bool:
        return any(marker in text for marker in self._markers)

    def text(self, text: str) -> str:
        """`text` with every secret replaced."""
        return self._pattern.sub(REDACTED, text) if self._may_hold_secret(text) else text

    def lines(self, lines: list[str]) -> list[str]:
        """Each line with every secret replaced."""
        if not self._may_hold_secret("\n".join(lines)):
            return list(lines)
        sub = self._pattern.sub
        return [sub(REDACTED, line) for line in lines]

    def value(self, data: Any) -> Any:
        """A copy of JSON-like `data` (dicts, lists, strings) with every string scrubbed;
        dict keys too."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {
                (self.text(k) if isinstance(k, str) else k): self.value(v) for k, v in data.items()
            }
        if isinstance(data, list | tuple):
            return [self.value(v) for v in data]
        return data
