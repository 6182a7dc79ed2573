"""The import rules of the architecture, checked on the source (AST), so a new import
that breaks a layer fails here rather than in a deployment."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import air_sdk

ROOT = Path(air_sdk.__file__).parent

# package -> prefixes it must never import (at module level or inside functions)
FORBIDDEN = {
    "schema": ["air_sdk.", "fastapi", "torch", "requests"],
    "scheduler": [
        "air_sdk.store",
        "air_sdk.gateway",
        "air_sdk.runner",
        "air_sdk.client",
        "fastapi",
        "requests",
        "sqlite3",
        "torch",
    ],
    "store": ["air_sdk.gateway", "air_sdk.runner", "air_sdk.client", "fastapi", "torch"],
    "runner": ["air_sdk.gateway", "air_sdk.client", "fastapi"],
    "client": [
        "air_sdk.gateway",
        "air_sdk.runner",
        "air_sdk.store",
        "torch",
        "ipywidgets",
        "fastapi",
    ],
    "runtime": [
        "air_sdk.gateway",
        "air_sdk.runner",
        "air_sdk.store",
        "air_sdk.client",
        "fastapi",
        "uvicorn",
    ],
    "bundle": ["air_sdk.gateway", "air_sdk.runner", "air_sdk.store", "air_sdk.client", "torch"],
    "planner": [
        "air_sdk.gateway",
        "air_sdk.runner",
        "air_sdk.store",
        "air_sdk.client",
        "air_sdk.runtime",
        "fastapi",
        "torch",
    ],
    "render": [
        "air_sdk.gateway",
        "air_sdk.runner",
        "air_sdk.store",
        "air_sdk.client",
        "torch",
        "kubernetes",
    ],
}
ALLOWED_SCHEMA_IMPORTS = ("air_sdk.schema",)


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_rules(package):
    offenders = []
    for path in (ROOT / package).rglob("*.py"):
        for name in imports_of(path):
            if package == "schema" and name.startswith(ALLOWED_SCHEMA_IMPORTS):
                continue
            for prefix in FORBIDDEN[package]:
                if (
                    name == prefix.rstrip(".")
                    or name.startswith(prefix.rstrip(".") + ".")
                    or (prefix.endswith(".") and name.startswith(prefix))
                ):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_import_air_sdk_stays_light():
    code = (
        "import sys, air_sdk, air_sdk.runtime, air_sdk.client\n"
        "heavy = [m for m in ('torch', 'fastapi', 'uvicorn', 'ipywidgets', 'air_sdk.gateway',"
        " 'air_sdk.store', 'air_sdk.runner') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_all_is_sorted_and_complete():
    assert list(air_sdk.__all__) == sorted(air_sdk.__all__)
    for name in air_sdk.__all__:
        assert getattr(air_sdk, name) is not None


def _is_ray(name: str) -> bool:
    return name == "ray" or name.startswith("ray.")


def test_only_the_ray_backend_imports_ray_and_only_lazily():
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        ray_module = rel.parts[:2] == ("runner", "backends") and "ray" in path.stem
        if not ray_module:
            offenders += [f"{rel} imports {n}" for n in imports_of(path) if _is_ray(n)]
            continue
        for node in ast.parse(path.read_text()).body:  # module level: must stay lazy
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            offenders += [f"{rel} imports {n} at module level" for n in names if _is_ray(n)]
    assert offenders == []


def test_importing_the_runner_and_gateway_does_not_import_ray():
    code = (
        "import sys, air_sdk.runner, air_sdk.runner.backends, air_sdk.gateway.server\n"
        "import air_sdk.runner.backends.ray, air_sdk.runner.backends.ray_node\n"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
