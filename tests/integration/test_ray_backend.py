"""The Ray backend through a real gateway, on a simulated Ray cluster: a head node with
no CPUs and two worker nodes of one CPU each (`ray.cluster_utils.Cluster`), token auth
on (Ray's default), session files in a short temporary directory.

What a user sees must not change: the same jobs reach the same states with the same
metrics, logs and checkpoints; failures on Ray (a rank killed, a node actor dead, a node
removed) are named for what they are and the job resumes from its newest committed
checkpoint; cancel leaves no actor or placement group behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from airtest import no_processes_left, rank_pid, stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.runner.backends.ray_connect import reload_ray_config
from air_sdk.schema import JobSpec, JobState, Resources

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install air-runtime[ray]`")

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: fast node-death detection for the simulated cluster (Ray's defaults take ~15 s)
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
WORKER_NODE = {"num_cpus": 1, "resources": {"air_test_node": 1}}

TRAIN = """
import os, signal, sys, time
import torch
import torch.nn.functional as F
import air_sdk.runtime as air

total, every = int(sys.argv[1]), int(sys.argv[2])
die_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # rank 1 dies as it starts this step
ctx = air.init(timeout_s=60)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
optim = torch.optim.SGD(model.parameters(), lr=0.05)
state = {"model": model, "optim": optim}
step = air.checkpoint.load(state) or 0
fresh = step == 0
print(f"attempt {ctx.attempt} on {ctx.node_name} resumes after step {step}", flush=True)
while step < total:
    step += 1
    if fresh and ctx.rank == 1 and step == die_at:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(16, 8)
    loss = F.mse_loss(model(x), x)
    optim.zero_grad(); loss.backward(); optim.step()
    air.log(step=step, loss=loss.item())
    if every and step % every == 0:
        air.checkpoint.save(state, step=step)
    # rank 0 is still asleep when rank 1 dies: the runner sees the death first
    time.sleep(1.5 if fresh and ctx.rank == 0 and step == die_at - 1 else 0.1)
