"""The gateway's `/ui` page in a real chromium (Playwright, Debian's /usr/bin/chromium):
sign in with a token, see the jobs, follow a running job live (its step moves while
nobody reloads), cancel it; a viewer token sees the job but cannot cancel it. Every
request to a host other than 127.0.0.1 is aborted, and none is made: the page uses no
CDN. It saves the job page as `docs/images/ui.png` (with AIR_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from airtest import stop_gateway_and_its_jobs

from air_sdk.client import Client, Job
from air_sdk.gateway.server import GatewayOptions, GatewayProcess, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobState

pytestmark = pytest.mark.slow

LONG = """
import time
import air_sdk.runtime as air

air.init()
for step in range(1, 100_000):
    air.log(step=step, loss=1.0 / step)
    time.sleep(0.25)
"""
STEP = re.compile(r"step (\d+)")
TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def ui_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    home = tmp_path_factory.mktemp("ui-home")
    opts = GatewayOptions(
        port=free_port(), home=home, num_nodes=2, slots_per_node=1, write_client_config=False
    )
    gw = start_detached(opts)
    yield gw
    stop_gateway_and_its_jobs(gw.url, gw.token, home)


def _long_job(gw: GatewayProcess, tmp_path: Path) -> Job:
    (tmp_path / "long.py").write_text(textwrap.dedent(LONG))
    client = Client(gw.url, gw.token)
    return client.submit_script(tmp_path / "long.py", name="ui-demo")


def _viewer_token(gw: GatewayProcess) -> str:
    answer = requests.post(
        f"{gw.url}/v1/admin/tokens",
        json={"role": "viewer", "name": "dashboard"},
        headers={"Authorization": f"Bearer {gw.token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return str(answer.json()["token"])


def _sign_in(page, gw: GatewayProcess, token: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{gw.url}/ui")
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#jobs:not([hidden])", timeout=TIMEOUT_MS)


def _step(page) -> int:  # type: ignore[no-untyped-def]
    found = STEP.search(page.inner_text("#monitor"))
    return int(found.group(1)) if found else 0


def test_a_job_is_followed_live_and_cancelled_from_the_page(
    browser, ui_gateway, tmp_path, screenshot
):
    job = _long_job(ui_gateway, tmp_path)
    page = browser.context.new_page()
    try:
        _sign_in(page, ui_gateway, ui_gateway.token)
        row = page.locator(f"tr.job-row[data-job='{job.id}']")
        row.wait_for(timeout=TIMEOUT_MS)
        assert "ui-demo" in row.inner_text()
        assert ui_gateway.token not in page.url  # the token never goes into a URL
        row.locator("a").click()
        page.wait_for_selector("#monitor[data-state=RUNNING]", timeout=TIMEOUT_MS)
        page.wait_for_function(
            "() => /step \\d+/.test(document.querySelector('#monitor').innerText)",
            timeout=TIMEOUT_MS,
        )
        first = _step(page)
        # live: the step moves with no reload, pushed by the event stream
        page.wait_for_function(
            f"() => {{ const m = /step (\\d+)/.exec(document.querySelector('#monitor').innerText);"
            f" return m && Number(m[1]) >= {first + 4}; }}",
            timeout=TIMEOUT_MS,
        )
        assert page.locator("#monitor img").count() == 1  # the chart, drawn by the gateway
        assert page.locator("#monitor").inner_text().count("QUEUED") == 0
        screenshot(page.locator("main"), "ui.png")
        page.click("#cancel")
        page.wait_for_selector("#monitor[data-state=CANCELLED]", timeout=TIMEOUT_MS)
        assert page.locator("#cancel").is_hidden()
        assert job.record().state is JobState.CANCELLED
    finally:
        page.close()
    assert browser.blocked == []  # nothing but the gateway was asked for anything


def test_a_viewer_token_sees_the_job_but_cannot_cancel_it(browser, ui_gateway, tmp_path):
    job = _long_job(ui_gateway, tmp_path)
    viewer = _viewer_token(ui_gateway)
    page = browser.context.new_page()  # a new tab: its own sessionStorage, no token
    try:
        _sign_in(page, ui_gateway, viewer)
        page.goto(f"{ui_gateway.url}/ui#job={job.id}")
        page.wait_for_selector("#monitor[data-state=RUNNING]", timeout=TIMEOUT_MS)
        assert page.locator("#cancel").is_hidden()
        assert "read-only token" in page.inner_text("#action-result")
        refused = page.evaluate(
            """async ([id, token]) => (await fetch(`/v1/jobs/${id}/cancel`,
                 {method: "POST", headers: {Authorization: "Bearer " + token}})).status""",
            [job.id, viewer],
        )
        assert refused == 403
        assert job.record().state is JobState.RUNNING
        page.click("#logout")
        page.wait_for_selector("#login:not([hidden])")
    finally:
        page.close()
        job.cancel()
