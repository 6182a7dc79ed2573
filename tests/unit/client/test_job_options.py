"""Job options are declared once (`air_sdk.client.options.JobOptions`): the CLI's
`air submit` flags, the `%%air train` flags and the SDK's keyword arguments are
compared here against that declaration, and every option lands where it says in
the JobSpec, on all three faces."""

from __future__ import annotations

import argparse
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import typer.main
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from typer.testing import CliRunner

import magics.air as air_magics
from air_sdk.cli import main as cli
from air_sdk.client import Client, Job
from air_sdk.client.options import CELL_OPTIONS, JOB_OPTIONS, JobOptions, job_spec_fields
from air_sdk.errors import SpecError
from air_sdk.notebook.function import distributed
from air_sdk.notebook.submit import submit_cell, submit_package
from air_sdk.schema import JobRecord, JobSpec, JobState

#: flags of `air submit` that are not job options: what to run and how to watch it
CLI_OWN = {"script", "args", "follow", "all_ranks", "gateway"}
#: flags of `%%air train` that are not job options: what travels, the monitor, waiting
MAGIC_OWN = {"files", "max_value_mib", "wait"}

#: a value for every option that differs from its default (and makes a valid spec)
GIVEN: dict[str, Any] = {
    "nodes": 2,
    "procs_per_node": 4,
    "gpus_per_node": 0,
    "name": "run-7",
    "env": {"LR": "0.1"},
    "max_restarts": 3,
    "total_steps": 150,
    "checkpoint_every": 50,
    "checkpoint_dir": "/data/ckpt/run-6",
    "output_dir": "/data/runs/7",
    "pool": "cpu",
    "priority": "high",
    "accelerator": "cpu",
    "timeout": 600.0,
    "dp_replicate": 2,
    "dp_shard": 2,
    "tp": 2,
    "pp": 1,
    "cp": 1,
    "model": "gpt2-124m",
    "export": ["tensorboard"],
    "memory_limit": "512MiB",
    "max_processes": 64,
    "disk_limit": "2GiB",
}
#: what the spec holds for a given value it parses (sizes become bytes)
STORED: dict[str, Any] = {"memory_limit": 512 << 20, "disk_limit": 2 << 30}


def _as_given(value: Any) -> Any:
    """A spec value in the form GIVEN writes it (export targets as `TO[=DEST]` texts)."""
    if isinstance(value, list) and value and hasattr(value[0], "to"):
        return [t.to if t.dest is None else f"{t.to}={t.dest}" for t in value]
    return value


def _spec_value(spec: JobSpec, path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_declared_default_is_the_jobspec_default():
    default_spec = JobSpec(entrypoint="t.py")
    for option in JOB_OPTIONS:
        if option.info.spec is not None and option.info.default is not None:
            assert _spec_value(default_spec, option.info.spec) == option.info.default, option.name


#: options that name the program (they stand for the script; tested on their own below)
PROGRAM = {"module"}
#: options whose values are read here, not copied (tested on their own below)
FROM_SHELL = {"env_from_shell"}


def test_the_test_sets_every_option_that_reaches_the_spec():
    assert set(GIVEN) | PROGRAM | FROM_SHELL == {
        o.name for o in JOB_OPTIONS if o.info.spec is not None
    }


def test_only_the_program_options_stay_off_the_magic():
    assert {o.name for o in JOB_OPTIONS} - {o.name for o in CELL_OPTIONS} == PROGRAM


# -- the SDK -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "function", [Client.submit_script, submit_cell, submit_package, distributed]
)
def test_the_sdk_keyword_arguments_are_the_declaration(function):
    from air_sdk.notebook.capture import CellPackage

    # the function's own module, plus the names it imports only for type checking
    namespace = {**function.__globals__, "Client": Client, "Job": Job, "CellPackage": CellPackage}
    hints = typing.get_type_hints(function, globalns=namespace)
    assert hints["options"] == typing.Unpack[JobOptions]
    assert set(typing.get_type_hints(JobOptions)) == {o.name for o in JOB_OPTIONS}


