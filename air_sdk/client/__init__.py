"""The AIR SDK client: `Client` talks to a gateway, `Job` is a handle on one job.

Never imports the gateway, runner, store, torch or ipywidgets: it runs anywhere
Python and `requests` do.

Examples marked `+SKIP` in this package need a running gateway (`air gateway start`);
the rest run as doctests in `make test`.

Example:
    >>> from air_sdk.client import Client
    >>> job = Client().submit_script("train.py", nodes=2)  # doctest: +SKIP
"""

from air_sdk.client.client import Client
from air_sdk.client.job import Job

__all__ = ["Client", "Job"]
