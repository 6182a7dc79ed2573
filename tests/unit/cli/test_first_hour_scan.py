"""Scanning a large work directory is heard before packing starts (`on_scan`), and
`air submit` shows it on a terminal only."""

from __future__ import annotations

import io
from pathlib import Path

from clitest import FakeGateway, invoke
from rich.console import Console

from air_sdk.bundle.pack import SCAN_REPORT_EVERY
from air_sdk.cli import main as cli
from air_sdk.cli.bundle_progress import BundleProgress


def many_small_files(root: Path, count: int) -> None:
    for i in range(count):
        folder = root / "data" / f"part-{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"row-{i:05d}.txt").write_text(f"row {i}\n")


def test_the_scan_is_reported_before_packing_starts(gateway: FakeGateway, script: Path) -> None:
    many_small_files(script.parent, 1200)
    heard: list[tuple[str, int, int]] = []
    client = cli.make_client()
    client.submit_script(
        script,
        progress=lambda done, total: heard.append(("pack", done, total)),
        on_scan=lambda files, num_bytes: heard.append(("scan", files, num_bytes)),
    )
    kinds = [kind for kind, _, _ in heard]
    assert kinds.index("pack") > max(i for i, kind in enumerate(kinds) if kind == "scan")
    counts = [files for kind, files, _ in heard if kind == "scan"]
    assert counts[0] == SCAN_REPORT_EVERY and counts == sorted(counts)
    assert counts[-1] == 1201  # the 1200 files and train.py


def test_a_terminal_sees_the_scan_and_a_pipe_does_not(gateway: FakeGateway, script: Path) -> None:
    out = io.StringIO()
    with BundleProgress(Console(file=out, force_terminal=True, width=100), "project/") as shown:
        shown.scanned(SCAN_REPORT_EVERY, 4096)
        shown.scanned(1201, 9000)
        shown(9000, 9000)  # packing starts: the spinner goes
    assert "scanning project/: 1,201 files" in out.getvalue()

    many_small_files(script.parent, 1200)
    result = invoke("submit", "train.py")  # CliRunner: a pipe, not a terminal
    assert result.exit_code == 0, result.output
    assert "scanning" not in result.output