def test_client_submit_script_puts_every_option_where_it_belongs(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    sent: list[JobSpec] = []
    monkeypatch.setattr(Client, "submit", lambda self, spec, **kw: sent.append(spec))
    Client("http://gw.test", token="t").submit_script("train.py", **GIVEN)
    (spec,) = sent
    for option in JOB_OPTIONS:
        if option.info.spec is not None and option.name not in PROGRAM | FROM_SHELL:
            got = _as_given(_spec_value(spec, option.info.spec))
            assert got == STORED.get(option.name, GIVEN[option.name]), option.name


def test_client_submit_script_runs_a_module_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    sent: list[tuple[JobSpec, Any]] = []
    monkeypatch.setattr(Client, "submit", lambda self, spec, **kw: sent.append((spec, kw)))
    client = Client("http://gw.test", token="t")
    client.submit_script(module="pkg.train", args=["--epochs", "3"], nodes=2)
    ((spec, kw),) = sent
    assert (spec.module, spec.entrypoint, spec.args) == ("pkg.train", None, ["--epochs", "3"])
    assert spec.name == "pkg.train" and kw["workdir"] == tmp_path.resolve()
    with pytest.raises(SpecError, match="give a script or module='pkg.train', not both"):
        client.submit_script("pkg/train.py", module="pkg.train")
    with pytest.raises(SpecError, match="not a dotted module name"):
        client.submit_script(module="pkg/train.py")


def test_an_unknown_option_is_refused_with_the_nearest_name(tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    client = Client("http://gw.test", token="t")
    with pytest.raises(SpecError, match="unknown job option 'gpus' .did you mean 'gpus_per_node'"):
        client.submit_script(tmp_path / "train.py", gpus=2)  # type: ignore[call-arg]
    with pytest.raises(SpecError, match="did you mean 'checkpoint_every'"):
        job_spec_fields({"checkpoint_evry": 5})


# -- the CLI -------------------------------------------------------------------------------


def _cli_submit_params() -> dict[str, Any]:
    command: Any = typer.main.get_command(cli.app)  # typer's own click
    submit = command.commands["submit"]
    return {p.name: p for p in submit.params if p.name != "help"}


def test_air_submit_has_exactly_the_declared_flags_with_their_help_and_default():
    params = _cli_submit_params()
    assert set(params) - CLI_OWN == {o.name for o in JOB_OPTIONS}
    for option in JOB_OPTIONS:
        param = params[option.name]
        assert type(param).__name__ == "TyperOption"
        assert set(param.opts) | set(param.secondary_opts) == set(option.flags), option.name
        assert param.help == option.info.help
        default = getattr(param.default, "value", param.default)
        assert default == option.info.default, option.name


def test_air_submit_flags_reach_the_spec(monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    calls: list[dict[str, Any]] = []

    class Recorder:
        def submit_script(self, script: Path, **kw: Any) -> Any:
            calls.append(kw)
            return type("J", (), {"id": "j-1"})()

    monkeypatch.setattr(cli, "make_client", lambda *a, **k: Recorder())
    argv = ["submit", "train.py"]
    for name, value in GIVEN.items():
        flag = "--" + name.replace("_", "-")
        if name == "env":
            argv += [flag, "LR=0.1"]
        elif isinstance(value, list):
            argv += [part for item in value for part in (flag, item)]
        else:
            argv += [flag, str(value)]
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    (options,) = calls
    own = ("args", "progress", "on_scan")  # the script's arguments, the bundling display
    assert {k: v for k, v in options.items() if k not in own and v is not None} == GIVEN


# -- the magic -----------------------------------------------------------------------------


def _magic_actions() -> dict[str, argparse.Action]:
    parser: argparse.ArgumentParser = air_magics.AirMagics.air.parser
    return {a.dest: a for a in parser._actions if a.option_strings}


def test_air_train_has_every_declared_flag_with_its_help():
    actions = _magic_actions()
    train = {dest for dest, cmds in air_magics._OPTION_COMMANDS.items() if "train" in cmds}
    assert train - MAGIC_OWN == {o.name for o in CELL_OPTIONS}
    for option in CELL_OPTIONS:
        action = actions[option.name]
        assert set(action.option_strings) == set(option.flags), option.name
        assert action.help is not None and action.help.startswith(option.info.help)
        assert action.default is None  # so a flag given to the wrong command is caught
        if option.choices:
            assert tuple(action.choices or ()) == option.choices


class _Recorder:
    gateway_url = "http://gw.test"

    def __init__(self) -> None:
        self.specs: list[JobSpec] = []

    def submit(self, spec: JobSpec, **kw: Any) -> Job:
        self.specs.append(spec)
        now = time.time()
        record = JobRecord(
            id="j-1",
            tenant="t",
            name=spec.name,
            state=JobState.QUEUED,
            spec=spec,
            created_at=now,
            updated_at=now,
        )
        return Job(self, record)  # type: ignore[arg-type]


def test_air_train_flags_reach_the_spec(monkeypatch, tmp_path):
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "air_sdk")
    recorder = _Recorder()
    monkeypatch.setattr(air_magics, "make_client", lambda *a, **k: recorder)
    monkeypatch.setattr(air_magics, "show_monitor", lambda job, **kw: None)
    monkeypatch.chdir(tmp_path)
    line = "train"
    for name, value in GIVEN.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            line += "".join(f" {flag} {item}" for item in value)
        else:
            line += f" {flag} LR=0.1" if name == "env" else f" {flag} {value}"
    shell.run_cell_magic("air", line, "x = 1")
    (spec,) = recorder.specs
    for option in CELL_OPTIONS:
        if option.info.spec is not None and option.name not in FROM_SHELL:
            got = _as_given(_spec_value(spec, option.info.spec))
            assert got == STORED.get(option.name, GIVEN[option.name]), option.name
    shell.user_ns.pop("_air_job", None)


def test_parallelism_flags_that_do_not_fit_the_job_say_what_to_change(monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["submit", "train.py", "--nodes", "2", "--tp", "2"])
    assert result.exit_code == 2
    assert "tp=2 must stay inside one node" in result.stderr


# -- the function API ----------------------------------------------------------------------


def test_distributed_options_reach_the_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recorder = _Recorder()

    @distributed(client=recorder, **GIVEN)  # type: ignore[arg-type]
    def train() -> None:
        return None

    train.submit()
    (spec,) = recorder.specs
    for option in CELL_OPTIONS:  # module= names a program: a function is its own
        if option.info.spec is not None and option.name not in FROM_SHELL:
            got = _as_given(_spec_value(spec, option.info.spec))
            assert got == STORED.get(option.name, GIVEN[option.name]), option.name


def test_a_function_or_cell_job_refuses_a_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="module= names a program to run"):
        distributed(client=_Recorder(), module="pkg.train")(print)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="module= names a program to run"):
        submit_cell(_Recorder(), "print(1)", {}, module="pkg.train")  # type: ignore[arg-type]


