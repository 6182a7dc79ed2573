"""The planner's activation bytes under tensor parallelism match what autograd keeps on
one rank of AIR's own TP plan (the gathered norm outputs and the whole logits are not
split by tp), and the submit check sizes layouts with that estimate.

Measured on rank 0 of a 2-rank world of torch's FakeProcessGroup: the shapes are real,
the collectives do no work, so the saved tensors' bytes are those of a real TP(2) job.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from air_sdk.examples.llama import LlamaConfig, build_llama, loss_fn  # noqa: E402
from air_sdk.planner import Cluster, TrainSetup, device_spec, estimate  # noqa: E402
from air_sdk.planner.model import ModelShape  # noqa: E402
from air_sdk.schema import Parallelism  # noqa: E402

CONFIG = LlamaConfig(
    n_layers=4, dim=128, n_heads=8, n_kv_heads=2, hidden_dim=320, vocab_size=512, max_seq_len=64
)
SHAPE = ModelShape("tiny", "llama", 4, 128, 8, 2, 512, 320)
BATCH, SEQ = 2, 64


@pytest.fixture
def fake_tp_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from air_sdk.runtime.parallel.meshes import _forget_meshes

    monkeypatch.delenv("AIR_PARALLELISM", raising=False)
    _forget_meshes()
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    _forget_meshes()
    dist.destroy_process_group()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under a DTensor or a functional collective's wrapper."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        t = getattr(t, names[0])
    return t


def _saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward (not weights)."""
    owned = {
        _local(t).untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]
    }
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        if storage.data_ptr() not in owned:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(model(tokens), tokens)
    return sum(seen.values())


def _planned(tp: int) -> float:
    cluster = Cluster(device_spec("h100"), nodes=1, gpus_per_node=tp)
    setup = TrainSetup(
        seq_len=SEQ, micro_batch=BATCH, precision="fp32", activation_checkpointing=False
    )
    layout = Parallelism(tp=tp).resolve(tp)
    acts = estimate(SHAPE, layout, cluster, setup).memory.activations
    assert acts is not None
    return acts


def test_tp2_activations_match_what_air_tp_plan_keeps(fake_tp_world) -> None:
    import air_sdk.runtime.parallel as parallel

    mesh = parallel.mesh(Parallelism(tp=2).resolve(2))
    model = parallel.parallelize(build_llama(CONFIG), mesh=mesh, mixed_precision="fp32")
    tokens = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ))
    measured = _saved_bytes(model, tokens)
    assert measured == pytest.approx(_planned(2), rel=0.10)


def test_submit_check_refuses_tp4_fsdp4_that_tp_whole_activations_overflow() -> None:
    # 70B, seq 8192, TP4 x FSDP4 without checkpointing on 2 x 8 H200: dividing every
    # activation by tp said it fits (~125 GiB); with what TP keeps whole it does not
    from air_sdk.planner.refusal import submit_refusal
    from air_sdk.schema import JobSpec, ModelSpec, Resources

    spec = JobSpec(
        code="pass",
        accelerator="h200",
        resources=Resources(nodes=2, gpus_per_node=8),
        model=ModelSpec(preset="llama3-70b", seq_len=8192, activation_checkpointing=False),
        parallelism=Parallelism(tp=4),
    )
    reason = submit_refusal(spec)
    assert reason is not None
    assert reason.startswith("llama3-70b does not fit 2 x 8 H200 with --dp-shard -1 --tp 4")
    assert "against 133.4 GiB usable" in reason
    assert "A layout that fits these GPUs: --dp-shard -1 --tp 8" in reason


def test_the_planner_counts_the_build_peak_of_the_path_it_recommends() -> None:
    import air_sdk
    from air_sdk.planner.search import verdict

    big = air_sdk.plan("llama3-70b", gpu="h200", nodes=2, gpus_per_node=8)
    best = big.best
    # eagerly every rank holds the whole fp32 model (263 GiB): only meta can build it
    assert best.needs_meta_init and best.init_eager_bytes > best.capacity_bytes
    assert best.init_bytes == best.init_meta_bytes < best.memory.total
    assert 'build the model under `with torch.device("meta"):`' in verdict(big)
    small = air_sdk.plan("llama3-8b", gpu="h200", nodes=1, gpus_per_node=8).best
    assert not small.needs_meta_init
    assert small.init_bytes == small.init_eager_bytes == 4 * small_params()


def small_params() -> int:
    from air_sdk.planner.model import preset

    return preset("llama3-8b").num_params
