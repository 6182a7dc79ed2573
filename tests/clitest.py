"""A fake gateway for the `air` command's unit tests (mock transport via `make_client`),
and helpers to run the command and read what it printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from typer.testing import CliRunner, Result

from air_sdk.cli import main as cli
from air_sdk.client import Client, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.schema import Event, JobRecord, JobSpec, JobState

URL = "http://gw.test"
runner = CliRunner()


class FakeGateway:
    """Just enough of the HTTP API for the CLI: jobs, events, logs, metrics, bundles."""

    def __init__(self) -> None:
        self.records: dict[str, JobRecord] = {}
        self.events: dict[str, list[Event]] = {}
        self.requests: list[requests.PreparedRequest] = []
        self.final_state = JobState.SUCCEEDED
        self.logs_upto = 1 << 30
        #: what rank 0 prints while a job runs (lines of one log event)
        self.rank0_output: list[str] = []
        #: steps rank 0 logs with air.log (0: a plain script that logs none)
        self.steps = 3
        #: fields of the job record once it ended (started_at, ended_at, goodput, ...)
        self.ended_record: dict[str, object] = {}
        #: POST /v1/admin/gc: the bodies asked and the report answered
        self.gc_requests: list[dict] = []
        self.gc_report: dict = {"jobs": [], "bundles": [], "bytes_freed": 0, "bytes_kept": 0}

    def add_job(self, job_id: str, state: JobState, **extra: object) -> JobRecord:
        now = time.time()
        rec = JobRecord(
            id=job_id,
            tenant="t",
            name=extra.pop("name", "train"),  # type: ignore[arg-type]
            state=state,
            spec=JobSpec(entrypoint="train.py", resources={"nodes": 2}),
            created_at=now - 90 + len(self.records),  # later jobs are newer
            updated_at=now,
            attempt=1,
            **extra,
        )
        self.records[job_id] = rec
        self.events.setdefault(job_id, [])
        return rec

    def emit(
        self,
        job_id: str,
        type_: str,
        rank: int | None = None,
        data: dict | None = None,
        **kw: object,
    ) -> None:
        log = self.events[job_id]
        data = {**(data or {}), **kw}
        seq = len(log) + 1
        log.append(
            Event(
                seq=seq, job_id=job_id, ts=float(seq), type=type_, rank=rank, attempt=1, data=data
            )
        )

    def run_to_end(self, job_id: str, final: JobState, steps: int | None = None) -> None:
        """The events of a job's life, in the order a gateway writes them."""
        steps = self.steps if steps is None else steps
        self.emit(job_id, "state", state="SCHEDULED")
        self.emit(job_id, "attempt", attempt=1, phase="started")
        self.emit(job_id, "state", state="STARTING")
        self.emit(job_id, "state", state="RUNNING")
        for step in range(1, steps + 1):
            points = [{"step": step, "ts": float(step), "values": {"loss": 1.0 / step}}]
            self.emit(job_id, "metrics", rank=0, points=points)
        if self.rank0_output:
            self.emit(job_id, "log", rank=0, lines=self.rank0_output)
        self.emit(job_id, "log", rank=1, lines=["boom"])
        if final is JobState.FAILED:
            self.emit(job_id, "rank_exit", rank=1, data={"rank": 1, "exit_code": 3})
        self.emit(job_id, "state", state=final.value)
        self.records[job_id] = self.records[job_id].model_copy(
            update={"state": final, **self.ended_record}
        )

    def __call__(self, request: requests.PreparedRequest) -> requests.Response:
        self.requests.append(request)
        url = urlsplit(request.url or "")
        path, query = url.path, {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = path.strip("/").split("/")[1:]  # drop "v1"
        if parts == ["health"]:
            return mock_response(200, {"status": "ok", "version": "test"})
        if parts == ["cluster"]:
            nodes = [{"name": f"node-{i}", "slots": 1} for i in range(2)]
            return mock_response(200, {"nodes": nodes})
        if parts == ["admin", "gc"]:
            asked = json.loads(request.body or b"{}")
            self.gc_requests.append(asked)
            return mock_response(200, {**self.gc_report, "dry_run": asked["dry_run"]})
        if parts[0] == "bundles":
            return mock_response(404 if request.method == "HEAD" else 201, None)
        if parts == ["jobs"] and request.method == "POST":
            spec = JobSpec.model_validate_json(request.body)  # type: ignore[arg-type]
            rec = self.add_job(f"j-{len(self.records) + 1}", JobState.QUEUED, name=spec.name)
            self.records[rec.id] = rec = rec.model_copy(update={"spec": spec})
            self.run_to_end(rec.id, self.final_state)
            return mock_response(201, rec)
        if parts == ["jobs"]:
            wanted = query.get("state")
            jobs = [r for r in self.records.values() if wanted in (None, r.state.value)]
            jobs = sorted(jobs, key=lambda r: r.created_at, reverse=True)  # newest first
            jobs = jobs[: int(query.get("limit", 100))]
            return mock_response(200, {"jobs": [json.loads(r.model_dump_json()) for r in jobs]})
        job_id, rest = parts[1], parts[2:]
        if job_id not in self.records:
            return mock_response(404, {"detail": f"no job {job_id}"})
        rec, log = self.records[job_id], self.events[job_id]
        after = int(query.get("after", 0))
        if rest == []:
            return mock_response(200, rec)
        if rest == ["cancel"]:
            self.records[job_id] = rec = rec.model_copy(
                update={"state": JobState.CANCELLED, "cancel_requested": True}
            )
            return mock_response(200, rec)
        if rest == ["events"]:
            page = [json.loads(e.model_dump_json()) for e in log if e.seq > after]
            return mock_response(
                200, {"events": page, "last_seq": log[-1].seq if log else 0, "state": rec.state}
            )
        if rest == ["events", "stream"]:
            chunks = [f"id: {e.seq}\ndata: {e.model_dump_json()}\n\n".encode() for e in log]
            return mock_response(200, chunks=[e for e in chunks if e])
        if rest == ["logs"]:
            # The page sees the log as it was at seq `logs_upto` (later lines come "live").
            shown = [e for e in log if e.type.value == "log" and e.seq <= self.logs_upto]
            lines = [
                {"attempt": 1, "rank": e.rank, "text": t} for e in shown for t in e.data["lines"]
            ]
            return mock_response(200, {"lines": lines, "last_seq": shown[-1].seq if shown else 0})
        if rest == ["metrics"]:
            rows = [
                {
                    "attempt": 1,
                    "rank": e.rank,
                    "step": p["step"],
                    "ts": p["ts"],
                    "values": p["values"],
                }
                for e in log
                if e.type.value == "metrics"
                for p in e.data["points"]
            ]
            if "rank" in query:  # the gateway's filters
                rows = [r for r in rows if r["rank"] == int(query["rank"])]
            if "name" in query:
                rows = [
                    {**r, "values": {query["name"]: r["values"][query["name"]]}}
                    for r in rows
                    if query["name"] in r["values"]
                ]
            return mock_response(200, {"points": rows})
        raise AssertionError(f"unexpected {request.method} {path}")


def invoke(*args: str, answer: str | None = None) -> Result:
    """Run `air ARGS...`; `answer` is what the user types at a prompt."""
    return runner.invoke(cli.app, list(args), input=answer)


def flat(text: str) -> str:
    """Output without rich's box drawing and line wrapping."""
    return " ".join(text.replace("│", " ").split())


def install_fake_gateway(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(_http, "_sleep", lambda s: None)
    monkeypatch.setenv("AIR_CONFIG_FILE", str(tmp_path / "absent.toml"))

    def make_client(gateway: str | None = None, token: str | None = None, **_: object) -> Client:
        return Client(gateway or URL, token or "tok", session=mock_session(fake), max_attempts=2)

    monkeypatch.setattr(cli, "make_client", make_client)
    return fake


def write_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    path.write_text("print('training')\n")
    return path
