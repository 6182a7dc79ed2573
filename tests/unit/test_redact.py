"""What counts as a secret, and how it is hidden: one definition for store and gateway."""

from __future__ import annotations

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
from air_sdk.store.sqlite import new_token


@pytest.mark.parametrize(
    "name", ["WANDB_API_KEY", "hf_token", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "pg_passwd"]
)
def test_names_that_say_secret_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["LR", "EPOCHS", "WORLD", "DATA_DIR"])
def test_ordinary_names_are_not(name):
    assert not is_secret_name(name)


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
