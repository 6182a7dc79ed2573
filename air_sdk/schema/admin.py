"""Bodies of the admin API (`/v1/admin/...`): tenants, tokens and node health.

Roles, from least to most:

| role     | may                                                                      |
|----------|--------------------------------------------------------------------------|
| `viewer` | read its tenant's jobs, events, logs, metrics, checkpoints, the cluster  |
| `member` | + submit and cancel its tenant's jobs, upload bundles                    |
| `admin`  | + manage its tenant's tokens; an admin of the system tenant (`default`)  |
|          |   also creates tenants, manages every tenant's tokens and clears nodes   |
| `metrics`| read `/metrics` (Prometheus) and nothing else; only the system admin     |
|          |   issues one, in the system tenant (the metrics cover every tenant)      |

Example:
    >>> TokenCreate(role="viewer", name="dashboard").role
    'viewer'
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from air_sdk.schema._guards import WireModel
from air_sdk.schema.names import TENANT, control_chars, is_valid, json_pattern, shown

#: every role a token can have: the users' roles, least powerful first, then the scraper's
ROLES = ("viewer", "member", "admin", "metrics")
Role = Literal["viewer", "member", "admin", "metrics"]

MAX_TOKEN_NAME_CHARS = 200


class _Wire(WireModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_tenant(v: str) -> str:
    if not is_valid(TENANT, v):
        raise ValueError(
            f"tenant {shown(v)} must be 1-63 characters of lowercase letters, digits, '_' or '-',"
            " starting with a letter or digit"
        )
    return v


class TenantCreate(_Wire):
    name: str = Field(
        description="1-63 of [a-z0-9_-], starting with a letter or digit.",
        json_schema_extra={"pattern": json_pattern(TENANT)},
    )

    _name_ok = field_validator("name")(_check_tenant)


class TenantInfo(_Wire):
    id: str
    created_at: float
    #: charged failures (crashes, hangs) of its jobs over the last hour
    crashes_last_hour: int = 0
    #: its restart allowance (`max_restarts_per_hour` in the cluster file); None: no cap
    max_restarts_per_hour: int | None = None


class TenantList(_Wire):
    tenants: list[TenantInfo]


class TokenCreate(_Wire):
    """A token to issue; `tenant` defaults to the caller's own."""

    tenant: str | None = Field(
        None,
        description="Default: the caller's own.",
        json_schema_extra={"pattern": json_pattern(TENANT)},
    )
    role: Role = "member"
    name: str = Field("", max_length=MAX_TOKEN_NAME_CHARS, description="A label for people.")

    @field_validator("tenant")
    @classmethod
    def _tenant_ok(cls, v: str | None) -> str | None:
        return None if v is None else _check_tenant(v)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        bad = control_chars(v)
        if bad:
            raise ValueError(
                f"token name {shown(v)} holds a control character ({bad[0]!r}): use printable text"
            )
        return v


class TokenInfo(_Wire):
    """A token as the gateway shows it: never its plaintext (it keeps only a digest)."""

    id: str
    tenant: str
    role: Role
    name: str = ""
    created_at: float
    revoked_at: float | None = None


class TokenCreated(_Wire):
    """The answer to issuing a token: the only time its plaintext is shown."""

    info: TokenInfo
    token: str


class TokenList(_Wire):
    tokens: list[TokenInfo]


class NodeProbe(_Wire):
    """The last run of the operator's node health probe (`air gateway start
    --node-probe`) on one node: a failure keeps the node out of placements."""

    ok: bool
    #: when it ended (unix time)
    at: float
    #: why it failed: its exit status and last output lines, or its timeout
    detail: str = ""


class NodeHealth(_Wire):
    """A node's failure record: `healthy` is False while the runner keeps it out of
    placements; clearing the record puts it back at once."""

    name: str
    num_failures: int = 0
    last_failure_at: float | None = None
    healthy: bool = True
    #: the last probe's result; None without a probe (or before its first run)
    probe: NodeProbe | None = None


class NodeHealthList(_Wire):
    nodes: list[NodeHealth]
