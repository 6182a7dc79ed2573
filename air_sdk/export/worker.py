"""`python -m air_sdk.export.worker`: one job's export to one tracker, fed by the gateway.

It reads one JSON message per line on stdin and answers each with one line on stdout:

| message                                        | answer                              |
|------------------------------------------------|-------------------------------------|
| `{"start": {"to", "dest", "job", "dir", "resume"}}` | `{"started": {"location", "resume"}}` |
| `{"events": [Event, ...]}`                     | `{"seq": <last seq written>}`       |
| `{"end": {"state", "reason"}}`                 | `{"ended": true}`, then it exits 0  |

Anything that goes wrong is answered `{"error": "<what>"}` and the worker exits 1.
The tracker's library is imported here, in its own process: its import time, its
threads and its environment (the job's credentials) stay out of the gateway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

from air_sdk.export.writers import JobInfo, Writer, make_writer
from air_sdk.schema.events import (
    CheckpointCommit,
    Event,
    EventType,
    MetricPoint,
    MetricsBatch,
)

__all__ = ["serve"]


def _answer(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _write_events(writer: Writer, events: list[Event]) -> None:
    points: list[MetricPoint] = []
    for event in events:
        if event.type is EventType.METRICS and event.rank == 0:
            points.extend(event.payload_as(MetricsBatch).points)
        elif event.type is EventType.CHECKPOINT:
            record = event.payload()
            if isinstance(record, CheckpointCommit):
                if points:
                    writer.points(points)
                    points = []
                writer.checkpoint(record.step, record.path, event.ts)
    if points:
        writer.points(points)


def serve(inp: IO[str], out: IO[str]) -> int:
    """Answer the gateway's messages on `inp` until `end` (0) or an error (1)."""
    writer: Writer | None = None
    for line in inp:
        try:
            message = json.loads(line)
            if "start" in message:
                start = message["start"]
                job = JobInfo(**start["job"])
                writer = make_writer(
                    start["to"],
                    start.get("dest"),
                    job,
                    Path(start["dir"]),
                    start.get("resume") or {},
                )
                _answer(out, {"started": {"location": writer.location, "resume": writer.resume}})
            elif writer is None:
                raise RuntimeError("the first message must be `start`")
            elif "events" in message:
                events = [Event.model_validate(e) for e in message["events"]]
                _write_events(writer, events)
                _answer(out, {"seq": events[-1].seq if events else 0})
            elif "end" in message:
                writer.finish(message["end"]["state"], message["end"].get("reason", ""))
                _answer(out, {"ended": True})
                return 0
            else:
                raise RuntimeError(f"unknown message {sorted(message)}")
        except Exception as exc:  # the gateway shows it on the job; the worker stops
            _answer(out, {"error": f"{type(exc).__name__}: {exc}"[:2000]})
            return 1
    return 1  # the gateway went away before `end`: it starts a worker again later


if __name__ == "__main__":
    # The library's own chatter goes to stderr (a file the gateway keeps): stdout is the
    # answers' channel only.
    answers = sys.stdout
    sys.stdout = sys.stderr
    sys.exit(serve(sys.stdin, answers))
