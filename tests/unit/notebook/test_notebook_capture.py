"""Packaging a notebook cell: what travels, how it runs on a rank, what is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from air_sdk.errors import SpecError
from air_sdk.notebook.capture import (
    CELL_PICKLE,
    CellCaptureError,
    CellPackage,
    free_names,
    package_cell,
)


def notebook(*cells: str) -> dict[str, Any]:
    """A namespace as IPython builds it: earlier cells exec'd into a `__main__` dict."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for cell in cells:
        exec(textwrap.dedent(cell), namespace)
    return namespace


def run_on_worker(package: CellPackage, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the bootstrap as the runner does: `__air_main__.py` beside the files, cwd there."""
    (tmp_path / "__air_main__.py").write_text(package.code)
    for name, data in package.files.items():
        (tmp_path / name).write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k != "AIR_TEST_SECRET"}
    return subprocess.run(
        [sys.executable, "__air_main__.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


MODEL_CELL = """
    import torch
    from torch import nn

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 1)

        def forward(self, x):
            return self.fc(x) * SCALE
"""
HELPER_CELL = """
    import numpy as np
    import os.path as osp

    SCALE = 2.0
    offset = 100.0

    def make_batch(n):
        return torch.ones(n, 3) + offset
"""


# -- which names a cell uses ---------------------------------------------------------------


def test_free_names_are_reads_before_binding_at_module_level_and_globals_of_functions():
    source = textwrap.dedent(
        """
        x = load(path)
        y = x + 1
        total += y
        def step(batch):
            return model(batch) + y + scale
        for item in items:
            print(item)
        squares = [i * factor for i in range(n)]
        def count():
            global calls
            calls += 1
        """
    )
    assert free_names(source) == [
        "load",
        "path",
        "total",
        "model",
        "scale",
        "items",
        "print",
        "factor",
        "range",
        "n",
        "calls",
    ]


def test_a_name_the_cell_binds_later_is_not_taken_from_the_notebook_for_its_functions():
    source = "def step():\n    return model(1)\nmodel = make()\nstep()"
    assert free_names(source) == ["make"]


def test_a_cell_that_is_not_python_says_magics_do_not_run_on_workers():
    with pytest.raises(CellCaptureError, match=r"line 2 of the cell is not Python.*%magics"):
        package_cell("x = 1\n%time y = 2\n", {})


def test_capture_errors_are_spec_errors():
    assert issubclass(CellCaptureError, SpecError)


def test_ipython_names_and_builtins_are_not_captured():
    namespace = notebook("lr = 0.1")
    namespace.update({"In": ["", "lr = 0.1"], "Out": {}, "_i1": "lr = 0.1", "_": 3, "_3": 3})
    package = package_cell("print(In, Out, _i1, _, _3, lr, len([]))", namespace)
    assert package.captured == ["lr"]


# -- it runs on a worker -------------------------------------------------------------------


def test_a_cell_using_a_model_class_and_a_helper_from_earlier_cells_runs_on_a_worker(tmp_path):
    namespace = notebook(MODEL_CELL, HELPER_CELL)
    cell = textwrap.dedent(
        """
        offset = 0.0  # the helper from the earlier cell sees this rebinding, as in the notebook
        torch.manual_seed(0)
        model = TinyNet()
        batch = make_batch(4)
        out = model(batch)
        print("shape", tuple(out.shape), "batch", float(batch.sum()))
        print("module", type(model).__module__, __name__)
        print("np", np.arange(3).sum(), osp.join("a", "b"))
        """
    )
    package = package_cell(cell, namespace)

    assert set(package.captured) == {"TinyNet", "make_batch"}
    # os.path is posixpath: the worker imports the module the notebook had
    assert package.imports == ["import torch", "import numpy as np", "import posixpath as osp"]
    assert list(package.files) == [CELL_PICKLE]
    result = run_on_worker(package, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "shape (4, 1) batch 12.0" in result.stdout
    assert "module __main__ __main__" in result.stdout
    assert "np 3 a/b" in result.stdout


def test_shared_objects_stay_shared_and_a_failing_cell_shows_its_own_line(tmp_path):
    namespace = notebook("weights = [1, 2]\npair = (weights, weights)")
    cell = "print('shared', pair[0] is pair[1] is weights)\nx = 1\nraise ValueError('bad lr')\n"
    result = run_on_worker(package_cell(cell, namespace), tmp_path)
    assert "shared True" in result.stdout
    assert result.returncode == 1
    assert 'File "<air cell>", line 3, in <module>' in result.stderr
    assert "raise ValueError('bad lr')" in result.stderr
    assert "ValueError: bad lr" in result.stderr
    assert "__air_main__" not in result.stderr  # the bootstrap's frames are left out


def test_functions_imported_from_installed_modules_travel_by_reference(tmp_path):
    namespace = notebook("from json import dumps\nfrom collections import OrderedDict as OD")
    package = package_cell("print(dumps(OD(a=1)))", namespace)
    assert package.captured == ["dumps", "OD"]
    assert b"dumps" in package.files[CELL_PICKLE]  # a reference, not a copy of the code
    result = run_on_worker(package, tmp_path)
    assert result.stdout.strip() == '{"a": 1}', result.stderr


# -- what is refused -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (threading.Lock, "_thread.lock"),
        (lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM), "socket.socket"),
        (lambda: (i for i in range(3)), "generator"),
    ],
)
def test_a_value_that_cannot_be_pickled_is_named_with_what_to_do(make, kind):
    value = make()
    try:
        with pytest.raises(CellCaptureError) as info:
            package_cell("use(thing)", {"__name__": "__main__", "thing": value})
    finally:
        if isinstance(value, socket.socket):
            value.close()
    message = str(info.value)
    assert message.startswith(f"`thing` ({kind}) cannot be sent to the workers")
    assert message.endswith("create it inside the cell")


def test_a_database_connection_is_refused_by_name():
    import sqlite3

    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(CellCaptureError) as info:
            package_cell("conn.execute('select 1')", {"conn": conn})
    finally:
        conn.close()
    assert str(info.value) == (
        "`conn` (sqlite3.Connection) cannot be sent to the workers: create it inside the cell"
    )


def test_a_function_using_an_unpicklable_global_names_both():
    namespace = notebook(
        "import threading\nlock = threading.Lock()\ndef guarded():\n    with lock:\n        return 1"
    )
    with pytest.raises(CellCaptureError, match=r"`guarded` \(function\).*uses `lock`"):
        package_cell("guarded()", namespace)


def test_an_oversized_tensor_is_refused_before_pickling_with_the_advice():
    import torch

    namespace = notebook("")
    namespace["big"] = torch.zeros(1024)  # 4 KiB
    with pytest.raises(CellCaptureError) as info:
        package_cell("print(big.sum())", namespace, max_value_bytes=1024)
    assert str(info.value) == (
        "`big` is a 4 KiB tensor; the limit is 1 KiB: load it inside the cell"
        " (torch.load / a dataset path) or save it to a file and pass that with --files"
    )


def test_a_small_view_of_a_big_tensor_counts_its_whole_storage():
    import torch

    namespace = {"head": torch.zeros(4096)[:2]}  # pickling a view sends the whole storage
    with pytest.raises(CellCaptureError, match=r"`head` is a 16 KiB tensor"):
        package_cell("print(head)", namespace, max_value_bytes=1024)


def test_oversized_values_inside_containers_models_and_function_globals_are_named():
    import torch

    namespace = notebook(MODEL_CELL, "def predict(x):\n    return table[x]")
    namespace["batches"] = [torch.zeros(512), torch.zeros(512)]
    namespace["model"] = torch.nn.Linear(1024, 1)
    namespace["table"] = b"x" * 4096
    limit = 2048
    with pytest.raises(CellCaptureError, match=r"`batches` is a 4 KiB list"):
        package_cell("print(batches)", namespace, max_value_bytes=limit)
    with pytest.raises(CellCaptureError, match=r"`model` is a 4.0 KiB model \(Linear\)"):
        package_cell("model(x)", namespace, max_value_bytes=limit)
    with pytest.raises(
        CellCaptureError, match=r"`predict` \(function\) carries 4 KiB through `table`"
    ):
        package_cell("predict(1)", namespace, max_value_bytes=limit)


def test_an_object_of_unknown_size_is_stopped_while_pickling():
    class Blob:
        def __reduce__(self):
            return (bytes, (b"y" * 10_000,))

    with pytest.raises(CellCaptureError, match=r"`blob` \(.*Blob\) pickles to over 1 KiB"):
        package_cell("print(blob)", {"blob": Blob()}, max_value_bytes=1024)


# -- secrets -------------------------------------------------------------------------------


def test_the_notebooks_environment_never_travels(monkeypatch, tmp_path):
    monkeypatch.setenv("AIR_TEST_SECRET", "canary")
    namespace = notebook(
        "import os\nenv = os.environ\ndef home():\n    return os.environ.get('AIR_TEST_SECRET')"
    )
    package = package_cell("print('secret', home(), env.get('AIR_TEST_SECRET'))", namespace)

    assert "from os import environ as env" in package.imports
    for data in [package.code.encode(), *package.files.values()]:
        assert b"canary" not in data
    result = run_on_worker(package, tmp_path)  # a worker environment without the secret
    assert result.stdout.strip() == "secret None None", result.stderr


def test_a_value_holding_a_secret_from_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t-value")
    namespace = notebook("import os\nconfig = {'key': os.environ['WANDB_API_KEY']}")
    with pytest.raises(CellCaptureError) as info:
        package_cell("print(config)", namespace)
    message = str(info.value)
    assert "`config` holds the value of $WANDB_API_KEY" in message
    assert "--env WANDB_API_KEY=" in message
    assert "s3cr3t" not in message
