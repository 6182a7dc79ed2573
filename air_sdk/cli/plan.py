"""`air plan`: which parallel layouts fit a model on given GPUs, and the fastest one.

    air plan llama3-8b --gpu h200 --nodes 2 --gpus-per-node 8
    air plan --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --vocab 128256 --ffn 14336
    air plan --params 7e9 --gpu a100-80gb --json

Pure arithmetic (`air_sdk.planner`): no gateway, no torch.
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from air_sdk.cli._common import JsonOption, console, echo_json, handle_errors
from air_sdk.errors import SpecError

__all__ = ["plan_command"]

#: the table's natural width: narrower consoles would cut its cells short
_TABLE_WIDTH = 118


def _model_spec(**fields: object):  # -> ModelSpec (imported lazily with the planner)
    from air_sdk.schema.spec import ModelSpec

    try:
        return ModelSpec.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise SpecError(
            "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors()
            )
        ) from None


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def _table(rows: list[dict]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    # GiB per GPU: weights, grads, optimizer, buffers, activations without and with
    # checkpointing (AC: which one TOTAL counts), total
    for column in ("LAYOUT", "AC", "WTS", "GRD", "OPT", "BUF", "ACT", "ACT/AC", "TOTAL", "FITS"):
        table.add_column(column, justify="left" if column == "LAYOUT" else "right", no_wrap=True)
    for column in ("COMM", "STEP", "TOK/S", "MFU"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        style = "" if row["fits"] else "dim"
        table.add_row(
            row["layout"],
            "yes" if row["ac"] else "no",
            _gib(row["weights_gib"]),
            _gib(row["grads_gib"]),
            _gib(row["optimizer_gib"]),
            _gib(row["buffers_gib"]),
            _gib(row["activations_no_ac_gib"]),
            _gib(row["activations_ac_gib"]),
            _gib(row["total_gib"]),
            "[green]yes[/]" if row["fits"] else "[red]NO[/]",
            f"{row['comm_gib']:.1f}G",
            f"{row['step_s']:.2f}s",
            f"{row['tokens_per_s']:,.0f}",
            f"{row['mfu']:.0%}",
            style=style,
        )
    return table


@handle_errors
def plan_command(
    model: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODEL]",
            help="A preset: llama3-8b, llama3-70b, llama3-405b, gpt2-124m, gpt2-350m,"
            " gpt2-774m, gpt2-1.5b. Or describe the model with the options below.",
        ),
    ] = None,
    gpu: Annotated[
        str, typer.Option(help="GPU type: h100, h200, b200, a100-80gb, a100-40gb, l40s, l4 ...")
    ] = "h100",
    nodes: Annotated[int, typer.Option(min=1, help="Nodes.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs per node.")] = 8,
    params: Annotated[
        float | None, typer.Option(help="Parameter count (e.g. 7e9) when the shape is unknown.")
    ] = None,
    layers: Annotated[int | None, typer.Option(help="Transformer blocks.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="Key/value heads (default: heads).")] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary size.")] = None,
    ffn: Annotated[int | None, typer.Option(help="MLP hidden size (default: 4 x hidden).")] = None,
    arch: Annotated[str | None, typer.Option(help="llama (default) or gpt2.")] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Tokens per sequence (default: the preset's).")
    ] = None,
    micro_batch: Annotated[int, typer.Option(min=1, help="Sequences per micro-batch.")] = 1,
    grad_accum: Annotated[
        int, typer.Option(min=1, help="Micro-batches per step (pipelines use at least pp).")
    ] = 1,
    precision: Annotated[str, typer.Option(help="bf16-mixed or fp32.")] = "bf16-mixed",
    ac: Annotated[
        bool | None,
        typer.Option(
            "--ac/--no-ac",
            help="Force activation checkpointing on or off (default: only where needed).",
            show_default=False,
        ),
    ] = None,
    efficiency: Annotated[
        float,
        typer.Option(
            min=0.01,
            max=1.0,
            help="Assumed share of peak FLOP/s the matmuls reach (default: 0.36, the middle"
            " of torchtitan's published 33-39% MFU for Llama 3 8B on H100).",
        ),
    ] = 0.36,
    top: Annotated[int, typer.Option(min=1, help="Layouts shown.")] = 15,
    as_json: JsonOption = False,
) -> None:
    """Which parallel layouts fit a model on given GPUs, the fastest first, and its flags."""
    from air_sdk.planner import device_spec, plan
    from air_sdk.planner.search import verdict

    spec = _model_spec(
        preset=model,
        num_params=int(params) if params is not None else None,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        vocab_size=vocab,
        ffn_hidden_size=ffn,
        arch=arch,
        seq_len=seq_len,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        precision=precision,
        activation_checkpointing=ac,
    )
    try:
        device = device_spec(gpu)
        result = plan(spec, device, nodes, gpus_per_node, efficiency=efficiency)
    except (KeyError, ValueError) as exc:
        raise SpecError(str(exc).strip("'\"")) from None
    if as_json:
        best = result.best
        echo_json(
            {
                "model": result.shape.name,
                "num_params": result.shape.num_params,
                "gpu": device.key,
                "nodes": nodes,
                "gpus_per_node": gpus_per_node,
                "seq_len": result.setup.seq_len,
                "efficiency": result.setup.efficiency,
                "best": None if best is None else best.label,
                "flags": result.flags,
                "layouts": result.rows(),
            }
        )
        return
    console.print(result.header(), soft_wrap=True)
    console.print(
        "[dim]GiB per GPU (WTS weights, GRD grads, OPT AdamW state, BUF compute copies and"
        " buffers, ACT activations, ACT/AC with activation checkpointing; AC: used);"
        " COMM GiB sent per GPU and step[/]",
        soft_wrap=True,
    )
    # A narrow console would cut the cells short; wrapping a wide row reads better.
    Console(width=max(console.width, _TABLE_WIDTH), highlight=False).print(_table(result.rows(top)))
    if len(result.estimates) > top:
        console.print(f"[dim]... and {len(result.estimates) - top} more (--top N)[/]")
    console.print(verdict(result), soft_wrap=True)
    if result.best is None:
        raise typer.Exit(1)
