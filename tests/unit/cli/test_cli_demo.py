"""`air demo` against fakes: which gateway it uses, what it submits, what it prints."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from air_sdk.cli import main as cli
from air_sdk.cli.demo import demo_source
from air_sdk.client import Client, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.gateway import server
from air_sdk.schema import Event, JobRecord, JobSpec, JobState

runner = CliRunner()
CONFIGURED = "http://127.0.0.1:18999"
STARTED = "http://127.0.0.1:18999"


class DemoGateway:
    """Accepts one job and plays a short run of it back, ending in `final`."""

    def __init__(self, final: JobState = JobState.SUCCEEDED, num_nodes: int = 2) -> None:
        self.final = final
        self.num_nodes = num_nodes
        self.bundle: bytes | None = None
        self.spec: JobSpec | None = None
        self.tokens: set[str] = set()

    def record(self) -> JobRecord:
        assert self.spec is not None
        now = time.time()
        return JobRecord(
            id="demo-1", tenant="t", name=self.spec.name, state=self.final, spec=self.spec,
            created_at=now, updated_at=now, attempt=1, started_at=now - 3, ended_at=now,
        )  # fmt: skip

    def events(self) -> list[Event]:
        states = ["RUNNING", self.final.value]
        log: list[dict] = [{"type": "state", "data": {"state": "RUNNING"}}]
        log.append({"type": "attempt", "data": {"attempt": 1, "phase": "started"}})
        for step in (1, 50, 100):
            point = {"step": step, "ts": float(step) / 50, "values": {"loss": 1.0 / step}}
            log.append({"type": "metrics", "rank": 0, "data": {"points": [point]}})
        if self.final is JobState.FAILED:
            log.append({"type": "log", "rank": 1, "data": {"lines": ["RuntimeError: gloo"]}})
            log.append({"type": "rank_exit", "rank": 1, "data": {"rank": 1, "exit_code": 1}})
        log.append({"type": "state", "data": {"state": states[-1]}})
        return [Event(seq=i, job_id="demo-1", ts=float(i), **e) for i, e in enumerate(log, 1)]

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        self.tokens.add(request.headers.get("Authorization", ""))
        path = (request.path_url or "").split("?")[0]
        if path == "/v1/health":
            return mock_response(200, {"status": "ok", "version": "test"})
        if path == "/v1/cluster":
            nodes = [{"name": f"node-{i}", "slots": 1} for i in range(self.num_nodes)]
            return mock_response(200, {"nodes": nodes})
        if path.startswith("/v1/bundles/"):
            if request.method == "HEAD":
                return mock_response(404)
            self.bundle = request.body  # type: ignore[assignment]
            return mock_response(201, {"sha256": path[-64:], "size": 1, "num_files": 1})
        if path == "/v1/jobs":
            self.spec = JobSpec.model_validate_json(request.body)  # type: ignore[arg-type]
            return mock_response(201, self.record().model_copy(update={"state": JobState.QUEUED}))
        if path == "/v1/jobs/demo-1/events/stream":
            body = [f"id: {e.seq}\ndata: {e.model_dump_json()}\n\n".encode() for e in self.events()]
            return mock_response(200, chunks=body)
        if path == "/v1/jobs/demo-1":
            return mock_response(200, self.record())
        raise AssertionError(f"unexpected {request.method} {path}")


def refuse(request: requests.PreparedRequest) -> requests.Response:
    raise requests.ConnectionError("[Errno 111] Connection refused")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_http, "_sleep", lambda s: None)
    monkeypatch.setenv("AIR_CONFIG_FILE", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("AIR_GATEWAY_URL", CONFIGURED)
    monkeypatch.setenv("AIR_HOME", str(tmp_path / "home"))


def use_gateway(monkeypatch: pytest.MonkeyPatch, fake: DemoGateway, *, up: bool) -> list[str]:
    """Route clients to `fake`; while `up` is False the configured URL refuses."""
    made: list[str] = []

    def make_client(gateway: str | None = None, token: str | None = None, **kw: object) -> Client:
        made.append(token or "")
        handler = fake if up or token == "started-token" else refuse
        return Client(gateway, token, session=mock_session(handler), max_attempts=1)

    monkeypatch.setattr(cli, "make_client", make_client)
    return made


def test_demo_on_a_running_gateway_submits_the_packaged_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = DemoGateway()
    use_gateway(monkeypatch, fake, up=True)
    started: list[object] = []
    monkeypatch.setattr(server, "start_detached", lambda *a, **k: started.append(a))

    result = runner.invoke(cli.app, ["demo", "--steps", "100"])

    assert result.exit_code == 0, result.output
    assert started == []  # a gateway answered: none started
    assert fake.spec is not None
    assert fake.spec.name == "demo" and fake.spec.entrypoint == "ddp_demo.py"
    assert fake.spec.args == ["--steps", "100"]
    assert (fake.spec.resources.nodes, fake.spec.resources.procs_per_node) == (2, 1)
    with tarfile.open(fileobj=io.BytesIO(fake.bundle or b""), mode="r:gz") as tar:
        assert tar.getnames() == ["ddp_demo.py"]  # nothing of the caller's directory
        assert tar.extractfile("ddp_demo.py").read() == demo_source()  # type: ignore[union-attr]
    out = " ".join(result.stdout.split())
    for expected in ("final state SUCCEEDED", "attempts 1", "steps 100", "final loss 0.01"):
        assert expected in out
    assert "steps/second 50.0" in out  # (100 - 1) steps between points at 0.02 s and 2 s


def test_demo_starts_and_stops_a_gateway_when_none_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = DemoGateway()
    use_gateway(monkeypatch, fake, up=False)
    calls: list[object] = []

    def start_detached(opts: server.GatewayOptions, timeout_s: float = 60) -> server.GatewayProcess:
        calls.append(opts)
        return server.GatewayProcess(
            pid=1, url=STARTED, token="started-token", log_path=tmp_path / "gw.log"
        )

    monkeypatch.setattr(server, "start_detached", start_detached)
    monkeypatch.setattr(server, "stop_detached", lambda home, timeout_s=30: calls.append(home))

    result = runner.invoke(cli.app, ["demo", "--nodes", "2"])

    assert result.exit_code == 0, result.output
    opts = calls[0]
    assert isinstance(opts, server.GatewayOptions)
    assert (opts.port, opts.num_nodes, opts.write_client_config) == (18999, 2, False)
    assert calls[1] == tmp_path / "home"  # stopped at the end
    assert fake.tokens == {"Bearer started-token"}
    assert "stopped the gateway the demo started" in result.stdout


def test_demo_beside_another_users_gateway_starts_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another user's gateway holds the configured port: it answers health, but refuses
    this client (no token). The demo starts a gateway of its own on a free port."""
    fake = DemoGateway()
    made: list[str] = []

    def foreign(request: requests.PreparedRequest) -> requests.Response:
        if (request.path_url or "").startswith("/v1/health"):
            return mock_response(200, {"status": "ok", "version": "test"})
        return mock_response(401, {"detail": "missing or invalid token"})

    def make_client(gateway: str | None = None, token: str | None = None, **kw: object) -> Client:
        made.append(token or "")
        handler = fake if token == "started-token" else foreign
        return Client(gateway, token, session=mock_session(handler), max_attempts=1)

    monkeypatch.setattr(cli, "make_client", make_client)
    monkeypatch.setattr(
        server, "start_detached",
        lambda opts, timeout_s=60: server.GatewayProcess(
            pid=1, url=STARTED, token="started-token", log_path=tmp_path / "gw.log"
        ),
    )  # fmt: skip
    monkeypatch.setattr(server, "stop_detached", lambda home, timeout_s=30: True)

    result = runner.invoke(cli.app, ["demo"])

    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert f"the gateway at {CONFIGURED} is not yours (it refused this client's token)" in out
    assert "final state SUCCEEDED" in out and fake.tokens == {"Bearer started-token"}


def test_demo_failure_prints_rank_exit_and_tail_and_exits_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = DemoGateway(final=JobState.FAILED)
    use_gateway(monkeypatch, fake, up=True)
    result = runner.invoke(cli.app, ["demo"])
    assert result.exit_code == 1
    assert "failed: rank 1 exit code 1" in result.stdout
    assert "RuntimeError: gloo" in result.stdout


def test_demo_refuses_more_nodes_than_the_gateway_has(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = DemoGateway(num_nodes=1)
    use_gateway(monkeypatch, fake, up=True)
    result = runner.invoke(cli.app, ["demo", "--nodes", "2"])
    assert result.exit_code == 2
    assert "has 1 node; the demo asked for 2" in result.stderr
    assert fake.spec is None


def test_demo_script_is_packaged() -> None:
    source = demo_source().decode()
    assert 'if __name__ == "__main__":' in source
    assert "gc.collect()" in source and "air.shutdown()" in source
    json.dumps(source)  # plain text
