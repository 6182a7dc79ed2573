"""A rank of an `@air_sdk.distributed` call: what it sends back, and how it fails."""

from __future__ import annotations

import base64
import pickle
import threading
from typing import Any

import pytest

from air_sdk.runtime.function_call import run_function
from air_sdk.schema.events import MAX_RESULT_BYTES, FunctionResult, WorkerReport


class Sent(list[FunctionResult]):
    """The results a rank posts; `arrives` says whether the gateway took them."""

    def __init__(self, arrives: bool = True) -> None:
        super().__init__()
        self.arrives = arrives

    def __call__(self, result: FunctionResult) -> bool:
        # What goes on the wire must be a valid report.
        WorkerReport.model_validate_json(WorkerReport(rank=0, result=result).model_dump_json())
        self.append(result)
        return self.arrives


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch):
    def set_rank(value: int) -> None:
        monkeypatch.setenv("RANK", str(value))
        monkeypatch.setenv("WORLD_SIZE", "2")

    set_rank(0)
    return set_rank


def value_of(result: FunctionResult) -> Any:
    assert result.ok and result.value_b64 is not None
    return pickle.loads(base64.b64decode(result.value_b64))


def test_rank_0_sends_its_return_value(rank):
    sent = Sent()
    run_function(lambda a, b=0: {"sum": a + b}, [2], {"b": 3}, post=sent)
    (result,) = sent
    assert value_of(result) == {"sum": 5}
    assert result.size_bytes == len(base64.b64decode(result.value_b64 or ""))


def test_other_ranks_send_nothing_when_they_return(rank):
    rank(1)
    sent = Sent()
    run_function(lambda: "ignored", [], {}, post=sent)
    assert sent == []


def raise_bad_lr(lr: float) -> None:
    check(lr)


def check(lr: float) -> None:
    raise ValueError(f"lr {lr} diverges")


def test_a_raising_rank_sends_its_traceback_from_the_function_down_and_exits_1(rank, capsys):
    rank(1)
    sent = Sent()
    with pytest.raises(SystemExit) as info:
        run_function(raise_bad_lr, [0.5], {}, post=sent)
    assert info.value.code == 1
    (result,) = sent
    assert (result.ok, result.error_type, result.error) == (False, "ValueError", "lr 0.5 diverges")
    tb = result.traceback or ""
    assert tb.startswith("Traceback (most recent call last):\n")
    assert "in raise_bad_lr\n    check(lr)" in tb
    assert 'raise ValueError(f"lr {lr} diverges")' in tb
    assert "runtime/function_call.py" not in tb  # AIR's own frame is left out
    assert capsys.readouterr().err == tb  # the rank's log shows the same


def make_lock() -> Any:
    return threading.Lock()


def test_a_return_value_that_cannot_be_pickled_fails_rank_0_with_what_to_return(rank, capsys):
    sent = Sent()
    with pytest.raises(SystemExit):
        run_function(make_lock, [], {}, post=sent)
    (result,) = sent
    assert result.error_type == "ResultPickleError"
    assert "the return value of make_lock() (_thread.lock) cannot be pickled" in (
        result.error or ""
    )
    assert "return plain data" in capsys.readouterr().err


def test_a_return_value_over_the_limit_is_refused_with_the_advice(rank):
    sent = Sent()
    with pytest.raises(SystemExit):
        run_function(lambda: b"x" * (MAX_RESULT_BYTES + 1), [], {}, post=sent)
    (result,) = sent
    assert result.error_type == "ResultTooLargeError"
    assert "pickles to over 2 MiB, the limit: save large results" in (result.error or "")


def test_a_value_that_never_reaches_the_gateway_fails_rank_0(rank, capsys):
    with pytest.raises(SystemExit):
        run_function(lambda: 1, [], {}, post=Sent(arrives=False))
    assert "did not reach the gateway" in capsys.readouterr().err


def test_system_exit_in_the_function_is_left_alone(rank):
    # air.exit_stopped() and sys.exit(n) keep their exit codes (the runner reads them)
    sent = Sent()
    with pytest.raises(SystemExit) as info:
        run_function(lambda: exec("raise SystemExit(143)"), [], {}, post=sent)
    assert info.value.code == 143 and sent == []
