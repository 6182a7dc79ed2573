"""Where a job may name its own directories on the local backend (issue 19, item 3):
`air_sdk.runner.job_paths.JobPathPolicy`, on real directories and links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from air_sdk.runner.job_paths import SETTING, JobPathPolicy, job_chosen_paths
from air_sdk.schema import JobSpec


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "home": tmp_path / "srv" / "air",
        "approved": tmp_path / "data" / "air",
        "config": tmp_path / "root" / ".config" / "air",
        "elsewhere": tmp_path / "etc",
    }
    for p in paths.values():
        p.mkdir(parents=True)
    (paths["home"] / "jobs" / "j1").mkdir(parents=True)
    return paths


def _policy(tree: dict[str, Path]) -> JobPathPolicy:
    return JobPathPolicy.build(tree["home"], [tree["approved"]], [tree["config"]])


def test_a_path_under_an_approved_root_or_the_jobs_own_directory_is_allowed(tree):
    policy = _policy(tree)
    assert policy.refusal("output_dir", str(tree["approved"] / "default" / "runs" / "7")) is None
    own = tree["home"] / "jobs" / "j1"
    assert policy.refusal("checkpoint.dir", str(own / "ckpt"), own=[own]) is None
    assert policy.refusal("output_dir", "s3://bucket/runs") is None  # not a local path


@pytest.mark.parametrize(
    "name",
    ["home", "home parent", "root", "client config parent", "other job", "elsewhere"],
)
def test_the_attackers_paths_are_refused_saying_what_to_change(tree, name):
    path = {
        "home": tree["home"],
        "home parent": tree["home"].parent,
        "root": Path("/"),
        "client config parent": tree["config"].parent,
        "other job": tree["home"] / "jobs" / "j1",
        "elsewhere": tree["elsewhere"] / "ssh",
    }[name]
    why = _policy(tree).refusal("output_dir", str(path), own=[tree["home"] / "jobs" / "j2"])
    assert why is not None and why.startswith(f"output_dir {path} "), why
    assert "leave it unset" in why


def test_outside_every_root_the_error_names_the_setting_and_the_roots(tree):
    why = JobPathPolicy.build(tree["home"], []).refusal("output_dir", "/etc/air")
    assert why is not None and SETTING in why and "(none)" in why


def test_a_link_or_dotdot_on_the_way_is_refused(tree):
    link = tree["approved"] / "link"
    os.symlink(tree["home"], link)
    why = _policy(tree).refusal("output_dir", str(link / "x"))
    assert why is not None and "symbolic link" in why
    why = _policy(tree).refusal("output_dir", f"{tree['approved']}/../air/x")
    assert why is not None and "'..'" in why


def test_an_approved_root_that_holds_the_home_still_keeps_the_home_and_its_ancestors(tree):
    policy = JobPathPolicy.build(tree["home"], [], shared=[tree["home"].parent.parent])
    assert policy.refusal("output_dir", str(tree["home"].parent / "other")) is None
    assert policy.refusal("output_dir", str(tree["home"].parent)) is not None
    assert policy.refusal("output_dir", str(tree["home"] / "outputs")) is not None


def test_both_job_chosen_fields_are_checked():
    spec = JobSpec(entrypoint="t.py", output_dir="/o", checkpoint={"dir": "/c"})
    assert job_chosen_paths(spec) == [("output_dir", "/o"), ("checkpoint.dir", "/c")]
