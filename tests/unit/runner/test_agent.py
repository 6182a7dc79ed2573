"""`python -m air_sdk._agent`: torchrun with the local rendezvous waits shortened."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from air_sdk._agent import MODULE, POLL_S, is_agent

# Runs in its own interpreter: tune_rendezvous patches torch for the whole process.
PROBE = textwrap.dedent(
    """
    import time
    slept = []
    time.sleep = slept.append
    from air_sdk._agent import tune_rendezvous
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    assert tune_rendezvous()
    rdzv._delay(seconds=1)         # the poll between two reads of the state
    rdzv._delay(seconds=(0, 0.3))  # the first round's random skew
    holder = rdzv._BackendRendezvousStateHolder(backend=None, settings=None)
    print(slept, holder._cache_duration)
    """
)


def test_the_agent_polls_the_rendezvous_every_50_ms_without_cache_or_skew():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == [f"[{POLL_S}]", "0"]


# A handler whose store is gone, as when the agent hosting it died with its node.
LOST_STORE = textwrap.dedent(
    """
    import threading
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    class Holder:
        def sync(self):
            raise RendezvousConnectionError("The connection to the C10d store has failed.")

    class Handler:
        _heartbeat_lock = threading.Lock()
        _state_holder = Holder()
        def _record(self, **kwargs):
            pass

    def waiting():
        try:
            return rdzv.DynamicRendezvousHandler.num_nodes_waiting(Handler())
        except RendezvousConnectionError:
            return "raises"

    before = waiting()
    from air_sdk._agent import tune_rendezvous
    assert tune_rendezvous()
    print(before, waiting())
    """
)


def test_a_lost_rendezvous_store_does_not_make_the_agent_stop_its_workers():
    """Stock torchrun stops its workers when the store's host (another node's agent)
    dies; AIR's agent keeps them, so a survivor can save its checkpoint at the failure."""
    out = subprocess.run(
        [sys.executable, "-c", LOST_STORE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["raises", "0"]


def test_the_agent_is_torchrun_itself():
    out = subprocess.run(
        [sys.executable, "-m", MODULE, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "--rdzv-endpoint" in out.stdout and "--max-restarts" in out.stdout


def test_agents_are_recognised_by_their_command_line():
    assert is_agent([sys.executable, "-m", MODULE, "--nnodes=2", "-m", "x"])
    assert is_agent([sys.executable, "-m", "torch.distributed.run", "train.py"])
    assert not is_agent([sys.executable, "-u", "train.py"])
