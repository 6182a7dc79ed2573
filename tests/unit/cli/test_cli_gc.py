"""`air gc`: what would go, what went, and the bytes."""

from __future__ import annotations

import time

import pytest
from clitest import FakeGateway, flat, invoke

from air_sdk.cli.gc import parse_duration


def test_dry_run_says_what_would_go_and_how_much(gateway: FakeGateway) -> None:
    gateway.gc_report = {
        "jobs": [
            {"job_id": "train-5d41402a", "ended_at": time.time() - 8.2 * 86400, "bytes": 3 << 20}
        ],
        "bundles": ["ab" * 32],
        "bytes_freed": 403 << 20,
        "bytes_kept": 12 << 20,
    }
    result = invoke("gc", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "would delete the files of train-5d41402a (ended 8.2 days ago, 3.0 MiB of its own)",
        "would delete 1 unpacked bundle no job uses",
        "would free 403.0 MiB; ended jobs' files left: 12.0 MiB",
    ]
    assert gateway.gc_requests == [
        {"dry_run": True, "older_than_s": None, "include_checkpoints": False}
    ]


def test_older_than_reaches_the_gateway_in_seconds(gateway: FakeGateway) -> None:
    result = invoke("gc", "--older-than", "12h")
    assert result.exit_code == 0, result.output
    assert gateway.gc_requests == [
        {"dry_run": False, "older_than_s": 43200.0, "include_checkpoints": False}
    ]
    assert result.stdout == ("nothing to free; ended jobs' files take 0 bytes\n")


def test_include_checkpoints_reaches_the_gateway(gateway: FakeGateway) -> None:
    result = invoke("gc", "--include-checkpoints", "--older-than", "0")
    assert result.exit_code == 0, result.output
    assert gateway.gc_requests == [
        {"dry_run": False, "older_than_s": 0.0, "include_checkpoints": True}
    ]


def test_nothing_to_free_says_how_to_free_more(gateway: FakeGateway) -> None:
    gateway.gc_report = {**gateway.gc_report, "bytes_kept": 5 << 30}
    result = invoke("gc")
    assert result.stdout == (
        "nothing to free; ended jobs' files take 5.0 GiB (`air gc --older-than 0` frees"
        " every ended job's)\n"
    )


def test_a_bad_duration_is_a_usage_error(gateway: FakeGateway) -> None:
    result = invoke("gc", "--older-than", "soon")
    assert result.exit_code == 2
    assert "'soon' is not a duration: give a number with s, m, h, d or w" in flat(result.output)
    assert gateway.gc_requests == []


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30m", 1800), ("2w", 1209600)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
