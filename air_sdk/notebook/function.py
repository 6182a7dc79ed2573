"""`@air_sdk.distributed`: run a function on every rank of a new job, get rank 0's value.

The function API of AIR, as `TorchTrainer(fn)` is Ray Train's: decorate a
function, call it, and it runs as a multi-node `torch.distributed` job; the call
returns what rank 0 returned. From a notebook or a script alike.

```python
import air_sdk

@air_sdk.distributed(nodes=2, gpus_per_node=8, max_restarts=3)
def train(epochs: int, lr: float = 1e-3) -> dict:
    import air_sdk.runtime as air
    ctx = air.init()
    ...
    return {"loss": loss.item()}

metrics = train(3, lr=0.01)      # blocks; the ranks' output is printed as it comes
job = train.submit(3)            # returns the Job at once; job.result() later
big = train.options(nodes=8)     # the same function with other job options
```

It is the same packaging as `%%air train` (`air_sdk.notebook.capture.package_call`):
the function and its arguments are pickled with cloudpickle, the function by value
when it belongs to the notebook or the script (`__main__`), with the globals it uses;
an argument that cannot travel or is too large is refused before upload, naming it.
Job options are those of `air_sdk.client.options.JobOptions` (the declaration the
CLI's and `%%air train`'s flags are made from), typed for IDEs and checked when the
function is decorated; they go to `air_sdk.notebook.submit.submit_package`, the
submit path of `%%air train`.

Rank 0's return value comes back through the gateway (`air_sdk.runtime.function_call`,
at most `MAX_RESULT_BYTES` pickled); an exception on any rank is raised in the caller
as `JobFailedError`, with the remote traceback (IPython shows it). Ctrl-C (interrupting
the kernel) while a call waits cancels its job; `.submit()` leaves jobs to you.

Example:
    >>> @distributed(nodes=2)
    ... def world() -> int:
    ...     import torch.distributed as dist
    ...     dist.init_process_group("gloo")
    ...     return dist.get_world_size()
    >>> world()  # doctest: +SKIP
    2
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack, overload

from air_sdk.client.options import JobOptions
from air_sdk.notebook.capture import package_call
from air_sdk.notebook.pickling import DEFAULT_MAX_VALUE_BYTES
from air_sdk.notebook.submit import checked_job_fields, submit_package
from air_sdk.schema.events import MAX_RESULT_BYTES, EventType, LogBatch

if TYPE_CHECKING:
    from air_sdk.client import Client, Job

__all__ = ["MAX_RESULT_BYTES", "DistributedFunction", "distributed"]

P = ParamSpec("P")
R = TypeVar("R")
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class DistributedFunction(Generic[P, R]):
    """A function that runs on every rank of a new job when called (see the module).

    Example:
        >>> def train(lr: float) -> float:
        ...     return lr
        >>> remote = DistributedFunction(train, nodes=2)
        >>> remote.__name__, remote.job_options
        ('train', {'nodes': 2})
        >>> remote.options(nodes=4).job_options
        {'nodes': 4}
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        client: Client | None = None,
        files: Iterable[str | Path] = (),
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        show_logs: bool = True,
        **options: Unpack[JobOptions],
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@air_sdk.distributed decorates a function, not {fn!r}")
        self._fn = fn
        self._client = client
        self._files = tuple(files)
        self._max_value_bytes = max_value_bytes
        self._show_logs = show_logs
        self._default_name = _job_name(fn)
        checked_job_fields(options, default_name=self._default_name)  # fail at decoration
        #: the job options every call submits with (see `options()` to change some)
        self.job_options: JobOptions = options
        functools.update_wrapper(self, fn)  # __name__, __doc__, __wrapped__ (the plain function)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.job_options.items())
        return f"<distributed {self._default_name}({options})>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function on every rank of a new job; return rank 0's value.

        Raises:
            JobFailedError: a rank raised (with its traceback), or the job failed
                or was cancelled.
            CellCaptureError: an argument cannot travel (before anything is sent).
        """
        job = self.submit(*args, **kwargs)
        try:
            if self._show_logs:
                _print_logs(job)
            value: R = job.result()
        except KeyboardInterrupt:
            job.cancel()
            print(f"interrupted: cancelled job {job.id}", file=sys.stderr, flush=True)
            raise
        return value

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Start the function on every rank of a new job; return the `Job` at once.

        `job.result()` waits for rank 0's value later; `job.monitor()` shows it live.

        Example:
            >>> job = train.submit(3, lr=0.01)  # doctest: +SKIP
            >>> job.result(timeout=600)  # doctest: +SKIP
            {'loss': 0.0123}
        """
        from air_sdk.client import Client

        package = package_call(self._fn, args, kwargs, max_value_bytes=self._max_value_bytes)
        return submit_package(
            self._client or Client(),
            package,
            files=self._files,
            files_option="files=",
            workdir_option="workdir=",
            default_name=self._default_name,
            **self.job_options,
        )

    def options(self, **overrides: Unpack[JobOptions]) -> DistributedFunction[P, R]:
        """The same function with some job options changed (as Ray's `.options()`).

        Example:
            >>> metrics = train.options(nodes=8, name="sweep-8")(3)  # doctest: +SKIP
        """
        merged: JobOptions = {**self.job_options, **overrides}
        return DistributedFunction(
            self._fn,
            client=self._client,
            files=self._files,
            max_value_bytes=self._max_value_bytes,
            show_logs=self._show_logs,
            **merged,
        )