air.checkpoint.wait()
del model
air.shutdown()
"""


@dataclass
class RayWorld:
    cluster: Any
    client: Client
    home: Path
    storage: Path

    def node_of(self, name: str) -> Any:
        """The simulated Ray node behind an AIR node name (ray-<node id prefix>)."""
        for node in self.cluster.worker_nodes:
            if name == f"ray-{node.node_id[:12]}":
                return node
        raise AssertionError(f"no worker node named {name}")

    def job_actors(self, job_id: str) -> list[dict[str, Any]]:
        table = self.cluster.global_state.actor_table(None)
        return [a for a in table.values() if a.get("Name", "").startswith(f"air:{job_id}:")]

    def job_placement_groups(self, job_id: str) -> list[dict[str, Any]]:
        table = self.cluster.global_state.placement_group_table()
        return [p for p in table.values() if p.get("name", "").startswith(f"air:{job_id}:")]


@pytest.fixture(scope="module")
def world() -> Iterator[RayWorld]:
    from ray.cluster_utils import Cluster

    # Unix socket paths must stay under 107 characters: a short directory of our own.
    tmp = Path(tempfile.mkdtemp(prefix="airray-", dir="/tmp"))
    (tmp / "ray").mkdir()
    storage = tmp / "shared"
    storage.mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(tmp))
        env.setenv("RAY_AUTH_MODE", "token")  # Ray's default; explicit so no ~/.ray file is used
        env.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
        env.setenv("AIR_RAY_STORAGE", str(storage))
        env.setenv("OMP_NUM_THREADS", "1")
        env.delenv("RAY_ADDRESS", raising=False)
        reload_ray_config()  # this process imported Ray before the env above was set
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "gcs_server_port": free_port(),
                "_system_config": FAST_HEALTH_CHECKS,
            },
        )
        gw = None
        home = tmp / "home"
        try:
            for _ in range(2):
                cluster.add_node(**WORKER_NODE)
            cluster.wait_for_nodes()
            gw = start_detached(
                GatewayOptions(
                    port=free_port(),
                    home=home,
                    backend="ray",
                    ray_address=cluster.address,
                    write_client_config=False,
                ),
                timeout_s=120,
            )
            yield RayWorld(cluster, Client(gw.url, gw.token), home, storage)
        finally:
            if gw is not None:
                stop_gateway_and_its_jobs(gw.url, gw.token, home)
            cluster.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    return tmp_path


def submit(
    world: RayWorld, src: Path, *, total: int = 30, every: int = 5, die_at: int = 0, **spec: Any
) -> Any:
    spec.setdefault("failure", {"backoff_base_s": 0.2, "backoff_max_s": 0.5})
    spec.setdefault("resources", Resources(nodes=2))
    args = [str(total), str(every), str(die_at)]
    return world.client.submit(JobSpec(entrypoint="train.py", args=args, **spec), workdir=src)


def at_step(job: Any, step: int, timeout: float = 120) -> None:
    wait_for(lambda: (job.snapshot().step or 0) >= step, timeout, f"step {step}")


def newest_commit(world: RayWorld, job_id: str) -> int:
    found = world.client.job(job_id).checkpoints().commits
    return max((c.step for c in found), default=0)


def nothing_left(world: RayWorld, job_id: str) -> bool:
    actors = world.job_actors(job_id)
    groups = world.job_placement_groups(job_id)
    return (
        all(a["State"] == "DEAD" for a in actors)
        and all(p["state"] == "REMOVED" for p in groups)
        and no_processes_left(job_id)
    )


# -- the tests, in the order a cluster's day might go ------------------------------------


def test_the_inventory_is_the_ray_worker_nodes(world):
    nodes = world.client.inventory().nodes
    assert {n.name for n in nodes} == {f"ray-{n.node_id[:12]}" for n in world.cluster.worker_nodes}
    assert all(n.slots == 1 and n.healthy for n in nodes)  # the CPU-less head is left out


def test_a_two_node_job_succeeds_with_loss_metrics_logs_and_utilization(world, src):
    job = submit(world, src, total=30, every=0)
    record = job.wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    placed = [a.node for a in job.attempts()[0].placement.nodes]
    assert len(set(placed)) == 2 and set(placed) == {
        f"ray-{n.node_id[:12]}" for n in world.cluster.worker_nodes
    }
    losses = [m for m in job.metrics(name="loss")]
    assert {m.rank for m in losses} == {0, 1} and max(m.step for m in losses) == 30
    lines = [line.text for line in job.logs()]
    assert any(f"on {placed[0]} resumes after step 0" in t for t in lines)
    assert any(f"on {placed[1]} resumes after step 0" in t for t in lines)
    sampled = {key.split("/")[0] for key in job.snapshot().utilization}
    assert sampled == set(placed)  # each Ray node samples its own devices
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


def test_two_jobs_that_do_not_fit_together_wait_then_both_run(world, src):
    first = submit(world, src, total=20, every=0)
    second = submit(world, src, total=10, every=0)
    wait_for(lambda: first.status() is JobState.RUNNING, 120, "the first job running")
    assert second.status() is JobState.QUEUED  # 2 nodes of 1 slot: one 2-node job at a time
    assert first.wait(timeout=240).state is JobState.SUCCEEDED
    assert second.wait(timeout=240).state is JobState.SUCCEEDED
    assert second.attempts()[0].started_at >= first.record().ended_at


def test_a_killed_rank_resumes_from_the_newest_checkpoint(world, src):
    job = submit(world, src, total=60, every=5, max_restarts=2)
    at_step(job, 22)
    pid = wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1")
    newest = newest_commit(world, job.id)
    os.kill(pid, signal.SIGKILL)
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    first, second = job.attempts()[:2]
    assert first.failure.kind == "crash" and first.failure.rank == 1, first.failure.reason
    assert first.failure.signal == "SIGKILL"
    assert second.resumed_from_step is not None and second.resumed_from_step >= newest >= 20
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


def test_a_survivor_checkpoints_the_step_a_peer_died_in(world, src):
    """As on the local backend: rank 1 dies as step 27 starts while rank 0 still sleeps
    after step 26. Rank 0's marks are on its Ray node; the runner reads them through the
    node's actor and waits for rank 0's save of step 26 before it stops the attempt."""
    job = submit(world, src, total=36, every=10, die_at=27, max_restarts=1)
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    first, second = job.attempts()[:2]
    assert first.failure.kind == "crash" and first.failure.rank == 1
    assert second.resumed_from_step == 26  # not 20, the last periodic checkpoint
    found = job.checkpoints().commits
    assert [(c.attempt, c.step) for c in found if c.at_failure] == [(1, 26)]
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


DATA_TRAIN = """
import json, os, signal, sys
import torch
import torch.distributed as dist
import air_sdk.runtime as air

root, out, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = air.init(timeout_s=60)
data = air.data.ShardedDataset(root, seq_len=8, seed=11, shuffle_block=16)
stream = air.data.loader(data, 4, num_workers=1)
model = torch.nn.Linear(9, 1)
state = {"model": model, "data": stream}
step = air.checkpoint.load(state) or 0
fresh = step == 0
with open(os.path.join(out, f"a{ctx.attempt}-rank{ctx.rank}.jsonl"), "a") as log:
    for batch in stream:  # epoch 0: 60 samples, 30 per rank
        step += 1
        if fresh and ctx.rank == 1 and step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        ids = [int(sample[0]) for sample in batch]
        log.write(json.dumps({"step": step, "ids": ids}) + "\\n")
        log.flush()
        dist.all_reduce(torch.zeros(1))  # the ranks step together, as training does
        air.log(step=step, loss=1.0)
        if step % 2 == 0:
            air.checkpoint.save(state, step=step, block=True)
