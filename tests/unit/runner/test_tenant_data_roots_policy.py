"""Data roots per tenant (`JobPathPolicy`, issue 19): a shared approved root is split
by tenant, a tenant's own roots are its alone, shared roots are everyone's; the
cluster file's `data_roots` reach the backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from air_sdk.runner.job_paths import JobPathPolicy
from air_sdk.scheduler.config import parse_cluster_config


def _policy(tmp_path: Path) -> JobPathPolicy:
    for d in ("home", "root", "acme-only", "scratch"):
        (tmp_path / d).mkdir()
    return JobPathPolicy.build(
        tmp_path / "home",
        [tmp_path / "root"],
        shared=[tmp_path / "scratch"],
        tenant_roots={"acme": [tmp_path / "acme-only"]},
    )


def test_each_tenant_names_only_its_own_part_of_an_approved_root(tmp_path):
    policy = _policy(tmp_path)
    mine = str(tmp_path / "root" / "acme" / "run")
    assert policy.refusal("output_dir", mine, tenant="acme") is None
    why = policy.refusal("output_dir", mine, tenant="globex")
    assert why is not None
    assert f"use one under {tmp_path / 'root' / 'globex'}/" in why
    assert "`data_roots` under [tenants.globex]" in why and "--shared-data-root" in why
    # the root itself, or a loose directory in it, is nobody's
    assert policy.refusal("output_dir", str(tmp_path / "root" / "x"), tenant="acme") is not None


def test_a_tenants_own_roots_are_its_alone_and_shared_ones_everyones(tmp_path):
    policy = _policy(tmp_path)
    own = str(tmp_path / "acme-only" / "ckpt")
    assert policy.refusal("checkpoint.dir", own, tenant="acme") is None
    why = policy.refusal("checkpoint.dir", own, tenant="globex")
    assert why is not None and "outside the directories" in why and "tenant 'globex'" in why
    for tenant in ("acme", "globex", "default"):
        assert policy.refusal("output_dir", str(tmp_path / "scratch" / "x"), tenant=tenant) is None


def test_the_cluster_files_data_roots_are_per_tenant_and_absolute():
    cfg = parse_cluster_config('[tenants.acme]\ndata_roots = ["/data/acme"]\n')
    assert cfg.data_roots == {"acme": ("/data/acme",)}
    with pytest.raises(ValueError, match="absolute"):
        parse_cluster_config('[tenants.acme]\ndata_roots = ["data/acme"]\n')
    with pytest.raises(ValueError, match="belong to one tenant"):
        parse_cluster_config('[tenants."*"]\ndata_roots = ["/data"]\n')
