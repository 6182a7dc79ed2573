"""What counts as a secret, and how it is hidden: one definition for store and gateway."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from air_sdk.redact import (
    REDACTED,
    TOKEN_PATTERN,
    Redactor,
    is_secret_env,
    is_secret_name,
    redact_env,
    secret_values,
)
from air_sdk.schema.worker_env import RESERVED_ENV
from air_sdk.store.auth import new_token

#: names every part of AIR must treat as secret: the union of the three lists AIR had
#: before issue 15 (the store's, the notebook capture's and the renderer's)
SECRET_NAMES = [
    "WANDB_API_KEY",
    "hf_token",
    "AWS_SECRET_ACCESS_KEY",
    "DB_PASSWORD",
    "pg_passwd",
    "AZURE_CREDENTIALS",
    "SSH_PRIVATE_KEY",
    "OPENAI_APIKEY",
    "HTTP_AUTH",
    "PROXY_AUTHORIZATION",
    "MYSQL_PWD",
]
ORDINARY_NAMES = ["LR", "EPOCHS", "WORLD", "DATA_DIR", "GIT_AUTHOR_NAME", "PWD", "OLDPWD"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_names_that_say_secret_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names_are_not(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "name", SECRET_NAMES + [n for n in ORDINARY_NAMES if n not in RESERVED_ENV]
)  # PWD is AIR's to set (the rank's working directory), so no job's env holds it
def test_every_part_of_air_follows_the_one_rule(name, monkeypatch, tmp_path):
    """The store, the Kubernetes renderer and the notebook capture each decide on their
    own whether an env var is secret; they must agree with `is_secret_name`."""
    from air_sdk.errors import SpecError
    from air_sdk.manifests import K8sOptions, render_trainjob
    from air_sdk.notebook.capture import package_cell
    from air_sdk.schema import JobSpec
    from air_sdk.store import SqliteStore

    secret = is_secret_name(name)
    value = "value-of-the-variable-1234"
    spec = JobSpec(code="print(1)", env={name: value})
    # the store keeps a secret value out of its database
    store = SqliteStore(tmp_path / "air.db")
    job, _ = store.create_job(spec, tenant="default")
    stored = store._db.read("SELECT spec FROM jobs WHERE id = ?", (job.id,))[0]["spec"]
    assert (value not in stored) is secret
    assert store.get_job(job.id).spec.env[name] == value  # the runner still gets it
    # the renderer moves it into the Kubernetes Secret
    script = JobSpec(entrypoint="train.py", env={name: value})
    manifest = render_trainjob(script, K8sOptions(image="img:1"))
    (entry,) = [e for e in manifest["spec"]["trainer"]["env"] if e["name"] == name]
    assert ("valueFrom" in entry) is secret
    # a notebook cell refuses to carry its value in the pickle
    monkeypatch.setenv(name, value)
    namespace = {"__name__": "__main__", "config": {"v": value}}
    try:
        package_cell("print(config)", namespace)
    except SpecError as exc:
        assert secret and f"${name}" in str(exc)
    else:
        assert not secret
    # an answer shows it as ***
    assert (redact_env({name: value})[name] == REDACTED) is secret


def test_no_module_keeps_a_secret_name_list_of_its_own():
    """One rule (issue 15): the words of the rule appear in air_sdk/redact.py only."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.joinpath("air_sdk").rglob("*.py"), *root.joinpath("magics").rglob("*.py")]:
        if path.name == "redact.py":
            continue
        text = path.read_text()
        if re.search(r"PASSW|CREDENTIAL", text):
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_every_token_the_store_issues_matches_the_pattern():
    for prefix in ("air", "airw"):
        for _ in range(50):
            token = new_token(prefix)
            assert TOKEN_PATTERN.fullmatch(token), token
            assert Redactor().text(f"x={token}.") == f"x={REDACTED}."


def test_a_value_holding_a_token_is_secret_whatever_its_name():
    token = new_token()
    assert is_secret_env("NOTE", f"use {token}")
    assert secret_values({"NOTE": f"use {token}", "LR": "0.1"}) == [f"use {token}"]
    assert redact_env({"NOTE": f"use {token}", "API_KEY": "1"}) == {
        "NOTE": f"use {REDACTED}",
        "API_KEY": REDACTED,
    }


def test_longer_secrets_are_replaced_whole_and_short_ones_left_in_free_text():
    r = Redactor(["abcd", "abcdefgh", "1"])
    assert r.text("abcdefgh abcd 1") == f"{REDACTED} {REDACTED} 1"
    assert r.num_values == 2


def test_regex_characters_in_a_secret_are_literal():
    r = Redactor(["a.b*c(d"])
    assert r.text("a.b*c(d axbbbcd") == f"{REDACTED} axbbbcd"


def test_json_like_values_are_scrubbed_keys_included():
    r = Redactor(["s3cr3t"])
    data = {"lines": ["x s3cr3t"], "s3cr3t": 1, "n": [1, 2.5, None, True]}
    assert r.value(data) == {
        "lines": [f"x {REDACTED}"],
        REDACTED: 1,
        "n": [1, 2.5, None, True],
    }
