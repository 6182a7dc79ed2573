"""A real JupyterLab driven by a real chromium (Playwright, Debian's /usr/bin/chromium).

One JupyterLab per module, on a free port with a random token, in an isolated env
(temporary HOME, Jupyter dirs, AIR_HOME, AIR_CONFIG_FILE and AIR_GATEWAY_URL on a free
port; see `notebook_env`). One headless chromium per module with a fresh profile; every
request to a host other than 127.0.0.1 is aborted, so nothing leaves the machine.

Teardown runs even when a test fails: the page is closed, JupyterLab is stopped (it
shuts its kernels down), the gateway the notebook started is stopped, and whatever
still carries the env's marker (kernel, gateway, torchrun agents, ranks) is killed.
A failing test leaves a full-page screenshot and the notebook's text next to its
temporary directory (the path is in the failure report).

The pictures of the monitor in docs/images are taken by these tests from real runs.
They are written there only with `AIR_UPDATE_SCREENSHOTS=1` (a plain run must not
dirty the checkout); otherwise into the test's temporary directory, and checked the
same way either way:

    AIR_UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest tests/e2e
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import requests
from notebook_env import MARKER, REPO, IsolatedEnv, isolated_env

from air_sdk.gateway.server import running_gateway, stop_detached
from air_sdk.runner.backends.local import free_port

CHROMIUM = Path("/usr/bin/chromium")
#: the flags chromium needs here (see docs/ARCHITECTURE.md, "Known pitfalls")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: `AIR_UPDATE_SCREENSHOTS=1`: the screenshot tests rewrite docs/images
UPDATE_SCREENSHOTS_ENV = "AIR_UPDATE_SCREENSHOTS"
DOCS_IMAGES = REPO / "docs" / "images"
LAB_START_TIMEOUT_S = 60
IDLE_TEXT = "Python 3 (ipykernel) | Idle"
# Run-menu commands ("Run All Above Selected Cell", ...), by id: labels carry shortcuts.
RUN_ALL_ABOVE = "notebook:run-all-above"
RUN_ALL_BELOW = "notebook:run-all-below"
RUN_CELL = "notebook:run-cell"
_PROMPT_DONE = re.compile(r"^\[\d+\]:$")
_ERROR_MARKERS = ("Traceback (most recent call last)", "UsageError", "Error: ")


@dataclass
class LabServer:
    url: str
    token: str
    root_dir: Path
    env: IsolatedEnv
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""


@pytest.fixture(scope="module")
def chromium() -> Path:
    # CI must run the browser tests, so a missing browser fails rather than skips.
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install chromium);"
            " `make test` does it for you. Never `playwright install`: the tests drive"
            " Debian's chromium."
        )
    return CHROMIUM


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory: pytest.TempPathFactory) -> IsolatedEnv:
    return isolated_env(tmp_path_factory.mktemp("lab-env"))


@pytest.fixture(scope="module")
def jupyter_lab(lab_env: IsolatedEnv) -> Iterator[LabServer]:
    root_dir = lab_env.root / "notebooks"
    root_dir.mkdir()
    port, token = free_port(), secrets.token_hex(16)
    log_path = lab_env.root / "jupyterlab.log"
    cmd = [
        str(REPO / ".venv" / "bin" / "jupyter"),
        "lab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.port_retries=0",
        f"--port={port}",
        f"--ServerApp.token={token}",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={root_dir}",
    ]
    if not Path(cmd[0]).exists():
        cmd[0] = shutil.which("jupyter") or cmd[0]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=lab_env.vars,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab = LabServer(f"http://127.0.0.1:{port}", token, root_dir, lab_env, log_path, proc)
    try:
        _wait_for_lab(lab)
        yield lab
    finally:
        _stop_lab(lab)


def _wait_for_lab(lab: LabServer) -> None:
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if lab.proc.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {lab.proc.returncode}:\n{lab.log_tail()}")
        try:
            r = requests.get(f"{lab.url}/api/status", params={"token": lab.token}, timeout=2)
            if r.ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(
        f"JupyterLab did not answer within {LAB_START_TIMEOUT_S} s:\n{lab.log_tail()}"
    )


def _stop_lab(lab: LabServer) -> None:
    # SIGTERM: JupyterLab shuts its kernels down; then the gateway a notebook may have
    # left running; then anything else of this env (ranks, agents, a stuck kernel).
    if lab.proc.poll() is None:
        os.killpg(lab.proc.pid, signal.SIGTERM)
        try:
            lab.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(lab.proc.pid, signal.SIGKILL)
            lab.proc.wait(timeout=5)
    if running_gateway(lab.env.air_home) is not None:
        stop_detached(lab.env.air_home, timeout_s=15)
    lab.env.cleanup(grace_s=5)


@dataclass
class Browser:
    context: Any
    #: URLs the route handler refused (any host but 127.0.0.1)
    blocked: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser(chromium: Path, lab_env: IsolatedEnv) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    profile = lab_env.root / "chromium-profile"  # fresh for every module
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000},
            # HOME and XDG dirs of the env, never the user's; without the marker, so
            # the sweep of JupyterLab's leftovers does not take the browser along.
            env={k: v for k, v in lab_env.vars.items() if k != MARKER},
        )
        browser = Browser(context)

        def route(route: Any) -> None:
            if urlsplit(route.request.url).hostname == "127.0.0.1":
                route.continue_()
            else:
                browser.blocked.append(route.request.url)
                route.abort()

        context.route("**/*", route)
        try:
            yield browser
        finally:
            context.close()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


class Notebook:
    """A notebook open in JupyterLab, driven the way a user does: menus, clicks, the DOM."""

    def __init__(self, page: Any, lab: LabServer, name: str) -> None:
        self.page = page
        self.lab = lab
        self.name = name

    def open(self, timeout_s: float = 90) -> Notebook:
        # A workspace of its own: JupyterLab would otherwise reopen the notebooks of
        # earlier tests beside this one (their kernels too).
        workspace = f"test-{secrets.token_hex(4)}"
        self.page.goto(
            f"{self.lab.url}/lab/workspaces/{workspace}/tree/{quote(self.name)}"
            f"?token={self.lab.token}"
        )
        self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_idle(timeout_s)
        return self

    @property
    def cells(self) -> Any:
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")

    def cell_with(self, text: str) -> Any:
        """The one code cell whose source contains `text`."""
        cells = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell")
        cell = cells.filter(has=self.page.locator(".jp-InputArea-editor", has_text=text))
        assert cell.count() == 1, f"{cell.count()} code cells contain {text!r} in {self.name}"
        return cell

    def num_code_cells(self) -> int:
        return len(self.prompts())

    def num_code_cells_before(self, text: str) -> int:
        """Code cells above the code cell whose source contains `text`."""
        before = int(
            self.cells.evaluate_all(
                "(cells, text) => cells.filter(c => c.classList.contains('jp-CodeCell'))"
                ".findIndex(c => (c.querySelector('.jp-InputArea-editor')?.textContent || '')"
                ".includes(text))",
                text,
            )
        )
        assert before >= 0, f"no code cell contains {text!r} in {self.name}"
        return before

    def select(self, cell: Any) -> None:
        # The prompt selects the cell without entering edit mode.
        cell.locator(".jp-InputPrompt").first.click()

    def run_menu(self, command: str) -> None:
        """Open the Run menu and click the item of `command` (e.g. notebook:run-all-above)."""
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.locator(f'.lm-Menu-item[data-command="{command}"]').click(timeout=10_000)

    def status(self) -> str:
        return str(
            self.page.evaluate(
                "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
                ".map(e => e.textContent).join(' ')"
            )
        )

    def is_idle(self) -> bool:
        return IDLE_TEXT in self.status()

    def wait_idle(self, timeout_s: float = 60) -> None:
        self.page.get_by_text(IDLE_TEXT).wait_for(timeout=timeout_s * 1000)

    def prompts(self) -> list[str]:
        return [
            p.strip()
            for p in self.page.evaluate(
                "() => [...document.querySelectorAll("
                "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]"
                ".map(e => e.textContent)"
            )
        ]

    def text(self) -> str:
        """Every cell's source and outputs as the page shows them (for failure messages)."""
        return str(
            self.page.evaluate(
                "() => [...document.querySelectorAll("
                "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')]"
                ".map((c, i) => `--- cell ${i}\\n` + c.innerText).join('\\n')"
            )
        )

    def run_above(self, text: str, timeout_s: float = 120) -> None:
        """Run every cell above the code cell containing `text` ("Run All Above Selected
        Cell") and wait until they ran."""
        self.select(self.cell_with(text))
        self.run_and_wait(RUN_ALL_ABOVE, self.num_code_cells_before(text), timeout_s)

    def run_from(self, text: str, timeout_s: float = 120) -> None:
        """Run the code cell containing `text` and every cell below it."""
        self.select(self.cell_with(text))
        self.run_and_wait(RUN_ALL_BELOW, self.num_code_cells(), timeout_s)

    def run_cell(self, text: str, timeout_s: float = 120) -> None:
        """Run the code cell containing `text` (and nothing else)."""
        self.select(self.cell_with(text))
        self.run_and_wait(RUN_CELL, self.num_code_cells_before(text) + 1, timeout_s)

    def run_and_wait(self, command: str, num_code_cells: int, timeout_s: float = 120) -> None:
        """Run a Run-menu command, then wait until the first `num_code_cells` code cells
        show an execution count and the kernel is idle. The idle text alone is not
        enough: it still shows before the first queued cell starts. Fails fast, with
        the notebook's text, when a cell raised."""
        self.run_menu(command)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            prompts = self.prompts()[:num_code_cells]
            idle = self.is_idle()
            done = len(prompts) == num_code_cells and all(_PROMPT_DONE.match(p) for p in prompts)
            if idle and done:
                return
            if idle and any(marker in self.errors_text() for marker in _ERROR_MARKERS):
                time.sleep(0.5)  # let the rest of the error render
                raise AssertionError(f"a cell of {self.name} failed:\n{self.text()}")
            time.sleep(0.2)
        raise AssertionError(
            f"{command} in {self.name} did not finish within {timeout_s:g} s"
            f" (prompts {self.prompts()}, status {self.status()!r}):\n{self.text()}"
        )

    def errors_text(self) -> str:
        """The text of stderr and error outputs (JupyterLab renders both as stderr)."""
        return self.outputs_text('[data-mime-type="application/vnd.jupyter.stderr"]')

    def outputs_text(self, only: str = "") -> str:
        """The text of every output (or of those matching the CSS suffix `only`)."""
        selector = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output" + only
        return str(
            self.page.evaluate(
                "(sel) => [...document.querySelectorAll(sel)].map(e => e.innerText).join('\\n')",
                selector,
            )
        )


