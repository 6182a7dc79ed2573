"""What a rank's environment holds, seen from inside a real job: torchrun's contract
(the restart count counts AIR's restarts, PWD is the rank's directory) and, of the
gateway's own environment, only the documented allow-list (a secret stays behind)."""

from __future__ import annotations

import json

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState, Resources

pytestmark = pytest.mark.slow

SHOW_ENV = """
import json, os, sys
names = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "AIR_ATTEMPT", "PWD", "PATH", "HOME", "JOB_SETTING", "OMP_NUM_THREADS",
    "GATEWAY_DB_PASSWORD", "AIR_TOKEN", "OPERATOR_ONLY_SETTING", "HF_HOME",
]
seen = {n: os.environ.get(n) for n in names}
seen["cwd"] = os.getcwd()
print("ENV " + json.dumps(seen), flush=True)
sys.exit(1 if os.environ["AIR_ATTEMPT"] == "1" and os.environ["RANK"] == "1" else 0)
"""


@pytest.fixture
def gateway_with_secrets(tmp_path_factory, monkeypatch):
    """A gateway whose own environment holds secrets and settings no job asked for."""
    monkeypatch.setenv("GATEWAY_DB_PASSWORD", "hunter2-of-the-gateway")
    monkeypatch.setenv("AIR_TOKEN", "air_" + "g" * 43)
    monkeypatch.setenv("OPERATOR_ONLY_SETTING", "not for jobs")
    monkeypatch.setenv("HF_HOME", "/cache/hf")  # allowed: a cache every job may share
    home = tmp_path_factory.mktemp("env-gateway")
    opts = GatewayOptions(
        port=free_port(), home=home, num_nodes=2, slots_per_node=1, write_client_config=False
    )
    gw = start_detached(opts)
    yield Client(gw.url, gw.token)
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def seen_env(job, attempt: int) -> dict[int, dict]:
    found = {}
    for line in job.logs(attempt=attempt):
        if line.text.startswith("ENV "):
            env = json.loads(line.text[4:])
            found[int(env["RANK"])] = env
    return found


def test_a_rank_sees_torchruns_contract_and_only_the_allowed_gateway_env(
    gateway_with_secrets, workdir
):
    client = gateway_with_secrets
    job = client.submit(
        JobSpec(
            entrypoint="train.py",
            env={"JOB_SETTING": "mine"},
            resources=Resources(nodes=2),
            max_restarts=1,
            failure={"backoff_base_s": 0.0, "backoff_max_s": 0.0},
        ),
        workdir=workdir(SHOW_ENV),
    )
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    first, second = seen_env(job, 1), seen_env(job, 2)
    assert set(first) == set(second) == {0, 1}
    for attempt, ranks in ((1, first), (2, second)):
        for rank, env in ranks.items():
            # torchrun's contract, from the placement
            assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (
                str(rank),
                "0",
                str(rank),
            )
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (
                "2",
                "1",
                "2",
            )
            assert env["ROLE_RANK"] == str(rank) and env["MASTER_ADDR"] == "127.0.0.1"
            assert env["MASTER_PORT"] == ranks[0]["MASTER_PORT"]  # one store for the attempt
            # libraries (Lightning, transformers) read how often the job was restarted
            assert env["TORCHELASTIC_RESTART_COUNT"] == str(attempt - 1)
            assert env["AIR_ATTEMPT"] == str(attempt)
            assert env["TORCHELASTIC_MAX_RESTARTS"] == "1"
            assert env["TORCHELASTIC_RUN_ID"] == job.id
            assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
            assert env["PWD"] == env["cwd"]  # as a shell would have it
            # the job's env, AIR's defaults, the allowed part of the gateway's
            assert env["JOB_SETTING"] == "mine" and env["OMP_NUM_THREADS"] == "1"
            assert env["PATH"] and env["HF_HOME"] == "/cache/hf"
            # and nothing else of the gateway's
            assert env["GATEWAY_DB_PASSWORD"] is None
            assert env["AIR_TOKEN"] is None
            assert env["OPERATOR_ONLY_SETTING"] is None
    texts = " ".join(line.text for line in job.logs())
    assert "hunter2-of-the-gateway" not in texts
