"""The local backend's node agent: torchrun, with its rendezvous polling tuned for a
handful of agents on one host.

    python -m air_sdk._agent [torchrun arguments...]

is `python -m torch.distributed.run [torchrun arguments...]` except for three waits
in torch's dynamic (c10d) rendezvous, which are sized to spare one store shared by
hundreds of nodes: it sleeps 1 s between polls of the rendezvous state, serves that
state from a 1 s cache, and waits a random 0-0.3 s before its first round. A local
attempt is 2-3 agents on 127.0.0.1, where those waits are most of the time from the
agents' start to their workers' start (every launch and every restart pays them).
Here the agents poll every 50 ms without the cache and without the first-round
jitter.

One more change: the rendezvous store lives in one of the agents, and when that
agent's node dies, a stock agent elsewhere fails its next look at the store ("how
many nodes are waiting to join?") and stops its own workers at once. Those workers
may be about to save the state they hold (a checkpoint at the failure, see
`air_sdk.runtime._failure_save`), and AIR's runner, not torchrun, decides when an
attempt ends and restarts it (its agents run with --max-restarts=0 and a fixed
number of nodes: no node can join). So a store that cannot be reached reads as "no
node waiting", and the agent keeps watching its workers until they end. Everything
else (arguments, elastic agent, worker environment, exit codes) is torchrun's own.

This touches torch internals (`dynamic_rendezvous._delay` and the state holder's
`_cache_duration`); when they are not as expected nothing is changed and the agent
waits like a stock one. Imported by nothing but `python -m`: keep it light.
"""

from __future__ import annotations

from typing import Any

#: seconds between polls of the local rendezvous state (torch: 1 s)
POLL_S = 0.05
#: what `ps` shows for an agent; with "torch.distributed.run" it identifies one
MODULE = "air_sdk._agent"


def is_agent(cmdline: list[str]) -> bool:
    """Whether a process's command line is a node agent (AIR's or a stock torchrun).

    Example:
        >>> is_agent(["python", "-m", "air_sdk._agent", "--nnodes=2"])
        True
    """
    return any(MODULE in c or "torch.distributed.run" in c for c in cmdline)


def tune_rendezvous() -> bool:
    """Make the dynamic rendezvous poll every `POLL_S` with no state cache and no
    first-round jitter, and read a lost store as no node waiting to join; False (and
    no change) when torch's internals differ."""
    try:
        from torch.distributed.elastic.rendezvous import RendezvousConnectionError
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

        delay = rdzv._delay
        holder = rdzv._BackendRendezvousStateHolder
        init = holder.__init__
        handler = rdzv.DynamicRendezvousHandler
        waiting = handler.num_nodes_waiting
    except (ImportError, AttributeError):
        return False

    def fast_delay(seconds: float | tuple[float, float]) -> None:
        # a fixed poll (1 s) becomes POLL_S; the random first-round skew goes
        if isinstance(seconds, int | float):
            delay(min(float(seconds), POLL_S))

    def uncached_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if hasattr(self, "_cache_duration"):
            self._cache_duration = 0

    def waiting_unless_store_lost(self: Any) -> int:
        try:
            return waiting(self)
        except RendezvousConnectionError:
            return 0  # the store's host is gone: keep watching the workers

    rdzv._delay = fast_delay
    holder.__init__ = uncached_init  # type: ignore[method-assign]
    handler.num_nodes_waiting = waiting_unless_store_lost  # type: ignore[method-assign]
    return True


def main() -> None:
    import torch.distributed.run as run

    tune_rendezvous()
    run.main()


if __name__ == "__main__":
    main()
