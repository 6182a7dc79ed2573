"""The import rules of the architecture (docs/architecture.md, "Import direction"),
checked on the source (AST) for every package, so a new import that breaks a layer
fails here rather than in a deployment."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import air_sdk

ROOT = Path(air_sdk.__file__).parent
REPO = ROOT.parent


@dataclass(frozen=True)
class Rule:
    """What the code of one package may import."""

    #: parts of air_sdk it may import anywhere (packages, or dotted modules inside them)
    may: frozenset[str]
    #: parts of air_sdk it may import only inside functions (lazily) or for type checking
    lazily: frozenset[str] = frozenset()
    #: third-party packages it must never import
    never: frozenset[str] = frozenset()


def rule(may: str = "", lazily: str = "", never: str = "") -> Rule:
    return Rule(frozenset(may.split()), frozenset(lazily.split()), frozenset(never.split()))


SERVER = "fastapi starlette uvicorn sqlite3"
NOTEBOOK_UI = "ipywidgets IPython matplotlib"

#: every package (and top-level module) of air_sdk, and magics
RULES: dict[str, Rule] = {
    # the wire contract: pydantic only
    "schema": rule("schema", never=f"{SERVER} torch requests typer rich {NOTEBOOK_UI}"),
    "errors": rule(never=f"{SERVER} torch requests pydantic"),
    # the URL ranks report to, read lazily through the rank's env contract
    "config": rule("errors", lazily="schema.worker_env", never=f"{SERVER} torch requests"),
    "gateway_config": rule("config errors", never=f"{SERVER} torch requests"),
    "redact": rule("", never=f"{SERVER} torch requests"),
    "text": rule("", never=f"{SERVER} torch requests pydantic"),
    "procs": rule("", never=f"{SERVER} torch requests pydantic"),
    "bundle": rule("errors", never=f"{SERVER} torch requests"),
    # pure decisions: no HTTP, SQL or torch
    "scheduler": rule("schema errors text", never=f"{SERVER} torch requests"),
    "store": rule("schema redact errors", never="fastapi starlette uvicorn torch requests"),
    # imported by training code inside workers: no server code
    "runtime": rule(
        "runtime schema errors", lazily="planner", never=f"{SERVER} typer {NOTEBOOK_UI}"
    ),
    "runner": rule(
        "runner scheduler store schema errors redact text procs runtime planner",
        lazily="bundle config",  # config: the client config dir a sandbox hides
        never=f"fastapi starlette uvicorn requests {NOTEBOOK_UI}",
    ),
    # tracker exports, run by the gateway from the event log; the trackers' libraries only
    # in the worker process (writers import them inside the writer they serve)
    "export": rule(
        "export schema store", never=f"fastapi starlette uvicorn requests typer {NOTEBOOK_UI}"
    ),
    # the HTTP face may use everything below it; of the client only the local-gateway helper
    "gateway": rule(
        "gateway runner store scheduler schema bundle redact errors config gateway_config"
        " client.local_gateway client.ports planner procs export",
        # the /ui page's job view: the notebook monitor's renderer, one renderer two faces
        lazily="notebook.snapshot_html notebook.chart",
        never=f"torch typer {NOTEBOOK_UI}",
    ),
    # the SDK: runs anywhere Python and requests do; the monitor only inside Job.monitor()
    "client": rule(
        "client schema errors config gateway_config bundle text procs",
        lazily="notebook.monitor",
        never=f"{SERVER} torch typer rich {NOTEBOOK_UI}",
    ),
    # cell and function packaging and the views; the bundle's file reader only when sending
    "notebook": rule(
        "notebook client schema errors redact text",
        lazily="bundle",
        never=f"{SERVER} torch typer rich",
    ),
    # the CLI reaches the server only inside the commands that start one (`air --help` stays fast)
    "cli": rule(
        "cli client schema errors config gateway_config text",
        lazily="gateway.server manifests bundle examples checkpoints planner runtime.data",
        never=f"{SERVER} torch {NOTEBOOK_UI}",
    ),
    # `air checkpoints export` on the client side: the runtime's reader only when exporting
    "checkpoints": rule("errors", lazily="client runtime schema", never=SERVER),
    # the memory and layout planner: pure arithmetic over the schema's layout
    "planner": rule("planner schema", never=f"{SERVER} torch requests {NOTEBOOK_UI}"),
    "manifests": rule("manifests schema errors redact", never=f"{SERVER} torch kubernetes"),
    "examples": rule("runtime", never=SERVER),
    "__init__": rule("errors", lazily="client schema planner notebook.function"),
    # `python -m air_sdk`: the `air` command
    "__main__": rule("cli", never=f"{SERVER} torch {NOTEBOOK_UI}"),
    # thin: parse, call the client or the notebook helpers; never the gateway
    "magics": rule("client notebook schema errors config text", never=f"{SERVER} torch typer"),
}


def _sources(package: str) -> list[Path]:
    if package == "magics":
        return sorted((REPO / "magics").rglob("*.py"))
    if (ROOT / package).is_dir():
        return sorted((ROOT / package).rglob("*.py"))
    return [ROOT / f"{package}.py"]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module, imported at module level when the module runs) for every import."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, eager) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                # `from air_sdk.client import local_gateway` imports air_sdk.client.local_gateway
                found.extend((f"{child.module}.{a.name}", eager) for a in child.names)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:  # only for the type checker: never runs
                    visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), eager)
            else:
                visit(child, eager)

    visit(ast.parse(path.read_text()), True)
    return found


def _covered(name: str, allowed: frozenset[str]) -> bool:
    """`air_sdk.<name>` is one of `allowed` (a package, or a module inside one)."""
    return any(name == a or name.startswith(a + ".") for a in allowed)


def test_every_package_has_a_rule():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    modules = {p.stem for p in ROOT.glob("*.py")}
    assert sorted(packages | modules | {"magics"}) == sorted(RULES)


@pytest.mark.parametrize("package", sorted(RULES))
def test_layer_rules(package):
    rule_ = RULES[package]
    own = frozenset({package})  # a package may always import its own modules
    offenders = []
    for path in _sources(package):
        where = path.relative_to(REPO)
        for name, eager in imports_of(path):
            top = name.split(".")[0]
            if top in rule_.never:
                offenders.append(f"{where} imports {name}")
            if top != "air_sdk" or name in ("air_sdk", "air_sdk.__version__"):
                continue
            inner = name.removeprefix("air_sdk.")
            if _covered(inner, rule_.may | own) or (not eager and _covered(inner, rule_.lazily)):
                continue
            how = "at module level" if eager and _covered(inner, rule_.lazily) else ""
            offenders.append(f"{where} imports {name} {how}".rstrip())
    assert offenders == []


def test_the_rules_find_a_broken_layer(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import fastapi\nfrom air_sdk.gateway import app\n"
        "def f():\n    from air_sdk.notebook.monitor import JobMonitor\n"
        "if TYPE_CHECKING:\n    from air_sdk.runner import Runner\n"
    )
    assert imports_of(bad) == [
        ("fastapi", True),
        ("air_sdk.gateway.app", True),
        ("air_sdk.notebook.monitor.JobMonitor", False),
        ("air_sdk.runner.Runner", False),
    ]


def test_import_air_sdk_stays_light():
    code = (
        "import sys, air_sdk, air_sdk.runtime, air_sdk.client\n"
        "heavy = [m for m in ('torch', 'fastapi', 'uvicorn', 'ipywidgets', 'air_sdk.gateway',"
        " 'air_sdk.store', 'air_sdk.runner') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_magics_and_their_helpers_load_no_gateway():
    code = (
        "import sys, magics.air, air_sdk.client.local_gateway, air_sdk.notebook.submit,"
        " air_sdk.notebook.function\n"
        "print(sorted(m for m in sys.modules if m.startswith(('air_sdk.gateway.', 'fastapi',"
        " 'air_sdk.runner', 'air_sdk.store', 'uvicorn'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
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
        for name, eager in imports_of(path):
            if not _is_ray(name):
                continue
            if not ray_module:
                offenders.append(f"{rel} imports {name}")
            elif eager:
                offenders.append(f"{rel} imports {name} at module level")
    assert offenders == []


def test_importing_the_runner_and_gateway_does_not_import_ray():
    code = (
        "import sys, air_sdk.runner, air_sdk.runner.backends, air_sdk.gateway.server\n"
        "import air_sdk.runner.backends.ray, air_sdk.runner.backends.ray_node\n"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
