"""`air --help` stays fast: the CLI module pulls in no server, torch or store code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FORBIDDEN = ("fastapi", "uvicorn", "torch", "air_sdk.gateway", "air_sdk.runner", "air_sdk.store")


def test_cli_import_is_light() -> None:
    code = "import sys, json, air_sdk.cli.main; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    assert [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)] == []
