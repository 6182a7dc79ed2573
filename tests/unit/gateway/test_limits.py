"""The gateway's door: body caps (413), spec caps (422), rate limits (429 + Retry-After),
the Host allow-list (400), CORS closed by default, path parameters checked."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL, NO_RATE_LIMITS, make_app

from air_sdk.bundle import pack_directory
from air_sdk.gateway import routes
from air_sdk.gateway.options import RateLimit, RequestLimits, SecurityOptions
from air_sdk.gateway.security import RateLimiter
from air_sdk.schema.spec import MAX_ARG_CHARS, MAX_ENV_VARS


def _client(tmp_path, security: SecurityOptions, role: str = "admin", **kw) -> TestClient:
    app, store = make_app(tmp_path, security)
    client = TestClient(app, base_url=kw.pop("base_url", BASE_URL), **kw)
    client.headers["Authorization"] = f"Bearer {store.create_token(role=role)}"
    client.store = store  # type: ignore[attr-defined]
    return client


@pytest.fixture
def small(tmp_path) -> TestClient:
    limits = RequestLimits(
        max_body_bytes=2048,
        max_submit_bytes=4096,
        max_bundle_bytes=8192,
        user_rate=None,
        worker_rate=None,
        anonymous_rate=None,
    )
    return _client(tmp_path, SecurityOptions(limits=limits))


# ---- body caps -------------------------------------------------------------------------


def test_a_body_over_its_cap_is_413_with_a_message_that_says_what_to_do(small):
    big = {"name": "x" * 5000}
    r = small.post("/v1/admin/tenants", json=big)
    assert r.status_code == 413
    assert r.json()["detail"] == (
        "the request body is over 2048 bytes, the limit for this route: send a smaller body"
    )
    r = small.post("/v1/jobs", json={"entrypoint": "t.py", "code": "#" * 5000})
    assert r.status_code == 413 and "put large inline code in a file" in r.json()["detail"]
    r = small.put("/v1/bundles/" + "a" * 64, content=b"x" * 9000)
    assert r.status_code == 413 and ".airignore" in r.json()["detail"]
    assert small.post("/v1/admin/tenants", json={"name": "fits"}).status_code == 201


def test_a_chunked_body_without_content_length_is_cut_off_at_the_cap(small):
    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    r = small.put("/v1/bundles/" + "b" * 64, content=chunks())
    assert r.status_code == 413 and "8192 bytes" in r.json()["detail"]
    bundles = Path(small.store.path).parent / "bundles"  # type: ignore[attr-defined]
    assert not list(bundles.glob("*"))  # no partial upload left behind


def test_a_bad_content_length_is_400(small):
    r = small.post(
        "/v1/admin/tenants",
        content=b"{}",
        headers={"Content-Length": "nope", "Content-Type": "application/json"},
    )
    assert r.status_code == 400


def test_spec_caps_are_422_naming_the_field(tmp_path):
    client = _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    env = {f"V{i}": "1" for i in range(MAX_ENV_VARS + 1)}
    r = client.post("/v1/jobs", json={"code": "print(1)", "env": env})
    assert r.status_code == 422 and "env" in r.json()["detail"] and "limit" in r.json()["detail"]
    r = client.post("/v1/jobs", json={"code": "print(1)", "args": ["x" * (MAX_ARG_CHARS + 1)]})
    assert r.status_code == 422 and "args" in r.json()["detail"]
    r = client.post("/v1/jobs", json={"code": "print(1)", "env": {"A B": "1"}})
    assert r.status_code == 422


# ---- path parameters -------------------------------------------------------------------


@pytest.mark.parametrize(
    "job_id",
    ["..", "a;b", "a b", "%2e%2e", "x" * 81, "job\u00e9", "a%00b", "$(id)"],
)
def test_job_ids_are_checked_after_decoding(tmp_path, job_id):
    client = _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    r = client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 404


def test_bundle_and_token_ids_are_checked(tmp_path):
    client = _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    assert client.head("/v1/bundles/" + "A" * 64).status_code == 400
    assert client.head("/v1/bundles/..%2F..%2Fetc").status_code in (400, 404)
    assert client.post("/v1/admin/tokens/not-an-id/revoke").status_code == 404
    assert client.post("/v1/admin/nodes/..%2Fx/clear").status_code == 404


# ---- rate limits -----------------------------------------------------------------------


def test_a_burst_over_the_rate_gets_429_with_retry_after(tmp_path):
    limits = RequestLimits(
        user_rate=RateLimit(per_s=0.5, burst=3), anonymous_rate=RateLimit(per_s=0.5, burst=2)
    )
    client = _client(tmp_path, SecurityOptions(limits=limits))
    codes = [client.get("/v1/jobs").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = client.get("/v1/jobs")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "at most 0.5/s" in r.json()["detail"]
    # another token has its own bucket
    other = TestClient(client.app, base_url=BASE_URL)
    other.headers["Authorization"] = f"Bearer {client.store.create_token(role='viewer')}"
    assert other.get("/v1/jobs").status_code == 200
    # anonymous callers share one bucket per address
    anon = TestClient(client.app, base_url=BASE_URL)
    assert [anon.get("/v1/health").status_code for _ in range(3)] == [200, 200, 429]


def test_worker_reports_have_their_own_much_higher_rate(tmp_path):
    assert RequestLimits().worker_rate.per_s >= 10 * RequestLimits().user_rate.per_s
    limits = RequestLimits(user_rate=RateLimit(per_s=0.5, burst=1))
    client = _client(tmp_path, SecurityOptions(limits=limits))
    # a worker token posting reports is not slowed by the user bucket of the same string
    url = "/v1/jobs/j-1/attempts/1/report"
    codes = [client.post(url, json={"rank": 0}).status_code for _ in range(5)]
    assert 429 not in codes  # 401 (not a worker token), but never rate limited


def test_the_token_bucket_refills_at_its_rate():
    now = [0.0]
    limiter = RateLimiter(RateLimit(per_s=2, burst=2), clock=lambda: now[0])
    assert [limiter.acquire("k") for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5
    assert limiter.acquire("k") == 0.0
    assert limiter.acquire("k") == pytest.approx(0.5)


def test_the_limiter_forgets_idle_keys_instead_of_growing_without_bound():
    now = [0.0]
    limiter = RateLimiter(RateLimit(per_s=10, burst=10), clock=lambda: now[0], max_keys=100)
    for i in range(1000):
        now[0] += 1.0
        limiter.acquire(i)
    assert len(limiter._buckets) <= 101


def test_rate_limit_options_reject_nonsense():
    with pytest.raises(ValueError, match="per_s must be > 0"):
        RateLimit(per_s=0, burst=1)


# ---- Host header and CORS --------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8470", 200),
        ("localhost", 200),
        ("LOCALHOST:1", 200),
        ("[::1]:8470", 200),
        ("gpu-box.lan:8470", 200),
        ("evil.example", 400),
        ("127.0.0.1.evil.example", 400),
        ("localhost:8470@evil", 400),
        ("", 400),
        ("[::1", 400),
    ],
)
def test_the_host_header_must_name_this_gateway(tmp_path, host, status):
    security = SecurityOptions(allowed_hosts=("gpu-box.lan",), limits=NO_RATE_LIMITS)
    client = _client(tmp_path, security)
    r = client.get("/v1/jobs", headers={"Host": host})
    assert r.status_code == status, r.text
    if status == 400:
        assert "DNS rebinding" in r.json()["detail"]


def test_cors_is_closed_by_default(tmp_path):
    client = _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    origin = {"Origin": "https://evil.example"}
    r = client.get("/v1/jobs", headers=origin)
    assert r.status_code == 200
    assert not any(h.lower().startswith("access-control-") for h in r.headers)
    r = client.options("/v1/jobs", headers={**origin, "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_allows_only_the_configured_origins(tmp_path):
    security = SecurityOptions(cors_origins=("https://lab.example",), limits=NO_RATE_LIMITS)
    client = _client(tmp_path, security)
    ok = client.get("/v1/jobs", headers={"Origin": "https://lab.example"})
    assert ok.headers["access-control-allow-origin"] == "https://lab.example"
    assert "access-control-allow-credentials" not in ok.headers
    bad = client.get("/v1/jobs", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in bad.headers
    pre = client.options(
        "/v1/jobs",
        headers={
            "Origin": "https://lab.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert (
        pre.status_code == 200
        and "authorization" in pre.headers["access-control-allow-headers"].lower()
    )


def test_error_answers_are_json_with_a_detail(tmp_path):
    client = _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    for r in (
        client.get("/v1/jobs", headers={"Host": "evil"}),
        client.get("/v1/nope"),
        TestClient(client.app, base_url=BASE_URL).get("/v1/jobs"),
    ):
        assert r.headers["content-type"].startswith("application/json")
        assert isinstance(json.loads(r.text)["detail"], str)


def test_a_bundle_over_the_file_count_is_413(tenancy, monkeypatch):
    monkeypatch.setattr(
        routes, "unpack_bundle", functools.partial(routes.unpack_bundle, max_files=2)
    )
    owner = tenancy.client("owner")
    src = tenancy.home / "many"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.py").write_text("x = 1\n")
    bundle = pack_directory(src)
    r = owner.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data)
    assert r.status_code == 413 and "bundle refused" in r.json()["detail"]
    assert owner.head(f"/v1/bundles/{bundle.sha256}").status_code == 404
