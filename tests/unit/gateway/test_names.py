"""Names with control characters are refused everywhere (issue 14, item 1).

The probe: `re.match(r"^...$")` accepts `"nl\\n"`, so `POST /v1/jobs {"name": "nl\\n"}`
made a job `nl\\n-xxxx` that GET and cancel could not reach (404) but that ran anyway;
with a secret in its env the same submit was a 500; a tenant `default\\n` could be
created. Each attack below is sent through the real app and must be refused with
nothing created."""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from air_sdk.schema import JobSpec, TenantCreate, TokenCreate
from air_sdk.schema.names import NAME, TENANT, control_chars, is_valid, shown

#: a trailing newline (the probe's), carriage return, tab, NUL, ESC (terminal escapes),
#: DEL, Unicode line and paragraph separators, a bidi override
CONTROL = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\u2028", "\u2029", "\u202e"]
#: where the character goes: the probe's trailing one, a leading one, one inside
PLACES = [lambda c: f"nl{c}", lambda c: f"{c}nl", lambda c: f"n{c}l"]
IDS = ["trailing", "leading", "inside"]


def _jobs(tenancy) -> list:
    return tenancy.store.list_jobs(tenant="acme")


@pytest.mark.parametrize("char", CONTROL, ids=repr)
@pytest.mark.parametrize("place", PLACES, ids=IDS)
@pytest.mark.parametrize(
    "field", ["name", "pool", "accelerator", "env name", "secret env name", "entrypoint"]
)
def test_a_job_spec_name_with_a_control_character_is_422_and_creates_no_job(
    tenancy, char, place, field
):
    owner = tenancy.client("owner")
    value = place(char)
    body: dict = {"code": "print(1)"}
    if field == "env name":
        body["env"] = {value.upper(): "1"}
    elif field == "secret env name":  # was a 500: the secrets file could not be named
        body["name"], body["env"] = value, {f"API_KEY{char}": "s3cr3t-value"}
    elif field == "entrypoint":
        body = {"entrypoint": f"train.py{char}", "bundle_sha256": "a" * 64}
    else:
        body[field] = value
    r = owner.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert char not in r.json()["detail"]  # quoted as a repr, never raw
    assert _jobs(tenancy) == []


@pytest.mark.parametrize("char", CONTROL, ids=repr)
def test_a_bundle_sha_or_checkpoint_dir_with_a_control_character_is_422(tenancy, char):
    owner = tenancy.client("owner")
    for body in (
        {"entrypoint": "t.py", "bundle_sha256": "a" * 64 + char},
        {"code": "print(1)", "checkpoint": {"dir": f"/ckpt{char}"}},
    ):
        r = owner.post("/v1/jobs", json=body)
        assert r.status_code == 422, (body, r.text)
    assert _jobs(tenancy) == []


@pytest.mark.parametrize("char", CONTROL, ids=repr)
def test_tenants_and_token_names_with_a_control_character_are_422(tenancy, char):
    sysadmin = tenancy.client("sysadmin")
    before = sysadmin.get("/v1/admin/tenants").json()
    r = sysadmin.post("/v1/admin/tenants", json={"name": f"default{char}"})
    assert r.status_code == 422, r.text
    r = sysadmin.post("/v1/admin/tokens", json={"tenant": f"acme{char}", "role": "viewer"})
    assert r.status_code == 422, r.text
    r = sysadmin.post("/v1/admin/tokens", json={"name": f"bob{char}", "role": "viewer"})
    assert r.status_code == 422, r.text
    assert sysadmin.get("/v1/admin/tenants").json() == before
    names = [t["name"] for t in sysadmin.get("/v1/admin/tokens").json()["tokens"]]
    assert not any(char in n for n in names)


@pytest.mark.parametrize("char", CONTROL, ids=repr)
def test_an_idempotency_key_with_a_control_character_is_400(tenancy, char):
    owner = tenancy.client("owner")
    key = f"key{char}1".encode()  # bytes: the client would refuse to send some
    r = owner.post("/v1/jobs", json={"code": "print(1)"}, headers={"Idempotency-Key": key})
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["detail"]
    assert _jobs(tenancy) == []


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x1b", "\u2028"], ids=repr)
def test_path_names_with_a_control_character_are_not_found(tenancy, char):
    job = tenancy.submit("owner")
    owner, sysadmin = tenancy.client("owner"), tenancy.client("sysadmin")
    token_id = sysadmin.get("/v1/admin/tokens").json()["tokens"][0]["id"]
    quoted = "".join(f"%{b:02X}" for b in char.encode())
    assert owner.get(f"/v1/jobs/{job['id']}{quoted}").status_code == 404
    assert owner.post(f"/v1/jobs/{job['id']}{quoted}/cancel").status_code == 404
    assert owner.head(f"/v1/bundles/{'a' * 64}{quoted}").status_code == 400
    assert sysadmin.post(f"/v1/admin/tokens/{token_id}{quoted}/revoke").status_code == 404
    assert sysadmin.post(f"/v1/admin/nodes/node-0{quoted}/clear").status_code == 404
    # the real ones still answer
    assert owner.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"


def test_refused_values_are_quoted_short_in_the_answer(tenancy):
    owner = tenancy.client("owner")
    r = owner.post("/v1/jobs", json={"code": "print(1)", "name": "x" * 100_000 + "\n"})
    assert r.status_code == 422
    assert len(r.text) < 1000 and "(100001 characters)" in r.text


# ---- properties: whatever name is accepted can be reached --------------------------------


@hypothesis.given(name=st.text(min_size=1, max_size=70))
@hypothesis.settings(max_examples=150, deadline=None, database=None, derandomize=True)
def test_every_job_name_the_schema_accepts_matches_the_name_rule(name):
    try:
        JobSpec(code="x", name=name)
    except ValueError:
        assert not is_valid(NAME, name)
    else:
        assert is_valid(NAME, name) and not control_chars(name)


@hypothesis.given(name=st.text(min_size=1, max_size=70))
@hypothesis.settings(max_examples=150, deadline=None, database=None, derandomize=True)
def test_every_tenant_and_token_name_the_schema_accepts_is_printable(name):
    try:
        TenantCreate(name=name)
    except ValueError:
        pass
    else:
        assert is_valid(TENANT, name)
    try:
        TokenCreate(name=name)
    except ValueError:
        assert control_chars(name)
    else:
        assert not control_chars(name)


def test_a_job_the_gateway_accepts_is_reachable_and_cancellable(tenancy):
    # The probe's job ran but could not be cancelled: every accepted name must give a
    # job that GET and cancel reach.
    owner = tenancy.client("owner")
    for name in ("a", "A.b_c-9", "x" * 63, "0lead"):
        job = owner.post("/v1/jobs", json={"code": "print(1)", "name": name}).json()
        assert owner.get(f"/v1/jobs/{job['id']}").status_code == 200
        assert owner.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"


def test_shown_quotes_control_characters_visibly():
    assert shown("nl\n") == "'nl\\n'"
