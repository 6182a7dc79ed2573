"""Fixtures of the `air` command's unit tests; the fake gateway is in tests/clitest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitest import FakeGateway, install_fake_gateway, write_script


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeGateway:
    """A fake gateway every `air` command in the test talks to."""
    return install_fake_gateway(monkeypatch, tmp_path)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """train.py in a fresh working directory."""
    return write_script(tmp_path, monkeypatch)