# -- env from the shell --------------------------------------------------------------------


def test_env_from_shell_copies_the_named_variables_on_every_face(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "k-123")
    monkeypatch.setenv("SEED", "7")
    monkeypatch.setenv("NOT_ASKED", "x")
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    want = {"LR": "0.1", "WANDB_API_KEY": "k-123", "SEED": "7"}

    sent: list[JobSpec] = []
    monkeypatch.setattr(Client, "submit", lambda self, spec, **kw: sent.append(spec))
    Client("http://gw.test", token="t").submit_script(
        "train.py", env={"LR": "0.1"}, env_from_shell=["WANDB_API_KEY,SEED"]
    )
    assert sent[-1].env == want

    calls: list[dict[str, Any]] = []

    class Recorder:
        def submit_script(self, script: Path, **kw: Any) -> Any:
            calls.append(kw)
            return type("J", (), {"id": "j-1"})()

    monkeypatch.setattr(cli, "make_client", lambda *a, **k: Recorder())
    argv = ["submit", "train.py", "-e", "LR=0.1", "--env-from-shell", "WANDB_API_KEY"]
    result = CliRunner().invoke(cli.app, [*argv, "--env-from-shell", "SEED"])
    assert result.exit_code == 0, result.output
    assert (
        job_spec_fields({"env": calls[-1]["env"], "env_from_shell": calls[-1]["env_from_shell"]})[
            "env"
        ]
        == want
    )

    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "air_sdk")
    recorder = _Recorder()
    monkeypatch.setattr(air_magics, "make_client", lambda *a, **k: recorder)
    monkeypatch.setattr(air_magics, "show_monitor", lambda job, **kw: None)
    line = "train -e LR=0.1 --env-from-shell WANDB_API_KEY --env-from-shell SEED"
    shell.run_cell_magic("air", line, "x = 1")
    assert recorder.specs[-1].env == want
    shell.user_ns.pop("_air_job", None)


def test_env_from_shell_refuses_a_name_the_shell_lacks(monkeypatch, tmp_path):
    monkeypatch.delenv("AIR_TEST_UNSET", raising=False)
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli.app, ["submit", "train.py", "--env-from-shell", "AIR_TEST_UNSET"]
    )
    assert result.exit_code == 2
    assert "AIR_TEST_UNSET is not set in this shell; export it first" in result.stderr
    monkeypatch.setenv("LR", "0.2")
    with pytest.raises(SpecError, match="LR is given both by --env and --env-from-shell"):
        job_spec_fields({"env": {"LR": "0.1"}, "env_from_shell": ["LR"]})


def test_submit_help_says_the_shell_environment_is_not_forwarded():
    result = CliRunner().invoke(cli.app, ["submit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--env-from-shell" in text and "is not forwarded by default" in text