@overload
def distributed(fn: Callable[P, R], /) -> DistributedFunction[P, R]: ...


@overload
def distributed(
    *,
    client: Client | None = None,
    files: Iterable[str | Path] = (),
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    show_logs: bool = True,
    **options: Unpack[JobOptions],
) -> Callable[[Callable[P, R]], DistributedFunction[P, R]]: ...


def distributed(
    fn: Callable[P, R] | None = None,
    /,
    *,
    client: Client | None = None,
    files: Iterable[str | Path] = (),
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    show_logs: bool = True,
    **options: Unpack[JobOptions],
) -> DistributedFunction[P, R] | Callable[[Callable[P, R]], DistributedFunction[P, R]]:
    """Make `fn` run on every rank of a new job when called; the call returns rank 0's
    return value. Use it bare (`@distributed`: one node, one rank) or with options.

    Args:
        client: the gateway to use (default: `Client()` at call time, from
            `AIR_GATEWAY_URL` / `AIR_TOKEN` or the config `%air gateway start` wrote).
        files: extra files or directories to send, relative to the working
            directory (which travels as the job's code, or `workdir=`).
        max_value_bytes: the largest argument that may travel, pickled.
        show_logs: print the ranks' output (`[rank N] line`) while a call waits.
        **options: job options (`air_sdk.client.options.JobOptions`), as
            `air submit`'s and `%%air train`'s flags name them: `nodes`,
            `procs_per_node`, `gpus_per_node`, `name`, `env`, `env_from_shell`,
            `max_restarts`, `checkpoint_every`, `output_dir`, `pool`, `priority`, `accelerator`, `timeout`
            (seconds, the job's wall-clock limit), the mesh sizes `dp_replicate`,
            `dp_shard`, `tp`, `pp`, `cp`, and `workdir`. Checked here: a bad one
            raises `SpecError` at decoration.

    Example:
        >>> @distributed(nodes=2, max_restarts=3, env={"LR": "0.1"})
        ... def train(epochs: int) -> float:
        ...     return 0.0
        >>> train.job_options["nodes"]
        2
    """

    def wrap(target: Callable[P, R]) -> DistributedFunction[P, R]:
        return DistributedFunction(
            target,
            client=client,
            files=files,
            max_value_bytes=max_value_bytes,
            show_logs=show_logs,
            **options,
        )

    return wrap if fn is None else wrap(fn)


def _job_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return _NAME_BAD_CHARS.sub("-", name).strip("-._")[:63] or "function"


def _print_logs(job: Job) -> None:
    """The ranks' output as it arrives, until the job ends."""
    for event in job.follow():
        if event.type is EventType.LOG:
            for line in event.payload_as(LogBatch).lines:
                print(f"[rank {event.rank}] {line}", flush=True)
