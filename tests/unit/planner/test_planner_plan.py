"""`plan()`: candidates, ranking, the printed table; and the submit refusal."""

import pytest

import air_sdk
from air_sdk.planner import Cluster, candidate_layouts, device_spec, plan, preset
from air_sdk.planner.refusal import submit_refusal
from air_sdk.schema import JobSpec, ModelSpec, Parallelism, Resources


def test_candidates_keep_tensor_parallel_inside_a_node_and_divide_the_heads():
    cluster = Cluster(device_spec("h100"), nodes=2, gpus_per_node=8)
    layouts = list(candidate_layouts(preset("gpt2-124m"), cluster, 1024))
    assert {lay.tp for lay in layouts} == {1, 2, 4}  # 12 heads: 8 does not divide them
    for lay in layouts:
        assert lay.dp_replicate * lay.dp_shard * lay.tp * lay.pp * lay.cp == 16
    assert all(lay.cp == 1 for lay in layouts)  # short sequences: no context parallel
    long = list(candidate_layouts(preset("llama3-8b"), cluster, 65_536))
    assert any(lay.cp > 1 for lay in long)


def test_the_best_layout_is_the_fastest_that_fits():
    p = plan("llama3-70b", gpu="h200", nodes=2, gpus_per_node=8)
    best = p.best
    assert best is not None and best.fits
    fitting = [e for e in p.estimates if e.fits]
    # the fastest, or one within 0.5% of it that leaves more memory free
    fastest = max(fitting, key=lambda e: e.tokens_per_s)
    assert best.tokens_per_s >= 0.995 * fastest.tokens_per_s
    assert best is fastest or best.memory.total < fastest.memory.total
    assert p.flags == best.flags == "--dp-shard -1 --tp 8"
    # the non-fitting ones come last
    fits = [e.fits for e in p.estimates]
    assert fits == sorted(fits, reverse=True)


def test_the_table_names_the_parts_and_the_flags():
    text = str(plan("llama3-8b", gpu="h200", nodes=1, gpus_per_node=8))
    assert text.splitlines()[0].startswith("llama3-8b: 8.03B params, seq 8192")
    header = text.splitlines()[2].split()
    assert header[:10] == [
        "layout",
        "AC",
        "weights",
        "grads",
        "optim",
        "buffers",
        "activ",
        "(AC)",
        "total",
        "fits",
    ]
    assert "fastest that fits: FSDP8" in text
    assert "flags: --dp-shard -1" in text


def test_nothing_fits_says_what_to_change():
    p = plan("llama3-405b", gpu="l4", nodes=1, gpus_per_node=8)
    assert p.best is None and p.flags is None
    assert "nothing fits: the leanest layout" in str(p)
    assert "add nodes" in str(p)


def test_sdk_export_is_the_planner():
    p = air_sdk.plan("gpt2-124m", gpu="l4", nodes=1, gpus_per_node=1)
    assert p.best.label == "1 GPU" and p.best.fits


def _job(model, gpus=8, nodes=1, accelerator="h100", **kw):
    return JobSpec(
        code="pass",
        accelerator=accelerator,
        resources=Resources(nodes=nodes, gpus_per_node=gpus),
        model=model,
        **kw,
    )


def test_refusal_names_the_estimate_and_a_layout_that_fits():
    spec = _job(
        ModelSpec(preset="llama3-70b"),
        nodes=2,
        parallelism=Parallelism(dp_replicate=16, dp_shard=1),
    )
    reason = submit_refusal(spec)
    assert reason.startswith(
        "llama3-70b does not fit 2 x 8 H100 SXM with --dp-replicate 16 --dp-shard 1:"
        " the planner estimates"
    )
    assert "GiB per GPU (weights 262.8, grads 262.8, optimizer 525.7" in reason
    assert "against 75.7 GiB usable" in reason
    # with TP's whole activations counted (test_tp_activations), none fits 2 nodes
    assert "No layout fits 2 node(s); with 4 nodes --dp-shard -1" in reason
    assert "`air plan llama3-70b --gpu h100 --nodes 4 --gpus-per-node 8`" in reason


def test_refusal_suggests_more_nodes_when_nothing_fits_these():
    reason = submit_refusal(_job(ModelSpec(preset="llama3-70b")))
    assert "even sharded over all 8 GPUs (FSDP8)" in reason
    assert "No layout fits 1 node(s); with 4 nodes --dp-shard -1" in reason
    assert "raise --nodes" in reason


def test_no_refusal_without_enough_to_judge_or_when_it_fits():
    assert submit_refusal(_job(None)) is None  # no model
    assert submit_refusal(_job(ModelSpec(preset="llama3-70b"), gpus=0, accelerator="cpu")) is None
    assert submit_refusal(_job(ModelSpec(preset="llama3-70b"), accelerator="tpu-v5")) is None
    assert submit_refusal(_job(ModelSpec(preset="llama3-8b"))) is None
    # no accelerator named: the largest of the pool's GPUs decides
    any_gpu = _job(ModelSpec(preset="llama3-70b"), nodes=2, accelerator=None)
    assert submit_refusal(any_gpu, ["h200", "l4"]) is None
    assert "L4" in submit_refusal(any_gpu, ["l4"])
    assert submit_refusal(any_gpu, ["h200", "mystery"]) is None


def test_refusal_of_an_unknown_preset_lists_the_known():
    reason = submit_refusal(_job(ModelSpec(preset="llama9")))
    assert reason.startswith("model: no model preset 'llama9'; known: llama3-8b")


def test_refusal_respects_activation_checkpointing_turned_off():
    model = ModelSpec(preset="llama3-8b", seq_len=32_768, activation_checkpointing=False)
    reason = submit_refusal(_job(model))
    assert reason is not None and "activations" in reason
    assert submit_refusal(_job(model.model_copy(update={"activation_checkpointing": None}))) is None


@pytest.mark.parametrize("bad", [{}, {"num_layers": 2}])
def test_model_spec_says_what_is_missing(bad):
    with pytest.raises(ValueError, match="describe the model|misses hidden_size"):
        ModelSpec(**bad)


def test_refusal_when_no_node_count_would_do():
    reason = submit_refusal(_job(ModelSpec(preset="llama3-405b"), gpus=1, accelerator="l4"))
    assert reason.startswith("llama3-405b does not fit 1 x 1 L4: the planner estimates")
    assert reason.endswith(
        "No layout fits even 256 nodes: shorten the sequence or lower the micro-batch."
    )
