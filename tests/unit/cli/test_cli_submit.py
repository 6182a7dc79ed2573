"""`air submit` as torchrun users type it: script arguments without `--`, `-m MODULE`."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitest import FakeGateway, flat, invoke

from air_sdk.cli.script_args import UnknownOption, split_script_args


def test_options_after_the_script_that_air_does_not_know_are_the_scripts(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "train.py", "--nodes", "2", "--epochs", "3", "--lr", "0.1")
    assert result.exit_code == 0, result.output
    spec = gateway.records["j-1"].spec
    assert spec.resources.nodes == 2
    assert spec.args == ["--epochs", "3", "--lr", "0.1"]


def test_from_the_first_script_argument_on_everything_is_the_scripts(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "train.py", "data.csv", "--nodes", "4", "--follow")
    assert result.exit_code == 0, result.output
    spec = gateway.records["j-1"].spec
    assert spec.args == ["data.csv", "--nodes", "4", "--follow"]
    assert spec.resources.nodes == 1  # --nodes went to the script
    assert "final state" not in result.stdout  # and so did --follow


def test_air_flags_among_the_script_arguments_are_warned_about(
    gateway: FakeGateway, script: Path
) -> None:
    # the torchrun rule stays (they are the script's), but they never go astray silently
    result = invoke("submit", "train.py", "--steps", "40", "--follow")
    assert result.exit_code == 0, result.output
    assert gateway.records["j-1"].spec.args == ["--steps", "40", "--follow"]
    assert (
        "warning: --follow went to the script (what follows its first argument is the"
        " script's): for air's own, put it before SCRIPT" in flat(result.stderr)
    )


def test_near_misses_of_air_flags_after_the_script_are_warned_about(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "train.py", "--node", "2", "--folow")
    assert result.exit_code == 0, result.output
    warned = flat(result.stderr)
    assert "--node went to the script" in warned and "did you mean air's --nodes?" in warned
    assert "--folow went to the script" in warned and "did you mean air's --follow?" in warned


def test_after_a_double_dash_nothing_is_warned_about(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", "train.py", "--", "--nodes", "4")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr


def test_a_near_miss_before_the_script_says_did_you_mean(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "--node", "2", "train.py")
    assert result.exit_code == 2
    assert "No such option: --node (did you mean --nodes?)" in flat(result.output)
    assert gateway.requests == []


def test_a_double_dash_still_passes_the_rest_as_is(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", "train.py", "--nodes", "2", "--", "--nodes", "4", "--")
    assert result.exit_code == 0, result.output
    spec = gateway.records["j-1"].spec
    assert (spec.resources.nodes, spec.args) == (2, ["--nodes", "4", "--"])


def test_an_unknown_option_before_the_script_says_where_script_options_go(
    gateway: FakeGateway, script: Path
) -> None:
    result = invoke("submit", "--epochs", "3", "train.py")
    assert result.exit_code == 2
    assert (
        "No such option: --epochs (the script's own options go after SCRIPT:"
        " air submit [OPTIONS] SCRIPT --epochs ...)" in flat(result.output)
    )
    assert gateway.requests == []


def test_m_runs_a_module_and_what_follows_it_is_the_modules(
    gateway: FakeGateway, script: Path
) -> None:
    (script.parent / "pkg").mkdir()
    (script.parent / "pkg" / "train.py").write_text("print('hi')\n")
    result = invoke("submit", "--nodes", "2", "-m", "pkg.train", "--epochs", "3")
    assert result.exit_code == 0, result.output
    spec = gateway.records["j-1"].spec
    assert (spec.module, spec.entrypoint, spec.args) == ("pkg.train", None, ["--epochs", "3"])
    assert spec.resources.nodes == 2 and spec.name == "pkg.train" and spec.bundle_sha256


def test_neither_script_nor_module_is_a_usage_error(gateway: FakeGateway, script: Path) -> None:
    result = invoke("submit", "--nodes", "2")
    assert result.exit_code == 2
    assert "give SCRIPT, or -m MODULE to run `python -m MODULE`" in flat(result.output)
    assert gateway.requests == []


@pytest.mark.parametrize(
    ("tokens", "own", "args"),
    [
        (["-mpkg.train", "-n2", "x"], ["-mpkg.train", "-n2"], ["x"]),
        (["--nodes=2", "t.py", "--nodes=3"], ["--nodes=2", "t.py", "--nodes=3"], []),
        (["--", "t.py", "--follow"], ["t.py"], ["--follow"]),
        (["t.py", "-f", "--lr", "1"], ["t.py", "-f"], ["--lr", "1"]),
    ],
)
def test_split_script_args(tokens: list[str], own: list[str], args: list[str]) -> None:
    takes_value = {"--nodes": True, "-n": True, "-m": True, "--follow": False, "-f": False}
    assert split_script_args(tokens, takes_value) == (own, args)


def test_split_refuses_an_unknown_option_before_the_program() -> None:
    with pytest.raises(UnknownOption, match="No such option: --lr"):
        split_script_args(["--lr=1", "t.py"], {"--nodes": True})


def test_bundling_a_large_workdir_says_so_off_a_terminal(
    gateway: FakeGateway, script: Path
) -> None:
    import os

    (script.parent / "data.bin").write_bytes(os.urandom(20 << 20))
    result = invoke("submit", "train.py")
    assert result.exit_code == 0, result.output
    assert f"bundling {script.parent.resolve()}: 20.0 MiB" in result.stderr


def test_bundling_shows_a_progress_bar_with_bytes_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from air_sdk.cli.bundle_progress import BundleProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with BundleProgress(console, "project/") as progress:
        for done in range(0, 41 << 20, 8 << 20):
            progress(done, 40 << 20)
    shown = out.getvalue()
    assert "bundling project/" in shown
    assert "40.0/40.0 MiB" in shown and "B/s" in shown


def test_a_small_bundle_shows_nothing() -> None:
    import io

    from rich.console import Console

    from air_sdk.cli.bundle_progress import BundleProgress

    out = io.StringIO()
    with BundleProgress(Console(file=out, force_terminal=True), "project/") as progress:
        progress(1 << 20, 1 << 20)
    assert out.getvalue() == ""


def test_a_syntax_error_is_found_before_upload_with_the_users_path(
    gateway: FakeGateway, script: Path
) -> None:
    script.write_text("import os\nfor step in range(3)\n    print(step)\n")
    result = invoke("submit", "train.py", "--nodes", "2")
    assert result.exit_code == 2
    said = flat(result.stderr)
    assert f"{script}, line 2: expected ':'" in said and "for step in range(3)" in said
    assert gateway.requests == []  # nothing uploaded, nothing submitted
