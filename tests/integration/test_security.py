"""A real gateway and a real job: args reach the script verbatim (an argv list, never a
shell), and a secret env value reaches the workers while its log lines show "***"."""

from __future__ import annotations

import json
import secrets

import pytest

from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

ECHO_ARGS = """
import json, os, sys
print("ARGS " + json.dumps(sys.argv[1:]), flush=True)
key = os.environ.get("WANDB_API_KEY", "")
print("KEY OK" if key == os.environ["EXPECTED_REVERSED"][::-1] else "KEY WRONG", flush=True)
print("the key is " + key, flush=True)
"""


def test_shell_metacharacters_in_args_arrive_verbatim(gateway, workdir, tmp_path):
    marker = tmp_path / "pwned"
    args = [
        "; rm -rf /",
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"&& touch {marker} || true",
        "| cat /etc/passwd > /dev/null",
        "'quoted' \"double\" \\ back",
        "$HOME ${PATH} *.py ~",
        "--lr=0.1",
        "",
    ]
    key = f"canary-{secrets.token_hex(8)}"
    job = gateway.submit_script(
        workdir(ECHO_ARGS) / "train.py",
        args=args,
        # the script gets the key reversed too, to check it without printing it in clear
        env={"WANDB_API_KEY": key, "EXPECTED_REVERSED": key[::-1]},
    )
    record = job.wait(timeout=120)
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)
    echoed = [json.loads(t[len("ARGS ") :]) for t in lines if t.startswith("ARGS ")]
    assert echoed == [args]
    assert not marker.exists()
    # the worker had the real value; every place it could show says ***
    assert "KEY OK" in lines and "the key is ***" in lines
    assert key not in json.dumps([line.model_dump() for line in job.logs()])
    assert record.spec.env["WANDB_API_KEY"] == "***"


# ---- the anonymous rate limit through a real server (issue 14, item 3) --------------------


@pytest.fixture
def limited_gateway(tmp_path):
    """A real gateway whose address limit is 5 requests, refilled 1 per 100 s."""
    from airtest import stop_gateway_and_its_jobs

    from air_sdk.gateway.options import RateLimit, RequestLimits
    from air_sdk.gateway.server import GatewayOptions, start_detached
    from air_sdk.runner.backends.local import free_port

    def start(home, **kw):
        limits = RequestLimits(anonymous_rate=RateLimit(per_s=0.01, burst=5))
        opts = GatewayOptions(
            port=free_port(), home=home, limits=limits, write_client_config=False, **kw
        )
        return start_detached(opts)

    started = []

    def make(**kw):
        gw = start(tmp_path / f"home-{len(started)}", **kw)
        started.append(gw)
        return gw

    yield make
    for i, gw in enumerate(started):
        stop_gateway_and_its_jobs(gw.url, gw.token, tmp_path / f"home-{i}")


def test_random_tokens_and_forwarded_addresses_do_not_escape_the_rate_limit(limited_gateway):
    import requests

    gw = limited_gateway()
    codes = []
    for _ in range(15):
        headers = {
            "Authorization": f"Bearer air_{secrets.token_urlsafe(32)}",
            "X-Forwarded-For": f"10.{secrets.randbelow(250)}.{secrets.randbelow(250)}.7",
        }
        codes.append(requests.get(f"{gw.url}/v1/jobs", headers=headers, timeout=10).status_code)
    # start_detached's health check took one of the 5
    assert codes[0] == 401 and set(codes) == {401, 429}, codes
    assert codes.count(401) <= 5 and codes[-5:] == [429] * 5, codes
    spoofed = {"X-Forwarded-For": "192.0.2.99"}
    assert requests.get(f"{gw.url}/v1/health", headers=spoofed, timeout=10).status_code == 429
    # a real token this gateway has not seen yet still gets in (one lookup), though its
    # address is refused
    mine = {"Authorization": f"Bearer {gw.token}"}
    assert requests.get(f"{gw.url}/v1/jobs", headers=mine, timeout=10).status_code == 200


def test_a_trusted_proxy_s_forwarded_address_is_believed(limited_gateway):
    import requests

    gw = limited_gateway(trusted_proxies=("127.0.0.1",))
    codes = [
        requests.get(
            f"{gw.url}/v1/health", headers={"X-Forwarded-For": f"10.0.0.{i}"}, timeout=10
        ).status_code
        for i in range(1, 15)
    ]
    assert codes == [200] * 14  # each client behind the proxy has its own bucket
    same = [
        requests.get(f"{gw.url}/v1/health", headers={"X-Forwarded-For": "10.0.0.1"}, timeout=10)
        for _ in range(6)
    ]
    assert same[-1].status_code == 429
