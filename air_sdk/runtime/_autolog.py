"""Autolog: AIR sees Lightning, transformers and accelerate jobs with no code change.

In an AIR job it is on from the rank's start (the supervisor starts the script under
`air_sdk.runtime._rank_main`, which installs the import hook; `AIR_AUTOLOG=0` in the
rank's environment turns it off). Elsewhere, `air.autolog()` turns it on:

```python
import air_sdk.runtime as air

air.autolog()                  # before or after importing the libraries
trainer = lightning.pytorch.Trainer(...)   # now has an AirLogger and an AirCallback
air.autolog(disable=True)      # Trainers made from now on are left alone
```

As `mlflow.autolog()` does, it patches the library's entry class once the module
defining it is imported: `Trainer.__init__` of Lightning (both `lightning.pytorch`
and `pytorch_lightning`) and of transformers, and `Accelerator.__init__`,
`save_state`, `load_state`, `gather_for_metrics` and `AcceleratedOptimizer.step` of
accelerate. Each patched call runs the library's own code first and then attaches
the integration in `air_sdk.runtime.integrations` (imported then, never before); an
integration that fails says so once on stderr and training goes on.
"""

from __future__ import annotations

import functools
import os
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

from air_sdk.schema.worker_env import WorkerEnv

__all__ = ["ENV", "WATCHED", "attach_to", "autolog", "enabled_by_env"]

#: `0` (or false/no/off) in a rank's environment turns autolog off for an AIR job
ENV = WorkerEnv.env_name("autolog")
#: the modules whose import attaches an integration: where the classes are defined
WATCHED = (
    "lightning.pytorch.trainer.trainer",
    "pytorch_lightning.trainer.trainer",
    "transformers.trainer",
    "accelerate.accelerator",
    "accelerate.optimizer",
)
_MARK = "__air_autolog__"

#: (owner, attribute, original) of every patch in place, for `autolog(disable=True)`
_patches: list[tuple[type, str, Any]] = []
_disabled = False


def enabled_by_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether an AIR job's ranks start with autolog (`AIR_AUTOLOG`, default on).

    Example:
        >>> enabled_by_env({}), enabled_by_env({"AIR_AUTOLOG": "0"})
        (True, False)
    """
    from air_sdk.runtime._rank_main import enabled

    return enabled(os.environ if env is None else env)


def autolog(*, disable: bool = False) -> None:
    """Attach AIR's integrations to every Lightning Trainer, transformers Trainer and
    accelerate Accelerator made from now on (`disable=True`: stop, and undo the patches).

    On by default inside AIR jobs; call it to use the integrations elsewhere (a
    notebook, a script under bare torchrun: metrics are then only kept locally), or
    with `disable=True` at the top of a script to keep a library's objects as they are.

    Example:
        >>> import air_sdk.runtime as air
        >>> air.autolog()
        >>> air.autolog(disable=True)
    """
    global _disabled
    from air_sdk.runtime._rank_main import import_hook

    hook = import_hook()
    if disable:
        _disabled = True
        for name in WATCHED:
            hook.forget(name)
        while _patches:
            owner, attribute, original = _patches.pop()
            setattr(owner, attribute, original)
        return
    _disabled = False
    for name in WATCHED:
        if not hook.watching(name):
            hook.watch(name, attach_to)


def attach_to(module: types.ModuleType) -> None:
    """Patch the classes a watched module defines (the import hook calls this).

    Example:
        >>> import json
        >>> attach_to(json)  # not a watched module: nothing happens
    """
    if _disabled:
        return
    patch = _PATCHERS.get(module.__name__)
    if patch is not None:
        patch(module)


def _wrap(owner: type, attribute: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    original = owner.__dict__.get(attribute)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(owner, attribute, wrapper)
    _patches.append((owner, attribute, original))


def _after_init(owner: type, attach: Callable[[Any], None]) -> None:
    def make(original: Any) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if not _disabled:
                attach(self)

        return __init__

    _wrap(owner, "__init__", make)


def _patch_lightning(module: types.ModuleType) -> None:
    package = module.__name__.removesuffix(".trainer.trainer")

    def attach(trainer: Any) -> None:
        from air_sdk.runtime.integrations import lightning

        lightning.attach(trainer, package)

    _after_init(module.Trainer, attach)


def _patch_transformers(module: types.ModuleType) -> None:
    def attach(trainer: Any) -> None:
        from air_sdk.runtime.integrations import transformers

        transformers.attach(trainer)

    _after_init(module.Trainer, attach)


def _patch_accelerator(module: types.ModuleType) -> None:
    accelerator_class = module.Accelerator

    def make_init(original: Any) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if _disabled:
                original(self, *args, **kwargs)
                return
            from air_sdk.runtime.integrations import accelerate

            if kwargs.get("log_with") is not None:
                kwargs["log_with"] = accelerate.with_air_tracker(kwargs["log_with"])
            original(self, *args, **kwargs)
            accelerate.attach(self)

        return __init__

    def make_save(original: Any) -> Callable[..., Any]:
        def save_state(self: Any, output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            location = original(self, output_dir, *args, **kwargs)
            if not _disabled:
                from air_sdk.runtime.integrations import accelerate

                seconds = time.monotonic() - started
                accelerate.after_save_state(self, location, output_dir, seconds)
            return location

        return save_state

    def make_load(original: Any) -> Callable[..., Any]:
        def load_state(self: Any, input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            result = original(self, input_dir, *args, **kwargs)
            if not _disabled:
                from air_sdk.runtime.integrations import accelerate

                accelerate.after_load_state(self, input_dir)
            return result

        return load_state

    def make_gather(original: Any) -> Callable[..., Any]:
        # evaluation loops gather every batch and step no optimizer: still progress
        def gather_for_metrics(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if not _disabled:
                from air_sdk.runtime.integrations._common import step_done

                step_done(None)
            return result

        return gather_for_metrics

    _wrap(accelerator_class, "__init__", make_init)
    _wrap(accelerator_class, "gather_for_metrics", make_gather)
    _wrap(accelerator_class, "save_state", make_save)
    _wrap(accelerator_class, "load_state", make_load)


def _patch_optimizer(module: types.ModuleType) -> None:
    step_done: Callable[[Any], None] | None = None

    def make(original: Any) -> Callable[..., Any]:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal step_done
            result = original(self, *args, **kwargs)
            if not _disabled:
                if step_done is None:
                    from air_sdk.runtime.integrations.accelerate import after_optimizer_step

                    step_done = after_optimizer_step
                step_done(self)
            return result

        return step

    _wrap(module.AcceleratedOptimizer, "step", make)


_PATCHERS: dict[str, Callable[[types.ModuleType], None]] = {
    "lightning.pytorch.trainer.trainer": _patch_lightning,
    "pytorch_lightning.trainer.trainer": _patch_lightning,
    "transformers.trainer": _patch_transformers,
    "accelerate.accelerator": _patch_accelerator,
    "accelerate.optimizer": _patch_optimizer,
}
