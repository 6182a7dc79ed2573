"""MetricsShipper against a real HTTP server on 127.0.0.1 standing in for the gateway.

`FakeGateway` is also imported by the other runtime tests.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgpack
import pytest

from air_sdk.runtime._poster import ReportPoster
from air_sdk.runtime._shipper import MetricsShipper
from air_sdk.schema.events import WorkerReport

REPORT_PATH = "/v1/jobs/job-1/attempts/0/report"


def report_of(body: bytes, content_type: str | None) -> dict[str, Any]:
    """A posted report as its JSON form: a msgpack one's columns become `points`."""
    if content_type != "application/msgpack":
        return json.loads(body)
    report = msgpack.unpackb(body)
    columns = report.pop("columns", None)
    if columns is not None:
        rows = (
            zip(*columns["values"], strict=True)
            if columns["values"]
            else ([] for _ in columns["step"])
        )
        report["points"] = [
            {
                "step": s,
                "ts": t,
                "values": {
                    n: v for n, v in zip(columns["names"], row, strict=True) if v is not None
                },
            }
            for s, t, row in zip(columns["step"], columns["ts"], rows, strict=True)
        ]
    return report


class FakeGateway:
    """Records every POST; answers 204 unless a test scripted other answers or holds the gate.
    Bodies are kept in their JSON form (`report_of`), whichever format was posted."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []  # every request: path, auth, body, time
        self.reports: list[dict[str, Any]] = []  # bodies answered with 2xx
        self.answers: deque[tuple[int, dict[str, str]]] = deque()
        self.gate = threading.Event()  # clear it to hold answers until it is set again
        self.gate.set()
        self.changed = threading.Condition()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = report_of(raw, self.headers.get("Content-Type"))
                with gateway.changed:
                    gateway.requests.append(
                        {
                            "path": self.path,
                            "auth": self.headers.get("Authorization"),
                            "content_type": self.headers.get("Content-Type"),
                            "body": body,
                            "at": time.monotonic(),
                        }
                    )
                    gateway.changed.notify_all()
                gateway.gate.wait(30)
                status, headers = gateway.answers.popleft() if gateway.answers else (204, {})
                with gateway.changed:  # recorded before answering: the client may check at once
                    if status < 300:
                        gateway.reports.append(body)
                    gateway.changed.notify_all()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def report_url(self) -> str:
        return self.base_url + REPORT_PATH

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), "the gateway never saw that"

    def steps(self) -> list[int]:
        return [point["step"] for body in self.reports for point in body.get("points", [])]

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


def make_shipper(url: str, **options: Any) -> MetricsShipper:
    options.setdefault("flush_interval", 0.05)
    return MetricsShipper(rank=1, poster=ReportPoster(url, "tok-1"), **options)


def test_points_arrive_in_order_and_validate_as_worker_reports(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url)
    for step in range(25_000):
        shipper.log(step, loss=1.0 / (step + 1), lr=3e-4, tokens=step * 10)
    assert shipper.close(timeout=15)

    assert gateway.steps() == list(range(25_000))
    assert len(gateway.reports) >= 3  # at most 10,000 points per report
    for request in gateway.requests:
        assert request["path"] == REPORT_PATH
        assert request["auth"] == "Bearer tok-1"
        report = WorkerReport.model_validate(request["body"])
        assert report.rank == 1
        assert report.dropped_points == 0
        assert report.heartbeat_step == report.points[-1].step
    first = WorkerReport.model_validate(gateway.reports[0]).points[0]
    assert first.values == {"loss": 1.0, "lr": 3e-4, "tokens": 0.0}


def test_flush_waits_until_everything_logged_so_far_is_posted(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url, flush_interval=30)  # only flush() sends
    shipper.log(1, loss=0.5)
    shipper.log(2, loss=0.4)
    assert shipper.flush(timeout=10)
    assert gateway.steps() == [1, 2]
    shipper.close()


def test_tensor_and_numpy_values_are_sent_as_floats(gateway: FakeGateway) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    shipper = make_shipper(gateway.report_url)
    shipper.log(np.int64(7), loss=torch.tensor(1.5), acc=np.float32(0.25), n=3, ok=True)
    assert shipper.close()
    [report] = gateway.reports
    assert report["points"][0]["step"] == 7
    assert report["points"][0]["values"] == {"loss": 1.5, "acc": 0.25, "n": 3.0, "ok": 1.0}


@pytest.mark.parametrize("bad", ["0.5", [1.0, 2.0], None, {"a": 1}])
def test_a_non_numeric_value_raises_type_error_naming_the_key(bad: Any) -> None:
    shipper = MetricsShipper(poster=None)
    with pytest.raises(TypeError, match="val_loss"):
        shipper.log(1, loss=0.5, val_loss=bad)
    assert shipper.latest == {}  # nothing half-recorded


def test_a_non_integer_step_raises_type_error() -> None:
    with pytest.raises(TypeError, match="step must be an int"):
        MetricsShipper(poster=None).log(1.5, loss=0.5)  # type: ignore[arg-type]


def test_without_a_gateway_log_keeps_the_latest_values_only() -> None:
    shipper = MetricsShipper(poster=None)
    shipper.log(1, loss=0.5, lr=0.1)
    shipper.log(2, loss=0.25)
    assert shipper.latest == {"loss": 0.25, "lr": 0.1}
    assert shipper.last_step == 2
    assert not shipper.enabled
    assert shipper.flush(timeout=0) and shipper.close(timeout=0)


def test_log_never_waits_for_the_gateway(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url)
    gateway.gate.clear()  # the gateway takes the first post and does not answer
    shipper.log(0, loss=0.0)
    gateway.wait_for(lambda: len(gateway.requests) == 1)

    for step in range(1, 10_001):
        shipper.log(step, loss=float(step), lr=1e-3, grad_norm=1.0)
    assert gateway.reports == []  # all 10,000 calls returned while the post still hung

    gateway.gate.set()
    assert shipper.close(timeout=15)
    assert gateway.steps() == list(range(10_001))


def test_a_full_buffer_drops_the_oldest_points_and_reports_how_many(
    gateway: FakeGateway,
) -> None:
    shipper = make_shipper(gateway.report_url, max_pending=100)
    gateway.gate.clear()
    shipper.log(0, loss=0.0)
    gateway.wait_for(lambda: len(gateway.requests) == 1)
    for step in range(1, 251):  # 250 points into room for 100 while the post hangs
        shipper.log(step, loss=float(step))
    gateway.gate.set()
    assert shipper.close(timeout=15)

    assert gateway.steps() == [0, *range(151, 251)]
    assert sum(body.get("dropped_points", 0) for body in gateway.reports) == 150
    for body in gateway.reports:
        WorkerReport.model_validate(body)


def test_heartbeat_posts_progress_without_metrics(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url)
    shipper.heartbeat(step=7)
    assert shipper.flush(timeout=10)
    assert gateway.reports == [{"rank": 1, "heartbeat_step": 7}]
    shipper.close()


def test_mark_busy_posts_a_busy_report_that_is_not_progress(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url)
    shipper.mark_busy()  # the NodeRunner saw the rank use CPU
    assert shipper.flush(timeout=10)
    assert gateway.reports == [{"rank": 1, "busy": True}]
    report = WorkerReport.model_validate(gateway.reports[0])
    assert report.busy and report.heartbeat_step is None
    shipper.close()


def test_mark_finished_says_the_rank_is_leaving(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url)
    shipper.mark_finished()  # air.shutdown() is done: what is left is the exit
    assert shipper.flush(timeout=10)
    assert gateway.reports == [{"rank": 1, "finished": True}]
    assert WorkerReport.model_validate(gateway.reports[0]).finished
    shipper.close()


def test_a_fenced_attempt_stops_posting_and_drops_its_data(gateway: FakeGateway) -> None:
    gateway.answers.append((409, {}))
    shipper = make_shipper(gateway.report_url)
    shipper.log(1, loss=1.0)
    assert shipper.flush(timeout=10)
    for step in range(2, 50):
        shipper.log(step, loss=1.0)
    assert shipper.close(timeout=5)

    assert len(gateway.requests) == 1
    assert gateway.reports == []
    assert not shipper.enabled
    assert shipper.latest == {"loss": 1.0}  # log() still works for the training loop


def test_a_rejected_token_stops_posting_with_one_warning(
    gateway: FakeGateway, capfd: pytest.CaptureFixture[str]
) -> None:
    gateway.answers.append((401, {}))
    shipper = make_shipper(gateway.report_url)
    shipper.log(1, loss=1.0)
    shipper.flush(timeout=10)
    shipper.log(2, loss=1.0)
    shipper.close(timeout=5)

    assert len(gateway.requests) == 1
    assert capfd.readouterr().err.count("AIR_JOB_TOKEN") == 1


def test_transient_errors_are_retried_and_delivered_exactly_once(gateway: FakeGateway) -> None:
    gateway.answers.extend([(503, {"Retry-After": "0"}), (502, {}), (429, {})])
    shipper = make_shipper(gateway.report_url)
    shipper.log(1, loss=1.0)
    assert shipper.close(timeout=15)
    assert len(gateway.requests) == 4
    assert gateway.steps() == [1]


def test_retry_after_is_honoured(gateway: FakeGateway) -> None:
    gateway.answers.append((429, {"Retry-After": "1"}))
    shipper = make_shipper(gateway.report_url)
    shipper.log(1, loss=1.0)
    assert shipper.close(timeout=15)
    first, second = gateway.requests
    assert second["at"] - first["at"] >= 0.9
    assert gateway.steps() == [1]


def test_points_logged_while_the_gateway_is_down_arrive_once_it_is_up() -> None:
    with socket.socket() as probe:  # a port nothing listens on, yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    shipper = make_shipper(f"http://127.0.0.1:{port}{REPORT_PATH}")
    for step in range(5):
        shipper.log(step, loss=1.0)
    assert not shipper.flush(timeout=0.3)  # connection refused: still pending

    gateway = FakeGateway(port)
    try:
        for step in range(5, 10):
            shipper.log(step, loss=1.0)
        assert shipper.close(timeout=20)
        assert gateway.steps() == list(range(10))
    finally:
        gateway.close()


def test_log_lines_and_exit_are_sent_after_the_lines_before_them(gateway: FakeGateway) -> None:
    from air_sdk.schema.events import RankExit

    shipper = make_shipper(gateway.report_url)
    for number in range(3):
        shipper.add_line(f"line {number}")
    shipper.add_line("y" * 20_000)
    shipper.report_exit(RankExit(rank=1, exit_code=0))
    assert shipper.close(timeout=10)

    lines = [line for body in gateway.reports for line in body.get("lines", [])]
    assert lines[:3] == ["line 0", "line 1", "line 2"]
    assert len(lines[3]) == 16_384
    assert gateway.reports[-1]["exit"]["exit_code"] == 0
    for body in gateway.reports:
        WorkerReport.model_validate(body)


def test_too_many_pending_lines_drop_the_oldest_and_say_so(gateway: FakeGateway) -> None:
    shipper = make_shipper(gateway.report_url, max_pending_line_bytes=10 * (3 + 64))
    gateway.gate.clear()
    shipper.add_line("first")
    gateway.wait_for(lambda: len(gateway.requests) == 1)
    for number in range(30):  # room for 10 while the post hangs
        shipper.add_line(f"l{number:02d}")
    gateway.gate.set()
    assert shipper.close(timeout=15)

    lines = [line for body in gateway.reports for line in body.get("lines", [])]
    expected = [f"l{number}" for number in range(20, 30)]
    assert lines == ["first", "[air] 20 earlier output lines were dropped", *expected]
