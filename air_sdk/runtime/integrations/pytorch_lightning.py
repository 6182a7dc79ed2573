"""AIR for the `pytorch_lightning` package (Lightning's older name): the same
`AirLogger` and `AirCallback` as `air_sdk.runtime.integrations.lightning`, built on
`pytorch_lightning`'s Logger and Callback.

```python
import pytorch_lightning as pl
from air_sdk.runtime.integrations.pytorch_lightning import AirCallback, AirLogger

trainer = pl.Trainer(logger=AirLogger(), callbacks=[AirCallback()])
```
"""

from __future__ import annotations

from typing import Any

from air_sdk.runtime.integrations import lightning

__all__ = [
    "AirCallback",  # noqa: F822 (made by the module's __getattr__)
    "AirLogger",  # noqa: F822
    "attach",
]

PACKAGE = "pytorch_lightning"


def attach(trainer: Any) -> None:
    """Add an AirLogger and an AirCallback to a `pytorch_lightning` Trainer
    (see `air_sdk.runtime.integrations.lightning.attach`).

    Example:
        >>> attach(pytorch_lightning.Trainer(logger=False))  # doctest: +SKIP
    """
    lightning.attach(trainer, PACKAGE)


def __getattr__(name: str) -> Any:
    if name in ("AirLogger", "AirCallback"):
        air_logger, air_callback = lightning.classes(PACKAGE)
        return air_logger if name == "AirLogger" else air_callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