air.checkpoint.wait()
del model, state
air.shutdown()
"""


def test_a_sharded_dataset_resumes_on_ray_at_the_checkpointed_sample(world, tmp_path):
    """Two ranks on two Ray nodes read a ShardedDataset; rank 1 is SIGKILLed as step 5
    starts; the restart resumes from step 4's checkpoint. The samples received up to
    step 4 plus those of the restart are the uninterrupted run's order, none twice."""
    from shard_files import SEQ_LEN, token_ids, token_shards

    from air_sdk.runtime.data import ShardedDataset, write_index

    shared = world.storage / f"data-{tmp_path.name}"  # every Ray node sees it
    root, out, src = token_shards(shared / "shards"), shared / "out", tmp_path / "src"
    write_index(root)
    out.mkdir()
    src.mkdir()
    (src / "train.py").write_text(DATA_TRAIN)
    kw = {"seq_len": SEQ_LEN, "seed": 11, "shuffle_block": 16, "dp_rank": 0, "dp_size": 1}
    order = [token_ids(s) for s in ShardedDataset(root, **kw)]
    job = world.client.submit(
        JobSpec(
            entrypoint="train.py",
            args=[str(root), str(out), "5"],
            resources=Resources(nodes=2),
            max_restarts=1,
            failure={"backoff_base_s": 0.2, "backoff_max_s": 0.5},
        ),
        workdir=src,
    )
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, (record.state_reason, job.logs()[-20:])
    first, second = job.attempts()[:2]
    assert first.failure.kind == "crash" and first.failure.rank == 1
    assert second.resumed_from_step == 4

    def taken(attempt: int, rank: int, up_to: int) -> list[int]:
        lines = (out / f"a{attempt}-rank{rank}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        return [i for r in records if r["step"] <= up_to for i in r["ids"]]

    union: dict[int, int] = {}  # global position -> sample id
    for attempt, start, up_to in ((first.attempt, 0, 4), (second.attempt, 4 * 4 * 2, 99)):
        for rank in (0, 1):
            for j, sample in enumerate(taken(attempt, rank, up_to)):
                position = start + rank + 2 * j
                assert position not in union, f"position {position} read twice"
                union[position] = sample
    assert sorted(union) == list(range(len(order)))  # the whole epoch, no gap
    assert [union[p] for p in sorted(union)] == order  # in the uninterrupted order
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


def test_a_dead_node_actor_is_a_lost_node_and_the_job_resumes(world, src):
    job = submit(world, src, total=60, every=5, max_restarts=2)
    at_step(job, 12)
    rank = wait_for(lambda: rank_pid(job.id, 1), 30, "rank 1")
    # the Ray worker process of node 1's actor, whose NodeRunner started the rank
    actor = psutil.Process(rank).parent()
    newest = newest_commit(world, job.id)
    actor.kill()
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    first, second = job.attempts()[:2]
    assert first.failure.kind == "lost_node", first.failure.reason
    assert "Ray actor died" in first.failure.reason
    assert second.resumed_from_step is not None and second.resumed_from_step >= newest >= 10
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


def test_a_removed_node_fails_the_attempt_and_the_job_waits_for_a_replacement(world, src):
    job = submit(world, src, total=60, every=5, max_restarts=2)
    at_step(job, 12)
    placed = [a.node for a in job.attempts()[0].placement.nodes]
    newest = newest_commit(world, job.id)
    world.cluster.remove_node(world.node_of(placed[1]), allow_graceful=False)
    # One node left: the job goes back to the queue and waits for capacity.
    wait_for(lambda: job.status() is JobState.QUEUED, 120, "the job back in the queue")
    # the replacement first, so the cluster is whole again for the next tests whatever
    # this one finds
    replacement = world.cluster.add_node(**WORKER_NODE)
    first = job.attempts()[0]
    assert first.failure.kind == "lost_node" and "left the cluster" in first.failure.reason
    record = job.wait(timeout=300)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    last = job.attempts()[-1]
    assert f"ray-{replacement.node_id[:12]}" in {a.node for a in last.placement.nodes}
    assert last.resumed_from_step is not None and last.resumed_from_step >= newest >= 10
    wait_for(lambda: nothing_left(world, job.id), 30, "actors and placement group gone")


def test_cancel_leaves_no_actor_placement_group_or_process(world, src):
    job = submit(world, src, total=10_000, every=0)
    at_step(job, 3)
    assert any(a["State"] == "ALIVE" for a in world.job_actors(job.id))
    job.cancel()
    assert job.wait(timeout=120).state is JobState.CANCELLED
    actors, groups = world.job_actors(job.id), world.job_placement_groups(job.id)
    assert actors and all(a["State"] == "DEAD" for a in actors)
    assert groups and all(p["state"] == "REMOVED" for p in groups)
    assert no_processes_left(job.id)


def test_a_node_local_checkpoint_dir_is_refused_for_a_multi_node_job(world, src):
    job = submit(world, src, checkpoint={"dir": "/var/tmp/air-ckpt"})
    record = job.wait(timeout=120)
    assert record.state is JobState.FAILED
    assert "path on one machine" in record.state_reason
    assert "s3://" in record.state_reason  # it says what to use instead


def test_a_gateway_without_the_cluster_token_is_refused_with_how_to_fix(world, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
    }
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    code = (
        "from air_sdk.runner.backends.ray import RayBackend\n"
        f"RayBackend({world.cluster.address!r})\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert "RAY_AUTH_TOKEN" in out.stderr
