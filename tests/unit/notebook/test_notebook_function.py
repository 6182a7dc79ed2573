"""`@air_sdk.distributed`: what a call packages and submits, how a rank runs it, what
is refused, and what the caller gets back (a mock transport plays the gateway)."""

from __future__ import annotations

import base64
import json
import linecache
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import cloudpickle
import pytest
import requests

import air_sdk
from air_sdk.client import Client, Job
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import CellCaptureError, SpecError
from air_sdk.notebook.capture import CELL_PICKLE, CellPackage, package_call
from air_sdk.notebook.function import DistributedFunction, distributed
from air_sdk.schema import Event, FunctionResult, JobRecord, JobSpec, JobState

REPO = Path(__file__).resolve().parents[3]


def notebook_function(source: str, name: str, **extra: Any) -> Any:
    """A function as a notebook cell defines it: `__main__` globals, and its source in
    linecache under the cell's file name (as IPython registers cells)."""
    filename = f"<ipython-input-{abs(hash(source))}>"
    source = textwrap.dedent(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "__main__", "get_ipython": object(), **extra}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def run_on_worker(package: CellPackage, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the bootstrap as the runner does (no gateway: nothing is posted)."""
    (tmp_path / "__air_main__.py").write_text(package.code)
    for name, data in package.files.items():
        (tmp_path / name).write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIR_")}
    return subprocess.run(
        [sys.executable, "__air_main__.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- decoration ----------------------------------------------------------------------------


def test_bad_job_options_fail_when_the_function_is_decorated():
    with pytest.raises(
        SpecError, match="resources.nodes: Input should be greater than or equal to 1"
    ):
        distributed(nodes=0)(print)
    with pytest.raises(SpecError, match="unknown job option 'node' \\(did you mean 'nodes'\\?\\)"):
        distributed(node=2)(print)
    with pytest.raises(SpecError, match="env RANK is set by AIR"):
        distributed(env={"RANK": "3"})(print)


def test_it_keeps_the_functions_name_doc_and_plain_version():
    def train(lr: float) -> float:
        """Train once."""
        return lr

    remote = distributed(nodes=2)(train)
    assert isinstance(remote, DistributedFunction)
    assert (remote.__name__, remote.__doc__, remote.__wrapped__) == ("train", "Train once.", train)
    assert distributed(train).job_options == {}  # bare: one node, one rank
    assert remote.options(nodes=4, name="big").job_options == {"nodes": 4, "name": "big"}
    assert remote.job_options == {"nodes": 2}


def test_air_sdk_exports_it_lazily_and_stays_light():
    assert air_sdk.distributed is distributed
    code = (
        "import sys, air_sdk\nair_sdk.distributed\n"
        "print([m for m in ('torch', 'ipywidgets', 'fastapi', 'air_sdk.gateway') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- packaging and running on a rank -------------------------------------------------------


def test_a_notebook_function_runs_on_a_worker_with_its_arguments_and_helpers(tmp_path):
    train = notebook_function(
        """
        def helper(x):
            return x * SCALE

        def train(a, b=0, *, tag):
            print("on the rank:", helper(a) + b, tag, flush=True)
            return a
        """,
        "train",
        SCALE=3,
    )
    package = package_call(train, (2,), {"b": 1, "tag": "t"})

    assert package.captured == ["train", "argument 1", "b", "tag"]
    assert set(package.files) == {CELL_PICKLE}
    assert "'<air call>'" in package.code and "@air_sdk.distributed" in package.code
    result = run_on_worker(package, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "on the rank: 7 t"


def test_a_raising_function_shows_its_own_frames_and_lines_on_the_rank(tmp_path):
    train = notebook_function(
        """
        def check(lr):
            if lr > 0.1:
                raise ValueError(f"lr {lr} diverges")

        def train(lr):
            check(lr)
        """,
        "train",
    )
    result = run_on_worker(package_call(train, (0.5,)), tmp_path)

    assert result.returncode == 1
    err = result.stderr
    assert err.startswith('Traceback (most recent call last):\n  File "<ipython-input-')
    assert "in train\n    check(lr)\n" in err  # the notebook's lines travelled with it
    assert 'raise ValueError(f"lr {lr} diverges")' in err
    assert err.endswith("ValueError: lr 0.5 diverges\n")
    for frame in ("__air_main__", "<air call>", "function_call.py"):
        assert frame not in err  # AIR's own frames are left out


def test_an_argument_that_cannot_travel_is_named_with_what_to_do():
    train = notebook_function("def train(x, *, lock=None):\n    return x", "train")
    with pytest.raises(CellCaptureError) as info:
        package_call(train, (1,), {"lock": threading.Lock()})
    assert str(info.value) == (
        "argument `lock` of `train` (_thread.lock) cannot be sent to the workers:"
        " create it inside the function"
    )
    with pytest.raises(CellCaptureError, match="argument 1 of `train` is a 4 KiB bytes"):
        package_call(train, (b"x" * 4096,), max_value_bytes=1024)


def test_a_secret_argument_is_refused_with_how_to_pass_it(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t_value")
    train = notebook_function("def train(token):\n    return token", "train")
    with pytest.raises(CellCaptureError) as info:
        package_call(train, (os.environ["HF_TOKEN"],))
    message = str(info.value)
    assert message.startswith("argument 1 of `train` holds the value of $HF_TOKEN")
    assert "pass it with env={'HF_TOKEN': ...} and read os.environ['HF_TOKEN']" in message
    assert "s3cr3t" not in message


# -- the call, against a mock gateway ------------------------------------------------------


class Gateway:
    """Answers what a call sends: bundle upload, submit, the record, result events."""

    def __init__(self, value: Any = None, state: JobState = JobState.SUCCEEDED) -> None:
        self.value = value
        self.state = state
        self.specs: list[JobSpec] = []
        self.bundles: list[bytes] = []
        self.cancelled = False

    def record(self, state: JobState) -> JobRecord:
        return JobRecord(
            id="train-1",
            tenant="t",
            name=self.specs[-1].name,
            state=state,
            spec=self.specs[-1],
            created_at=0.0,
            updated_at=0.0,
        )

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        path = urlsplit(request.url).path
        if path.startswith("/v1/bundles/"):
            if request.method == "PUT":
                self.bundles.append(bytes(request.body or b""))
            return mock_response(404 if request.method == "HEAD" else 201, {})
        if path == "/v1/jobs" and request.method == "POST":
            self.specs.append(JobSpec.model_validate_json(request.body or b""))
            return mock_response(201, self.record(JobState.QUEUED))
        if path == "/v1/jobs/train-1/cancel":
            self.cancelled = True
            return mock_response(200, self.record(JobState.CANCELLED))
        if path == "/v1/jobs/train-1":
            return mock_response(200, self.record(self.state))
        assert path == "/v1/jobs/train-1/events", path
        payload = cloudpickle.dumps(self.value)
        result = FunctionResult(ok=True, value_b64=base64.b64encode(payload).decode())
        events = [
            Event(
                seq=5,
                job_id="train-1",
                ts=0,
                type="result",
                rank=0,
                attempt=1,
                data=result.model_dump(),
            )
        ]
        after = int(request.url.split("after=")[1].split("&")[0])
        page = [json.loads(e.model_dump_json()) for e in events if e.seq > after]
        return mock_response(200, {"events": page, "last_seq": 5, "state": self.state.value})


def client_of(gateway: Gateway) -> Client:
    return Client("http://gw.test", token="tok", session=mock_session(gateway), max_attempts=1)


def test_submit_sends_the_call_with_the_job_options_and_returns_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vocab.txt").write_text("a b")
    gateway = Gateway()

    @distributed(
        client=client_of(gateway),
        files=["vocab.txt"],
        nodes=2,
        procs_per_node=2,
        env={"LR": "0.1"},
        max_restarts=3,
        timeout=600,
        pool="gpu",
        priority="high",
        tp=2,
    )
    def train(epochs: int) -> int:
        return epochs

    job = train.submit(3)

    assert isinstance(job, Job) and job.id == "train-1"
    (spec,) = gateway.specs
    assert spec.name == "train" and spec.entrypoint is None
    assert (spec.resources.nodes, spec.resources.procs_per_node) == (2, 2)
    assert (spec.env, spec.max_restarts, spec.timeout_s) == ({"LR": "0.1"}, 3, 600)
    assert (spec.pool, spec.priority, spec.parallelism.tp) == ("gpu", "high", 2)
    assert "run_function(_air_function, [_air_arg0], {})" in (spec.code or "")
    assert spec.bundle_sha256 is not None and len(gateway.bundles) == 1


def test_a_call_returns_rank_0s_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gateway = Gateway(value={"loss": 0.25})
    train = distributed(client=client_of(gateway), show_logs=False, name="run-7")(lambda: None)
    assert train() == {"loss": 0.25}
    assert gateway.specs[0].name == "run-7"


def test_interrupting_a_call_cancels_its_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gateway = Gateway(state=JobState.RUNNING)
    train = distributed(client=client_of(gateway), show_logs=False)(lambda: None)

    def interrupted(self: Job, timeout: float | None = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(Job, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train()
    assert gateway.cancelled
