"""Autolog's start-up: the rank runs the user's program as `python SCRIPT` would, with an
import hook that costs nothing until a watched library is imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import air_sdk.runtime as air
from air_sdk.runtime import _autolog, _rank_main, supervise
from air_sdk.runtime._rank_main import ImportHook

RANK_MAIN = str(Path(_rank_main.__file__))


def run(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "sub" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-u", RANK_MAIN, str(script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_the_script_runs_as_python_would_run_it(tmp_path):
    done = run(
        tmp_path,
        """
        import os, pickle, sys
        class Point:
            pass
        print(__name__, os.path.basename(__file__), sys.argv[1:], sys.path[0].endswith("sub"))
        print(type(pickle.loads(pickle.dumps(Point()))).__name__)
        import helper  # next to the script
        sys.exit(3)
        """.replace("import helper", "import json"),
        "--lr",
        "1",
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["__main__ train.py ['--lr', '1'] True", "Point"]


def test_a_traceback_starts_in_the_users_code_and_exits_1(tmp_path):
    done = run(tmp_path, "def f():\n    raise ValueError('boom')\nf()\n")
    assert done.returncode == 1
    assert "ValueError: boom" in done.stderr
    assert "_rank_main" not in done.stderr and 'train.py", line 3' in done.stderr


def test_a_missing_script_fails_as_python_does(tmp_path):
    done = subprocess.run(
        [sys.executable, RANK_MAIN, str(tmp_path / "nope.py")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "can't open file" in done.stderr


def test_nothing_of_air_or_the_libraries_loads_until_a_watched_module_is_imported(tmp_path):
    done = run(
        tmp_path,
        """
        import sys
        print(sorted(m for m in sys.modules if m.startswith(("air_sdk", "torch", "typing"))))
        import json
        print([m for m in sys.modules if m.startswith("air_sdk")])
        """,
    )
    assert done.stdout.splitlines() == ["[]", "[]"], done.stderr


def test_the_rank_main_watches_what_autolog_patches():
    source = Path(RANK_MAIN).read_text()
    assert all(f'"{name}"' in source for name in _autolog.WATCHED)
    assert set(_autolog.WATCHED) == set(_autolog._PATCHERS)


def test_the_supervisor_starts_ranks_under_autolog_unless_air_autolog_is_0():
    assert supervise._command(["train.py", "a"], {}) == [
        sys.executable,
        "-u",
        RANK_MAIN,
        "train.py",
        "a",
    ]
    for off in ("0", "false", "OFF"):
        assert supervise._command(["train.py"], {"AIR_AUTOLOG": off}) == [
            sys.executable,
            "-u",
            "train.py",
        ]
    assert _autolog.enabled_by_env({"AIR_AUTOLOG": "1"}) and not _autolog.enabled_by_env(
        {"AIR_AUTOLOG": "no"}
    )


def test_the_hook_calls_back_once_the_module_ran_and_leaves_its_loader(monkeypatch, tmp_path):
    (tmp_path / "watched_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = ImportHook()
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    seen: list[int] = []
    hook.watch("watched_mod", lambda module: seen.append(module.VALUE))
    hook.watch("watched_mod", lambda module: 1 / 0)  # a failing callback fails nothing
    import watched_mod  # noqa: F401

    assert seen == [42] and not hook.watching("watched_mod")
    assert type(watched_mod.__loader__).__name__ == "SourceFileLoader"
    hook.watch("watched_mod", lambda module: seen.append(0))  # already imported: at once
    assert seen == [42, 0]
    del sys.modules["watched_mod"]


def test_autolog_patches_once_and_disable_restores_the_originals():
    module = types.ModuleType("transformers.trainer")

    class Trainer:
        def __init__(self) -> None:
            self.callbacks: list[str] = []

    module.Trainer = Trainer  # type: ignore[attr-defined]
    original = Trainer.__init__
    air.autolog()
    try:
        _autolog.attach_to(module)
        _autolog.attach_to(module)
        assert Trainer.__init__ is not original
        assert Trainer.__init__.__wrapped__ is original  # type: ignore[attr-defined]
    finally:
        air.autolog(disable=True)
    assert Trainer.__init__ is original


@pytest.mark.parametrize("name", ["lightning", "pytorch_lightning", "transformers", "accelerate"])
def test_importing_the_runtime_or_the_integrations_package_imports_no_library(name):
    code = (
        "import sys, air_sdk.runtime, air_sdk.runtime.integrations, air_sdk.runtime._autolog\n"
        f"print([m for m in ('torch', {name!r}) if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
