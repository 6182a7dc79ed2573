"""`air plan`: the table, the flags of the fastest layout, JSON, and usage errors."""

import json

from typer.testing import CliRunner

from air_sdk.cli import main as cli

runner = CliRunner()


def test_plan_prints_the_table_and_the_fastest_layouts_flags():
    result = runner.invoke(cli.app, ["plan", "llama3-70b", "--gpu", "h200", "--nodes", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "llama3-70b: 70.6B params, seq 8192, micro-batch 1, bf16-mixed;"
        " 2 x 8 H200 (133 GiB usable each); times and MFU assume the matmuls reach 36%"
        " of peak FLOP/s (--efficiency)"
    )
    header = next(line for line in lines if line.startswith("LAYOUT"))
    assert header.split() == [
        "LAYOUT", "AC", "WTS", "GRD", "OPT", "BUF", "ACT", "ACT/AC", "TOTAL", "FITS", "COMM",
        "STEP", "TOK/S", "MFU",
    ]  # fmt: skip
    first = lines[lines.index(header) + 1]
    assert first.startswith("TP8 × FSDP2") and " yes " in first
    assert "fastest that fits: TP8 × FSDP2" in result.output
    assert "flags: --dp-shard -1 --tp 8" in result.output


def test_plan_from_a_shape_and_json():
    args = ["plan", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8"]
    args += ["--vocab", "128256", "--ffn", "14336", "--seq-len", "8192", "--gpu", "h200", "--json"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["num_params"] == 8_030_261_248 and data["gpu"] == "h200"
    assert data["best"] == "FSDP8" and data["flags"] == "--dp-shard -1"
    first = data["layouts"][0]
    assert first["fits"] is True and first["activations_gib"] == first["activations_no_ac_gib"]
    assert 0 < first["activations_ac_gib"] < first["activations_no_ac_gib"]
    assert set(first["comm_by_kind_gib"]) == {"fsdp"}


def test_plan_exits_1_when_nothing_fits():
    result = runner.invoke(cli.app, ["plan", "llama3-405b", "--gpu", "l4"])
    assert result.exit_code == 1
    assert "nothing fits: the leanest layout" in result.output


def test_plan_usage_errors_say_what_to_change():
    result = runner.invoke(cli.app, ["plan", "llama9"])
    assert result.exit_code == 2
    assert "error: no model preset 'llama9'; known: llama3-8b" in result.output
    result = runner.invoke(cli.app, ["plan", "llama3-8b", "--gpu", "tpu"])
    assert result.exit_code == 2 and "no accelerator 'tpu' in AIR's table" in result.output
    result = runner.invoke(cli.app, ["plan", "--layers", "4"])
    assert result.exit_code == 2 and "misses hidden_size, num_heads, vocab_size" in result.output
    result = runner.invoke(cli.app, ["plan"])
    assert result.exit_code == 2 and "describe the model" in result.output


def test_plan_takes_the_assumed_efficiency():
    args = ["plan", "llama3-8b", "--gpu", "h100", "--efficiency", "0.5", "--json"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert '"efficiency": 0.5' in result.output
