"""`export_safetensors`: a committed checkpoint's model as one safetensors file that the
un-parallelized model loads, with the names it has; a damaged, missing or ambiguous
checkpoint is refused with what to do. One process; a sharded (FSDP(4)) checkpoint
is exported in test_checkpoint_layouts.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from air_sdk.errors import CheckpointError  # noqa: E402
from air_sdk.runtime import checkpoint  # noqa: E402
from air_sdk.runtime.checkpoint import Checkpointer  # noqa: E402
from air_sdk.runtime.checkpoint.export import export_safetensors, hf_names  # noqa: E402


class Recorder:
    def add_checkpoint(self, record: dict[str, Any]) -> None:
        pass

    def flush(self, timeout: float = 10.0) -> bool:
        return True

    def heartbeat(self) -> None:  # a save beats while it waits (air_sdk.runtime._shipper)
        pass


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AIR_CHECKPOINT_DIR", "AIR_PARALLELISM", "RANK", "WORLD_SIZE", "AIR_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checkpoint, "_default", None)
    monkeypatch.setattr("air_sdk.runtime._shipper.get_shipper", Recorder)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.norm(x) * self.scale


def trained(seed: int = 0) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optim.step()
    return model, optim


def test_an_exported_file_loads_into_the_plain_model_with_equal_tensors(tmp_path: Path) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model, optim = trained()
    model.layers[0] = checkpoint_wrapper(
        model.layers[0]
    )  # activation checkpointing renames its params
    Checkpointer(tmp_path / "ckpt").save(
        {"model": model, "optim": optim, "epoch": 2}, step=7, block=True
    )

    done = export_safetensors(tmp_path / "ckpt", tmp_path / "model.safetensors")
    assert (done.step, done.key, done.num_tensors) == (7, "model", 8)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    plain = Net()  # the un-parallelized, unwrapped model
    assert sorted(tensors) == sorted(plain.state_dict())  # no optimizer state, no wrapper names
    plain.load_state_dict(tensors, strict=True)
    for name, value in plain.state_dict().items():
        original = model.layers[0]._checkpoint_wrapped_module if "layers.0." in name else model
        key = name.removeprefix("layers.0.") if "layers.0." in name else name
        assert torch.equal(value, original.state_dict()[key]), name
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.metadata()["format"] == "pt"  # what transformers' loader asks for
        assert f.metadata()["air_step"] == "7"


def test_transformers_reads_it_when_installed(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers.modeling_utils import load_state_dict

    model, optim = trained()
    Checkpointer(tmp_path / "ckpt").save({"model": model, "optim": optim}, step=1, block=True)
    export_safetensors(tmp_path / "ckpt", tmp_path / "model.safetensors")
    loaded = load_state_dict(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_a_step_a_dtype_and_a_step_directory_can_be_named(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    model, optim = trained()
    ckpt.save({"model": model, "optim": optim}, step=1, block=True)
    at_1 = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.tensor([[4, 5]])).sum().backward()
    optim.step()
    ckpt.save({"model": model, "optim": optim}, step=2, block=True)

    out = tmp_path / "at-1.safetensors"
    assert export_safetensors(tmp_path / "ckpt", out, step=1, dtype="bfloat16").step == 1
    got = safetensors_torch.load_file(out)
    assert all(got[k].dtype is torch.bfloat16 for k in got)
    assert all(torch.equal(got[k], at_1[k].to(torch.bfloat16)) for k in at_1)
    assert export_safetensors(tmp_path / "ckpt" / "step-2", out).step == 2  # one step-N dir
    assert torch.equal(safetensors_torch.load_file(out)["norm.weight"], model.norm.weight)
    with pytest.raises(
        CheckpointError, match=r"no committed checkpoint of step 5 .*newest is step 2"
    ):
        export_safetensors(tmp_path / "ckpt", out, step=5)
    with pytest.raises(CheckpointError, match="holds step 2, not step 1"):
        export_safetensors(tmp_path / "ckpt" / "step-2", out, step=1)
    with pytest.raises(CheckpointError, match="dtype 'int8' is not one of float32"):
        export_safetensors(tmp_path / "ckpt", out, dtype="int8")


def test_a_damaged_or_missing_checkpoint_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    model, optim = trained()
    Checkpointer(tmp_path / "ckpt").save({"model": model, "optim": optim}, step=3, block=True)
    data = tmp_path / "ckpt" / "step-3" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:50])
    out = tmp_path / "model.safetensors"
    with pytest.raises(CheckpointError, match="does not match its manifest: __0_0.distcp"):
        export_safetensors(tmp_path / "ckpt", out)
    with pytest.raises(CheckpointError, match="no committed checkpoint under"):
        export_safetensors(tmp_path / "empty", out)
    assert not out.exists() and list(tmp_path.glob("model.safetensors*")) == []
    with pytest.raises(CheckpointError, match="the directory .*/nowhere does not exist"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "nowhere" / "m.safetensors")


def test_several_models_need_a_key_and_a_plain_state_dict_has_its_wrappers_dropped(
    tmp_path: Path,
) -> None:
    model, optim = trained()
    ema, _ = trained(seed=1)
    ddp_style = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    Checkpointer(tmp_path / "ckpt").save(
        {"model": model, "ema": ema, "optim": optim, "raw": ddp_style}, step=1, block=True
    )
    out = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match=r"several models \(ema, model\): say which"):
        export_safetensors(tmp_path / "ckpt", out)
    export_safetensors(tmp_path / "ckpt", out, key="ema")
    assert torch.equal(safetensors_torch.load_file(out)["embed.weight"], ema.embed.weight)
    export_safetensors(tmp_path / "ckpt", out, key="raw")  # a plain dict, saved as it was
    got = safetensors_torch.load_file(out)
    assert sorted(got) == sorted(model.state_dict())
    with pytest.raises(CheckpointError, match="has no key 'nope'; it has ema, model, optim, raw"):
        export_safetensors(tmp_path / "ckpt", out, key="nope")


def test_an_fsspec_url_is_read_like_a_directory(tmp_path: Path) -> None:
    url = "memory://air-test-export/run"
    model, optim = trained()
    ckpt = Checkpointer(url)
    ckpt.save({"model": model, "optim": optim}, step=4, block=True)
    export_safetensors(url, tmp_path / "m.safetensors")
    got = safetensors_torch.load_file(tmp_path / "m.safetensors")
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    assert ckpt.storage is not None
    ckpt.storage.remove_tree(url)


def test_names_lose_wrapper_parts_only() -> None:
    names = hf_names(
        [
            "module.layers.0._checkpoint_wrapped_module.w.weight",
            "_orig_mod.module.norm.weight",  # a submodule really named `module` stays
            "_fsdp_wrapped_module.out.bias",
        ]
    )
    assert list(names.values()) == ["layers.0.w.weight", "module.norm.weight", "out.bias"]
    with pytest.raises(CheckpointError, match="both 'a.weight'"):
        hf_names(["a.weight", "_orig_mod.a.weight"])


def test_the_manifest_records_what_each_key_is(tmp_path: Path) -> None:
    model, optim = trained()
    Checkpointer(tmp_path).save(
        {"model": model, "optim": optim, "epoch": 1, "parts": [torch.nn.Linear(2, 2)]},
        step=1,
        block=True,
    )
    manifest = json.loads((tmp_path / "step-1" / "manifest.json").read_text())
    assert manifest["state_kinds"] == {
        "model": "model",
        "optim": "optimizer",
        "epoch": "value",
        "parts": "model",
    }
    assert "parallelism" not in manifest  # one process, no layout
