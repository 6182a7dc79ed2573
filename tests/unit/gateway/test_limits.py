"""The gateway's door: body caps (413), spec caps (422), rate limits (429 + Retry-After),
the Host allow-list (400), CORS closed by default, path parameters checked."""

from __future__ import annotations

import functools
import json
import secrets
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from gatewaytest import BASE_URL, NO_RATE_LIMITS, make_app

from air_sdk.bundle import pack_directory
from air_sdk.gateway import routes
from air_sdk.gateway.options import RateLimit, RequestLimits, SecurityOptions
from air_sdk.gateway.security import RateLimiter
from air_sdk.gateway.services import bundles, submit
from air_sdk.schema.spec import MAX_ARG_CHARS, MAX_ENV_VARS, MAX_INLINE_CODE_BYTES


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
        "the request body is over 2 KiB, the limit for this route: send a smaller body"
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
    assert r.status_code == 413 and "8 KiB" in r.json()["detail"]
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
    # A refill of one request per 100 s: no refill can happen during the test, however
    # slow the machine (0.5/s refilled a bucket between requests under load).
    limits = RequestLimits(
        user_rate=RateLimit(per_s=0.01, burst=3), anonymous_rate=RateLimit(per_s=0.01, burst=2)
    )
    client = _client(tmp_path, SecurityOptions(limits=limits))
    codes = [client.get("/v1/jobs").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = client.get("/v1/jobs")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "at most 0.01/s" in r.json()["detail"]
    # another token has its own bucket
    other = TestClient(client.app, base_url=BASE_URL)
    other.headers["Authorization"] = f"Bearer {client.store.create_token(role='viewer')}"
    assert other.get("/v1/jobs").status_code == 200
    # anonymous callers share one bucket per address
    anon = TestClient(client.app, base_url=BASE_URL)
    assert [anon.get("/v1/health").status_code for _ in range(3)] == [200, 200, 429]


def _random_token() -> str:
    return f"air_{secrets.token_urlsafe(32)}"


def test_a_fresh_random_token_per_request_meets_the_address_limit(tmp_path, monkeypatch):
    # The probe: a new random bearer token on every request had a fresh bucket each time,
    # so nothing limited it. Failed authentications count against the address now, and
    # once it is out of room the token is not even looked up.
    limits = RequestLimits(user_rate=None, anonymous_rate=RateLimit(per_s=0.01, burst=3))
    client = _client(tmp_path, SecurityOptions(limits=limits))
    assert client.get("/v1/jobs").status_code == 200  # a token in use before the attack
    lookups = []
    real_lookup = client.store.lookup_token
    monkeypatch.setattr(client.store, "lookup_token", lambda t: lookups.append(t) or real_lookup(t))
    attacker = TestClient(client.app, base_url=BASE_URL)
    codes = [
        attacker.get("/v1/jobs", headers={"Authorization": f"Bearer {_random_token()}"}).status_code
        for _ in range(10)
    ]
    assert codes == [401] * 3 + [429] * 7
    assert len(lookups) == 3
    r = attacker.get("/v1/jobs", headers={"Authorization": f"Bearer {_random_token()}"})
    assert "failed authentications" in r.json()["detail"] and int(r.headers["Retry-After"]) >= 1
    # no token at all shares the same address bucket
    assert attacker.get("/v1/health").status_code == 429
    # the token that already worked is not held back by its neighbour's failures,
    # nor is a real one new to the gateway (its first request does one lookup)
    assert client.get("/v1/jobs").status_code == 200
    fresh = TestClient(client.app, base_url=BASE_URL)
    fresh.headers["Authorization"] = f"Bearer {client.store.create_token(role='viewer')}"
    assert fresh.get("/v1/jobs").status_code == 200
    # another address is not either
    elsewhere = TestClient(client.app, base_url=BASE_URL, client=("10.1.2.3", 4000))
    assert elsewhere.get("/v1/health").status_code == 200


def test_new_real_tokens_cost_their_address_nothing(tmp_path):
    limits = RequestLimits(user_rate=None, anonymous_rate=RateLimit(per_s=0.01, burst=2))
    client = _client(tmp_path, SecurityOptions(limits=limits))
    for _ in range(6):  # e.g. the first reports of many new jobs, or new users
        other = TestClient(client.app, base_url=BASE_URL)
        other.headers["Authorization"] = f"Bearer {client.store.create_token(role='viewer')}"
        assert other.get("/v1/jobs").status_code == 200
    assert TestClient(client.app, base_url=BASE_URL).get("/v1/health").status_code == 200


def test_a_revoked_token_counts_as_a_failure_again(tmp_path):
    limits = RequestLimits(user_rate=None, anonymous_rate=RateLimit(per_s=0.01, burst=2))
    client = _client(tmp_path, SecurityOptions(limits=limits))
    info, token = client.store.issue_token("default", "viewer")
    user = TestClient(client.app, base_url=BASE_URL)
    user.headers["Authorization"] = f"Bearer {token}"
    assert user.get("/v1/jobs").status_code == 200
    client.store.revoke_token(info.id)
    # the first 401 forgets it; the next ones count against the address
    assert [user.get("/v1/jobs").status_code for _ in range(4)] == [401, 401, 401, 429]


def test_ipv6_clients_are_limited_by_their_64():
    from air_sdk.gateway.security import client_key

    a = client_key({"client": ("2001:db8:1:2::1", 1)})
    b = client_key({"client": ("2001:db8:1:2:ffff::9", 2)})
    c = client_key({"client": ("2001:db8:1:3::1", 3)})
    assert a == b != c


def test_the_server_believes_no_forwarded_header_unless_told(monkeypatch):
    from air_sdk.gateway.server import GatewayOptions, uvicorn_options

    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn would read it by default
    plain = uvicorn_options(GatewayOptions(home=Path("/tmp/h")))
    assert plain["proxy_headers"] is False and plain["forwarded_allow_ips"] == ["127.0.0.1"]
    proxied = uvicorn_options(GatewayOptions(home=Path("/tmp/h"), trusted_proxies=("10.0.0.2",)))
    assert proxied["proxy_headers"] is True and proxied["forwarded_allow_ips"] == ["10.0.0.2"]


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
        bundles, "unpack_bundle", functools.partial(bundles.unpack_bundle, max_files=2)
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


# ---- one request must not freeze the gateway (issue 14, item 2) -------------------------


def _unknown_keys(num_bytes: int) -> bytes:
    n = num_bytes // len(b'"k0000000":0,')
    return ("{" + ",".join(f'"k{i:07d}":0' for i in range(n)) + "}").encode()


@pytest.fixture
def defaults(tmp_path) -> TestClient:
    """The default caps; rate limits off (these tests are not about them)."""
    return _client(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS), role="member")


