"""The client stays light: no server, torch or widget code behind `import air_sdk.client`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import air_sdk.client

REPO = Path(__file__).resolve().parents[3]
FORBIDDEN = ("fastapi", "uvicorn", "torch", "ipywidgets", "air_sdk.gateway", "air_sdk.runner")


def test_import_pulls_in_no_server_or_torch() -> None:
    code = "import sys, json, air_sdk.client; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    bad = [
        m
        for m in loaded
        if any(m == f or m.startswith(f + ".") for f in (*FORBIDDEN, "air_sdk.store"))
    ]
    assert bad == []


def test_all_is_sorted_and_complete() -> None:
    assert air_sdk.client.__all__ == sorted(air_sdk.client.__all__)
    assert set(air_sdk.client.__all__) == {"Client", "Job"}
    assert air_sdk.Client is air_sdk.client.Client
