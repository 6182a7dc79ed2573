"""Approved data roots per tenant (issue 19): under a root the operator approved with
`--allowed-data-root`, a tenant's job names directories only under `ROOT/<tenant>/`;
a tenant's own roots (`data_roots` in the cluster file) are its alone. So tenant A's
job cannot have tenant B's data directory created and bound read-write into its
sandbox. Through a real, sandboxed gateway."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client
from air_sdk.errors import ApiError
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobSpec, JobState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes need Linux"),
]

WRITE = """
import os, sys
open(os.path.join(os.environ["AIR_OUTPUT_DIR"], "mine.txt"), "w").write(sys.argv[1])
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, globex's own root, {tenant: member client}) on a sandboxed gateway."""
    home = tmp_path_factory.mktemp("roots-home")
    data = tmp_path_factory.mktemp("roots-data")
    root, globex_only = data / "shared-root", data / "globex-only"
    root.mkdir()
    globex_only.mkdir()
    cluster = data / "cluster.toml"
    cluster.write_text(f'[tenants.globex]\ndata_roots = ["{globex_only}"]\n')
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=1,
        slots_per_node=2,
        write_client_config=False,
        sandbox="auto",
        allowed_data_roots=(root,),
        cluster_file=cluster,
    )
    gw = start_detached(opts)
    try:
        assert "sandboxed with" in gw.log_path.read_text()
        admin = Client(gw.url, gw.token).admin
        members = {}
        for name in ("acme", "globex"):
            admin.create_tenant(name)
            members[name] = Client(gw.url, admin.create_token(tenant=name, role="member").token)
        yield root, globex_only, members
    finally:
        stop_gateway_and_its_jobs(gw.url, gw.token, home)


def _script(tmp_path: Path) -> Path:
    work = tmp_path / "job"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(textwrap.dedent(WRITE))
    return work


def _refusal(client: Client, work: Path, output_dir: Path) -> str:
    with pytest.raises(ApiError) as refused:
        client.submit(JobSpec(entrypoint="train.py", output_dir=str(output_dir)), workdir=work)
    assert refused.value.status == 400, refused.value
    return refused.value.message


def _write(client: Client, work: Path, output_dir: Path, text: str) -> None:
    spec = JobSpec(entrypoint="train.py", args=[text], output_dir=str(output_dir))
    record = client.submit(spec, workdir=work).wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.state_reason
    assert (output_dir / "mine.txt").read_text() == text


def test_a_tenant_cannot_name_anothers_data_dir_and_each_can_name_its_own(world, tmp_path):
    root, globex_only, members = world
    acme, globex = members["acme"], members["globex"]
    work = _script(tmp_path)
    # globex's part of the shared root, and globex's own root: never acme's
    for target in (root / "globex" / "dataset", globex_only / "runs", root / "loose"):
        why = _refusal(acme, work, target)
        # the refusal says which setting to change, for which tenant
        assert "`data_roots` under [tenants.acme]" in why, why
        assert str(root / "acme") in why, why
    assert "--shared-data-root" in _refusal(acme, work, root / "globex" / "dataset")
    assert not (root / "globex").exists() and not (globex_only / "runs").exists()
    # each tenant names its own: its part of the shared root, and its own roots
    _write(acme, work, root / "acme" / "run-1", "acme")
    _write(globex, work, root / "globex" / "run-1", "globex")
    _write(globex, work, globex_only / "run-2", "globex alone")
