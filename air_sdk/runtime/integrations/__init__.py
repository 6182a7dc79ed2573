"""AIR's integrations with training libraries, one module per library:

| module | library | classes |
| --- | --- | --- |
| `lightning` | `lightning.pytorch` | `AirLogger`, `AirCallback` |
| `pytorch_lightning` | `pytorch_lightning` | `AirLogger`, `AirCallback` |
| `transformers` | transformers `Trainer` | `AirCallback` |
| `accelerate` | accelerate `Accelerator` | `AirTracker` (`log_with="air"`) |

In an AIR job autolog attaches them to every Trainer and Accelerator; outside one,
`air.autolog()` does, or pass the classes yourself:

```python
from air_sdk.runtime.integrations.lightning import AirCallback, AirLogger
```

Importing this package imports no library; importing one of its modules imports
that library.
"""

__all__: list[str] = []