def test_the_probes_8_mb_body_is_413_at_once_naming_the_limit(defaults):
    r = defaults.post(
        "/v1/jobs", content=_unknown_keys(8_000_000), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413
    assert r.json()["detail"].startswith("the request body is over 2 MiB, the limit for this route")
    assert defaults.store.list_jobs(tenant="default") == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(lambda: _unknown_keys(RequestLimits().max_submit_bytes - 100), id="top level"),
        pytest.param(
            lambda: b'{"code": "x", "resources": ' + _unknown_keys(1_500_000) + b"}", id="nested"
        ),
        pytest.param(
            lambda: json.dumps({"code": "x", "env": {f"K{i}": i for i in range(100_000)}}).encode(),
            id="env entries",
        ),
        pytest.param(lambda: json.dumps({"code": "x", "args": [0] * 300_000}).encode(), id="args"),
        pytest.param(
            lambda: json.dumps(
                {"code": "x", "failure": {"non_retryable_exit_codes": ["x"] * 300_000}}
            ).encode(),
            id="exit codes",
        ),
    ],
)
def test_a_body_under_the_cap_with_many_problems_gets_a_short_answer(defaults, body):
    data = body()
    assert len(data) <= RequestLimits().max_submit_bytes
    r = defaults.post("/v1/jobs", content=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert len(r.content) < 4096, r.text[:300]  # the probe's answer was 28 MB


def test_many_unknown_keys_are_named_once_with_a_count(defaults):
    r = defaults.post("/v1/jobs", content=_unknown_keys(100_000))
    detail = r.json()["detail"]
    assert detail.startswith("unknown fields 'k0000000', 'k0000001', 'k0000002'"), detail
    assert "and 7687 more: the fields are api_version, name" in detail


def test_an_error_answer_never_echoes_the_input(defaults):
    big = "S" * 500_000
    for body in (
        {"code": "x", "max_restarts": big},
        {"code": "x", "priority": big},
        {"code": "x", "env": {big[:1000]: 1}},
        {"code": "x", "resources": [big]},
    ):
        r = defaults.post("/v1/jobs", json=body)
        assert r.status_code == 422 and len(r.content) < 1024, r.text[:300]
        assert "S" * 41 not in r.text  # a key in the location is quoted 40 characters long


def test_a_worker_report_with_many_problems_gets_a_short_answer(tenancy):
    job = tenancy.submit("owner")
    attempt, token = tenancy.start(job["id"])
    worker = tenancy.client(Authorization=f"Bearer {token}")
    points = [{"step": 1, "ts": 0, "values": {f"m{i}": "x" for i in range(50)}}] * 5000
    r = worker.post(
        f"/v1/jobs/{job['id']}/attempts/{attempt}/report", json={"rank": 0, "points": points}
    )
    assert r.status_code == 422 and len(r.content) < 4096
    assert r.json()["detail"].startswith("not a WorkerReport: points.0.values.m0:")
    assert r.json()["detail"].endswith("and 249980 more")


def test_a_body_is_not_parsed_before_the_token_is_checked(defaults):
    anonymous = TestClient(defaults.app, base_url=BASE_URL)
    broken = b'{"code": "x", ' * 1000
    for path in ("/v1/jobs", "/v1/admin/tenants", "/v1/admin/tokens"):
        r = anonymous.post(path, content=broken, headers={"Content-Type": "application/json"})
        assert r.status_code == 401, (path, r.text)  # not 422: nobody parsed it
    r = defaults.post("/v1/jobs", content=broken, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "Invalid JSON" in r.json()["detail"]


def test_a_body_that_is_not_json_is_422_saying_so(defaults):
    r = defaults.post("/v1/jobs", content=b"code=x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 422 and "Content-Type: application/json" in r.json()["detail"]
    r = defaults.post("/v1/jobs", content=b"")
    assert r.status_code == 422 and "empty" in r.json()["detail"]


def test_health_answers_while_a_submit_body_is_being_parsed(tmp_path, monkeypatch):
    """The parse runs in a worker thread: hold it there, and /v1/health (and the event
    loop) still answer. Before issue 14 FastAPI parsed on the loop, so nothing did."""
    import anyio
    import httpx

    app, store = make_app(tmp_path, SecurityOptions(limits=NO_RATE_LIMITS))
    token = store.create_token(role="member")
    parsing, release = threading.Event(), threading.Event()
    real_parse = submit.parse_model

    def held_parse(*args, **kwargs):
        parsing.set()
        assert release.wait(30), "health never answered while the body was parsed"
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(submit, "parse_model", held_parse)

    async def scenario() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            headers = {"Authorization": f"Bearer {token}"}
            async with anyio.create_task_group() as tg:
                result: dict[str, int] = {}

                async def submit() -> None:
                    r = await client.post("/v1/jobs", json={"code": "x"}, headers=headers)
                    result["submit"] = r.status_code

                tg.start_soon(submit)
                while not parsing.is_set():
                    await anyio.sleep(0.01)
                health = await client.get("/v1/health")
                release.set()
            return health.status_code, result["submit"]

    assert anyio.run(scenario) == (200, 201)


def test_a_spec_with_the_most_inline_code_allowed_fits_the_submit_cap(defaults):
    # Real Python source, JSON-escaped as the client sends it (requests' json=).
    source = Path(routes.__file__).read_text()
    code = (source * (MAX_INLINE_CODE_BYTES // len(source) + 1))[:MAX_INLINE_CODE_BYTES]
    body = json.dumps({"code": code, "name": "big-cell"}).encode()
    assert len(body) < RequestLimits().max_submit_bytes
    r = defaults.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text[:300]
