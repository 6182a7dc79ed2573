"""Warm agent pool settings and the rules for handing a warm process out (no processes)."""

from __future__ import annotations

import subprocess
import sys
from typing import cast

import pytest

from air_sdk.errors import ConfigError
from air_sdk.runner.backends._warm import WarmAgent, WarmAgentPool, _env_block
from air_sdk.runner.backends.local import LocalBackend, warm_agent_count

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="warm agents exist only on Linux (the pool size is 0 elsewhere)",
)


@linux_only
def test_default_is_one_warm_agent_per_virtual_node_at_most_four(monkeypatch):
    monkeypatch.delenv("AIR_WARM_AGENTS", raising=False)
    assert warm_agent_count(None, 2) == 2
    assert warm_agent_count(None, 16) == 4


@linux_only
def test_air_warm_agents_env_sets_the_size_and_zero_turns_it_off(monkeypatch):
    monkeypatch.setenv("AIR_WARM_AGENTS", "3")
    assert warm_agent_count(None, 2) == 3
    monkeypatch.setenv("AIR_WARM_AGENTS", "0")
    assert warm_agent_count(None, 2) == 0
    assert LocalBackend(2, 1).warm_pool is None
    assert warm_agent_count(1, 2) == 1  # an explicit argument wins over the env


@pytest.mark.parametrize("raw", ["many", "-1", "1000"])
def test_a_bad_air_warm_agents_says_what_to_give(monkeypatch, raw):
    if not sys.platform.startswith("linux"):
        pytest.skip("warm agents are off outside Linux")
    monkeypatch.setenv("AIR_WARM_AGENTS", raw)
    with pytest.raises(ConfigError, match="AIR_WARM_AGENTS.*from 0 \\(off\\)"):
        warm_agent_count(None, 2)


def test_constructing_a_backend_starts_no_process(monkeypatch):
    monkeypatch.delenv("AIR_WARM_AGENTS", raising=False)
    backend = LocalBackend(2, 1)
    assert backend.warm_pool is None or backend.warm_pool.pids() == []
    backend.close()
    backend.close()  # idempotent


def _agent(start_env: dict[str, str], room: int = 1 << 16) -> WarmAgent:
    # fits() reads no process
    return WarmAgent(cast("subprocess.Popen[bytes]", None), start_env, room)


def test_a_warm_process_serves_only_attempts_whose_interpreter_settings_match():
    base = {"PATH": "/bin", "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agent = _agent(base)
    attempt = {**base, "AIR_JOB_ID": "j", "AIR_ATTEMPT": "2", "CUDA_VISIBLE_DEVICES": ""}
    assert agent.fits(attempt)
    # settings read while the interpreter starts or torch imports: a cold start instead
    assert not agent.fits({**attempt, "PYTHONPATH": "/src"})
    assert not agent.fits({**attempt, "LD_PRELOAD": "libjemalloc.so"})
    assert not agent.fits({**attempt, "TORCH_CPP_LOG_LEVEL": "INFO"})
    assert not agent.fits({k: v for k, v in attempt.items() if k != "PYTHONUNBUFFERED"})


def test_a_warm_process_serves_only_environments_it_has_room_to_show():
    env = {"AIR_JOB_ID": "j", "BIG": "x" * 100}
    assert _agent({}, room=len(_env_block(env))).fits(env)
    assert not _agent({}, room=len(_env_block(env)) - 1).fits(env)


def test_env_block_is_laid_out_as_the_kernel_does_and_ends_in_an_empty_entry():
    assert _env_block({"A": "1", "B": "two"}) == b"A=1\0B=two\0\0"


def test_a_closed_pool_hands_nothing_out_and_does_not_restart():
    pool = WarmAgentPool(2, base_env=dict)
    pool.close()
    pool.start()
    assert pool.take({}) is None and pool.pids() == []
    with pytest.raises(ValueError, match="0 or more"):
        WarmAgentPool(-1, base_env=dict)