@pytest.fixture
def screenshot(tmp_path: Path) -> Callable[[Any, str], Path]:
    """`screenshot(locator, "monitor.png")`: a PNG of the element, in docs/images with
    `AIR_UPDATE_SCREENSHOTS=1`, else in the test's temporary directory. Returns the
    path, after checking that it holds a PNG of a visible size."""

    def take(locator: Any, name: str) -> Path:
        update = os.environ.get(UPDATE_SCREENSHOTS_ENV) == "1"
        path = (DOCS_IMAGES if update else tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # A monitor with a checkpoints table is taller than the window: grow the window
        # for the picture, or the status bar covers its bottom and the rest is cut off.
        page = locator.page
        viewport = page.viewport_size
        box = locator.bounding_box()
        if viewport and box and box["height"] + 200 > viewport["height"]:
            page.set_viewport_size({**viewport, "height": int(box["height"]) + 400})
        try:
            locator.screenshot(path=str(path))
        finally:
            if viewport:
                page.set_viewport_size(viewport)
        width, height = png_size(path.read_bytes())
        assert width >= 200 and height >= 100, f"{path}: a {width}x{height} picture"
        return path

    return take


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header; fails on anything that is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture
def open_notebook(
    browser: Browser, jupyter_lab: LabServer, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Any]:
    """`open_notebook(path)`: copy a notebook into JupyterLab's root and open it."""
    page = browser.context.new_page()
    opened: list[Notebook] = []

    def open_(source: Path) -> Notebook:
        shutil.copy(source, jupyter_lab.root_dir / source.name)
        notebook = Notebook(page, jupyter_lab, source.name).open()
        opened.append(notebook)
        return notebook

    try:
        yield open_
    finally:
        if request.node.stash.get(_FAILED, False):
            shot = tmp_path / "page.png"
            try:
                page.screenshot(path=str(shot), full_page=True)
                for notebook in opened:
                    (tmp_path / f"{notebook.name}.txt").write_text(notebook.text())
            except Exception as exc:  # the page may be gone; the report says why anyway
                print(f"could not save the failing page: {exc}")
            print(f"failing page: {shot}; JupyterLab log: {jupyter_lab.log_path}")
            print(f"blocked requests: {browser.blocked[:20]}")
        page.close()
