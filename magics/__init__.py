"""IPython magics for AIR: `%%air train` runs a notebook cell as a multi-node job.

    %load_ext air_sdk          # or: %load_ext magics
    %air gateway start
    %%air train --nodes 2
    ...

See `magics.air` for every command and option (`%air?` in a notebook).
"""

from __future__ import annotations

from typing import Any

from magics.air import AirMagics, make_client, show_monitor

__all__ = ["AirMagics", "load_ipython_extension", "make_client", "show_monitor"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the `%air` / `%%air` magics (`%load_ext magics` calls this).

    Example:
        >>> load_ipython_extension(get_ipython())  # doctest: +SKIP
    """
    ipython.register_magics(AirMagics)
