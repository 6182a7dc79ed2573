"""Where a model's repeated blocks are, and how a pipeline cuts the model into stages.

The blocks are found generically: the outermost `nn.ModuleList` / `nn.ModuleDict` /
`nn.Sequential` whose children are all of one class (`layers` in torchtitan,
`model.layers` in Hugging Face, `transformer.h` in GPT-2; never a mixture of experts'
`experts` list inside a layer), or the container `blocks=` names. FSDP shards per block, activation checkpointing and
torch.compile wrap per block, and a pipeline stage keeps a run of them.

A stage is a copy of the model without the other stages' blocks (kept under their
original names, so state_dict keys do not move) and with the modules that hold
parameters outside the blocks kept only where they run: those registered before the
blocks (embeddings) on the first stage, those after (final norm, output head) on the
last; elsewhere they become `nn.Identity`, so the model's own forward still runs: the
first stage maps tokens to hidden states, the middle ones hidden states to hidden
states, the last hidden states to its outputs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch.nn as nn

from air_sdk.errors import ConfigError

__all__ = ["Blocks", "StageLayers", "StageSplit", "build_stage", "find_blocks", "split_stages"]


@dataclass(frozen=True)
class Blocks:
    """The repeated blocks of a model: the container's path, the blocks' names in it
    (in order) and their class.

    Example:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Embedding(8, 4), nn.ModuleList(nn.Linear(4, 4) for _ in range(3)))
        >>> find_blocks(model).paths()
        ['1.0', '1.1', '1.2']
    """

    path: str
    names: tuple[str, ...]
    block_class: type[nn.Module]

    def paths(self) -> list[str]:
        """The full module path of every block."""
        return [_join(self.path, name) for name in self.names]

    def container(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.path)

    def items(self, model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
        """(name in the container, block) for the blocks still in `model`."""
        container = self.container(model)
        yield from container.named_children()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def find_blocks(model: nn.Module, path: str | None = None) -> Blocks:
    """The model's repeated blocks: the outermost `nn.ModuleList`/`nn.ModuleDict`/
    `nn.Sequential` (or a pipeline stage's `StageLayers`) whose children all share one
    class and hold parameters, and which no other such container holds (a mixture of
    experts' `layers.N.experts` is inside `layers`: the blocks are the layers); of
    several side by side, the one with the most children, then the most parameters.
    `path` (a module path such as "model.layers") names the container instead.

    Raises ConfigError naming the model's class when there is none, or what `path`
    holds when it is not a container of one class.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> blocks = find_blocks(build_llama(LlamaConfig(naming="hf", n_layers=2)))
        >>> blocks.path, blocks.names, blocks.block_class.__name__
        ('model.layers', ('0', '1'), 'HFDecoderLayer')
    """
    if path is not None:
        return _blocks_at(model, path)
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not isinstance(module, (*_CONTAINERS, StageLayers)) or _one_class(module) is None:
            continue
        if any(name.startswith(f"{outer}.") or outer == "" for outer, _ in found):
            continue  # inside blocks already found (named_modules lists outer ones first)
        if next(module.parameters(), None) is not None:
            found.append((name, module))
    if not found:
        raise ConfigError(
            f"{type(model).__name__} has no nn.ModuleList or nn.ModuleDict of repeated"
            " blocks (one class, e.g. its transformer layers): FSDP, activation"
            " checkpointing and pipeline stages work per block; keep the blocks in one"
        )
    path, container = max(
        found,
        key=lambda item: (len(item[1]._modules), sum(p.numel() for p in item[1].parameters())),
    )
    return _blocks_of(path, container)


def _one_class(container: nn.Module) -> type[nn.Module] | None:
    classes = {_block_type(c) for c in container.children()}
    return classes.pop() if len(classes) == 1 else None


def _blocks_of(path: str, container: nn.Module) -> Blocks:
    names = tuple(name for name, _ in container.named_children())
    block_class = _one_class(container)
    assert block_class is not None
    return Blocks(path=path, names=names, block_class=block_class)


def _blocks_at(model: nn.Module, path: str) -> Blocks:
    try:
        container = model.get_submodule(path)
    except AttributeError:
        raise ConfigError(
            f"blocks={path!r}: {type(model).__name__} has no module there; give the module"
            " path of the container of its repeated blocks, e.g. 'model.layers' (see"
            " model.named_modules())"
        ) from None
    if not isinstance(container, (*_CONTAINERS, StageLayers)) or _one_class(container) is None:
        classes = sorted({_block_type(c).__name__ for c in container.children()})
        raise ConfigError(
            f"blocks={path!r} is a {type(container).__name__} holding"
            f" {', '.join(classes) or 'nothing'}: give an nn.ModuleList, nn.ModuleDict or"
            " nn.Sequential whose children are all one class (the transformer layers)"
        )
    return _blocks_of(path, container)


def _block_type(module: nn.Module) -> type[nn.Module]:
    # A block wrapped for activation checkpointing or torch.compile counts as its class.
    inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(
        module, "_orig_mod", None
    )
    return type(inner) if isinstance(inner, nn.Module) else type(module)


class StageLayers(nn.Module):
    """The blocks a pipeline stage keeps, under their original names ("2", "3"), so
    the stage's state_dict keys are the whole model's. Iterates like the
    `nn.ModuleList` it replaces (`for layer in self.layers`, `len`, `[i]`, slices).

    Example:
        >>> import torch.nn as nn
        >>> kept = StageLayers({"2": nn.Linear(2, 2), "3": nn.Linear(2, 2)})
        >>> [name for name, _ in kept.named_children()], len(kept)
        (['2', '3'], 2)
    """

    def __init__(self, blocks: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, block in blocks.items():
            self.add_module(name, block)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int | slice) -> nn.Module | list[nn.Module]:
        return list(self)[index]

    def forward(self, *args: object) -> None:
        raise TypeError("StageLayers is a container: iterate over it")


@dataclass(frozen=True)
class StageSplit:
    """What each pipeline stage keeps: `blocks[i]` are the block names of stage i;
    `first_modules` (before the blocks) stay on stage 0, `last_modules` (after) on the
    last stage.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> split = split_stages(build_llama(LlamaConfig(n_layers=4)), 2)
        >>> split.blocks, split.first_modules, split.last_modules
        ((('0', '1'), ('2', '3')), ('tok_embeddings',), ('norm', 'output'))
    """

    blocks_path: str
    blocks: tuple[tuple[str, ...], ...]
    first_modules: tuple[str, ...]
    last_modules: tuple[str, ...]

    @property
    def num_stages(self) -> int:
        return len(self.blocks)


def split_stages(model: nn.Module, num_stages: int, blocks: str | None = None) -> StageSplit:
    """Cut the model into `num_stages` contiguous stages, balanced as torchtitan does:
    the embeddings count as one block on the first stage and the final norm + head as
    one block on the last, and stage sizes differ by at most one.

    `blocks`: the container's module path when `find_blocks` should not choose it.

    Raises ConfigError when there are more stages than blocks + 2, or when parameters
    sit on a module that also holds the blocks (no stage could own them alone).

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> split_stages(build_llama(LlamaConfig(n_layers=4)), 4).blocks
        (('0',), ('1', '2'), ('3',), ())
    """
    if num_stages < 1:
        raise ConfigError(f"num_stages={num_stages}: give at least 1")
    found = find_blocks(model, blocks)
    first, last = _outer_modules(model, found.path)
    _refuse_tied(model, first, last)
    units = len(found.names) + 2
    if num_stages > units:
        raise ConfigError(
            f"{num_stages} pipeline stages but {type(model).__name__} has"
            f" {len(found.names)} blocks (+ embeddings and head = {units} pieces):"
            " lower pp (or use a schedule with one stage per rank)"
        )
    base, extra = divmod(units, num_stages)
    sizes = [base + (1 if i < extra else 0) for i in range(num_stages)]
    stages: list[tuple[str, ...]] = []
    start = 0
    for i, size in enumerate(sizes):
        # The first stage's embeddings and the last stage's head take one unit each.
        count = size - (1 if i == 0 else 0) - (1 if i == num_stages - 1 else 0)
        count = max(count, 0)
        stages.append(found.names[start : start + count])
        start += count
    return StageSplit(
        blocks_path=found.path, blocks=tuple(stages), first_modules=first, last_modules=last
    )


def _outer_modules(model: nn.Module, blocks_path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Modules with parameters outside the blocks, split by registration order into
    those before the blocks and those after; checks none sits above the blocks."""
    before: list[str] = []
    after: list[str] = []
    seen_blocks = False
    prefix = blocks_path + "."
    for path, module in model.named_modules():
        if path == blocks_path:
            seen_blocks = True
            continue
        if path.startswith(prefix):
            continue
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if not own:
            continue
        if blocks_path.startswith(path + ".") or (path == "" and blocks_path):
            raise ConfigError(
                f"parameter {_join(path, own[0])!r} sits on {type(module).__name__}, which"
                f" also holds the blocks at {blocks_path!r}: no pipeline stage could own it"
                " alone; move it into a submodule (e.g. an nn.Embedding)"
            )
        if any(path.startswith(p + ".") for p in before + after):
            continue  # inside an outer module already listed
        (after if seen_blocks else before).append(path)
    return tuple(before), tuple(after)


def _refuse_tied(model: nn.Module, first: tuple[str, ...], last: tuple[str, ...]) -> None:
    def owned(paths: tuple[str, ...]) -> dict[int, str]:
        return {
            id(p): _join(path, name)
            for path in paths
            for name, p in model.get_submodule(path).named_parameters(remove_duplicate=False)
        }

    head = owned(last)
    for key, name in owned(first).items():
        if key in head:
            raise ConfigError(
                f"{name!r} and {head[key]!r} are one tied parameter, but the first and the"
                " last pipeline stage would each hold a copy that trains apart (AIR does not"
                " sum a tied parameter's gradients across stages yet). Untie it before"
                f" air.pipeline: {_untie_line(model, head[key], name)}. The head then"
                " trains as a parameter of its own, from the embedding's values"
                " (air.load_pretrained fills it from the embedding of a tied checkpoint):"
                " the first step equals the tied model's, later steps differ, the last"
                " stage holds one more vocabulary x hidden matrix, and a checkpoint or"
                " export holds both. Or use pp=1"
            )


def _untie_line(model: nn.Module, head: str, embedding: str) -> str:
    """The Python line that gives `head` its own copy of `embedding`'s values (and tells
    a `transformers` model's config, so that nothing ties them again)."""
    line = (
        f"model.{head} = torch.nn.Parameter(model.{embedding}.detach().clone())"
        if all(part.isidentifier() for part in f"{head}.{embedding}".split("."))
        else f"model.get_submodule({head.rpartition('.')[0]!r}).{head.rpartition('.')[2]}"
        f" = torch.nn.Parameter(model.get_parameter({embedding!r}).detach().clone())"
    )
    if hasattr(getattr(model, "config", None), "tie_word_embeddings"):
        line += "; model.config.tie_word_embeddings = False"
    return line


def build_stage(model: nn.Module, split: StageSplit, stage: int) -> nn.Module:
    """A deep copy of `model` holding only what stage `stage` of `split` runs; the
    modules it does not run (other stages' outer modules) become `nn.Identity`.

    Example:
        >>> from air_sdk.examples.llama import LlamaConfig, build_llama
        >>> model = build_llama(LlamaConfig(n_layers=4))
        >>> last = build_stage(model, split_stages(model, 2), 1)
        >>> sorted(last.state_dict())[:2], type(last.tok_embeddings).__name__
        (['layers.2.attention.wk.weight', 'layers.2.attention.wo.weight'], 'Identity')
    """
    if not 0 <= stage < split.num_stages:
        raise ConfigError(f"stage {stage} of {split.num_stages}: no such stage")
    part = copy.deepcopy(model)
    container = part.get_submodule(split.blocks_path)
    keep = set(split.blocks[stage])
    kept = {name: block for name, block in container.named_children() if name in keep}
    if isinstance(container, nn.ModuleDict):
        for name in [n for n in container if n not in keep]:
            del container[name]
    else:
        _set_submodule(part, split.blocks_path, StageLayers(kept))
    dropped = [
        *(split.first_modules if stage != 0 else ()),
        *(split.last_modules if stage != split.num_stages - 1 else ()),
    ]
    for path in dropped:
        _set_submodule(part, path, nn.Identity())
    return part


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def replace_block(container: nn.Module, name: str, block: nn.Module) -> None:
    """Put `block` in place of the container's child `name` (ModuleList, ModuleDict or
    StageLayers alike)."""
    if isinstance(container, nn.ModuleList):
        container[int(name)] = block
    else:
        container.register_module(name, block)
