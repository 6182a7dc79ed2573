"""Fixtures of the gateway tests; the helpers behind them are in tests/gatewaytest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from gatewaytest import Tenancy, tenancy_for


@pytest.fixture
def tenancy(tmp_path: Path) -> Tenancy:
    """Tenant acme (owner, viewer, admin), tenant globex (other), the system admin."""
    return tenancy_for(tmp_path)
