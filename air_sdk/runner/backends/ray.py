"""Ray backend: every node of a placement is a bundle of a Ray placement group.

The inventory is the Ray cluster's alive nodes (`ray_rules.ray_nodes`). A job's
placement becomes one placement group, one bundle per node, each bundle pinned to
the node AIR's scheduler chose (label `ray.io/node-id`) and STRICT_SPREAD for
multi-node jobs, so every node of the job is a distinct machine. In each bundle a
`RayNodeAgent` actor fetches the job code from Ray's object store, unpacks it into
a node-local directory and runs that node's ranks with a NodeRunner, the code a
local virtual node runs, with the same env contract; MASTER_ADDR is the first
bundle's node.
AIR's own runtime reaches the nodes the same way (a zip of `air_sdk` in the object
store; the agent class travels by value), so the nodes run the gateway's version of
it and need only torch and air-runtime's dependencies. A relaunch on the same nodes
keeps the attempt's placement group and actors: it starts only the ranks, on the
warm interpreters the actor's NodeRunner kept ready.

Ranks report to the gateway themselves (logs, metrics, heartbeats, rank exits), as local ranks do;
a node's verdict also brings the exit records left on it (`NodeStatus.rank_exits`: the ranks'
reports may come later). The backend reports what only Ray knows: an actor that died, or a node
that left the cluster (`NodeStatus.detail`). Placement groups and actors fate-share with the
gateway's Ray driver: a stopped gateway leaves nothing running; the next one relaunches the job.

Only this module and its `ray_*` siblings know Ray; `ray` is imported lazily.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_sdk.errors import ConfigError
from air_sdk.runner.backends.base import LaunchRequest, NodeStatus
from air_sdk.runner.backends.local import warm_ranks_enabled
from air_sdk.runner.backends.ray_connect import connect
from air_sdk.runner.backends.ray_node import RayNodeAgent
from air_sdk.runner.backends.ray_rules import (
    LOST_NODE_GRACE_ENV,
    PASSED_THROUGH_ENV,
    STORAGE_ENV,
    RayNode,
    check_output_dir,
    checkpoint_dir,
    first_cause,
    gateway_unreachable,
    local_addresses,
    ray_nodes,
    unhealthy,
    zip_package,
)
from air_sdk.runner.node.plan import plan_node
from air_sdk.scheduler import NodeSpec

log = logging.getLogger(__name__)

__all__ = ["RayAttempt", "RayBackend"]

#: the Ray namespace of AIR's actors and placement groups
NAMESPACE = "air"
#: how long an inventory read is reused (the runner asks every scheduling tick)
INVENTORY_TTL_S = 1.0
DEFAULT_LOST_NODE_GRACE_S = 300.0
#: a lost node's exit code in NodeStatus (a launcher killed by SIGKILL, as locally)
LOST_EXIT_CODE = -9
#: how long `failure_marks` waits for the nodes' answers (the runner asks every 20 ms)
MARKS_TIMEOUT_S = 1.0
#: bounded waits on calls to actors (a dead node must not hang the runner)
CALL_TIMEOUT_S = 10.0
#: concurrent calls per node actor: watch blocks, stop/log_tail/stacks must not wait for it
AGENT_CONCURRENCY = 8
#: "0": the nodes have air-runtime installed; do not send them the gateway's air_sdk
SHIP_RUNTIME_ENV = "AIR_RAY_SHIP_RUNTIME"
#: how long a stopped attempt's actors and placement group wait for the job's relaunch
KEEP_S = 60.0


@dataclass
class _Node:
    name: str
    node_id: str
    address: str
    index: int
    actor: Any = None
    prepare_ref: Any = None
    watch_ref: Any = None
    #: set once the node ended (its ranks, its actor or its machine)
    final: NodeStatus | None = None
    dead: bool = False
    #: what the backend itself saw (placement, errors): shown with the node's log tail
    notes: list[str] = field(default_factory=list)
    #: the node's log tail, kept when its actor is stopped
    tail: list[str] | None = None


@dataclass
class RayAttempt:
    """One attempt on Ray: its placement group, one actor per node, and their state."""

    job_id: str
    attempt: int
    pg: Any
    nodes: list[_Node]
    bundle_ref: Any
    bundle_sha256: str
    #: "preparing" (placing bundles, unpacking code) -> "running" -> "ended"
    phase: str = "preparing"
    launched_at: float = field(default_factory=time.monotonic)
    master: str = ""
    #: the bundle resources, to tell whether a relaunch can keep this attempt's actors
    shape: dict[str, float] = field(default_factory=dict)
    #: every bundle was placed (a kept placement group must be a placed one)
    pg_ready: bool = False
    kept_at: float = 0.0


class RayBackend:
    """Jobs as placement groups on a Ray cluster (one bundle and one actor per node).

    Example:
        >>> backend = RayBackend(address="ray://head:10001")  # doctest: +SKIP
        >>> [n.name for n in backend.inventory()]  # doctest: +SKIP
        ['ray-0b4f9a61c2de', 'ray-64bf598ade38']
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        storage: str | None = None,
        lost_node_grace_s: float | None = None,
        ship_runtime: bool = True,
        warm: bool | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS")
        if not self.address:
            raise ConfigError(
                "the Ray backend needs a cluster: pass --ray-address HOST:6379 (or ray://HOST:10001)"
                " or set RAY_ADDRESS"
            )
        self.storage = storage or os.environ.get(STORAGE_ENV) or None
        grace = os.environ.get(LOST_NODE_GRACE_ENV)
        default_grace = float(grace) if grace else DEFAULT_LOST_NODE_GRACE_S
        self.lost_node_grace_s = (
            lost_node_grace_s if lost_node_grace_s is not None else default_grace
        )
        ship = os.environ.get(SHIP_RUNTIME_ENV, "1").lower() not in ("0", "false", "no")
        self.ship_runtime = ship_runtime and ship
        #: node actors keep warm interpreters for the job's next attempt ($AIR_WARM_RANKS)
        self.warm = warm_ranks_enabled(warm)
        self._runtime: tuple[Any, str] | None = None  # (object ref, sha256) of air_sdk's zip
        self._lock = threading.Lock()
        self._known: dict[str, RayNode] = {}  # every node seen, by AIR name
        self._gone: dict[str, float] = {}  # AIR name -> when it left
        self._inventory: list[NodeSpec] = []
        self._inventory_at = -1e9
        self._kept: dict[str, RayAttempt] = {}  # job id -> its stopped attempt, kept for reuse
        connect(self.address, NAMESPACE, init_kwargs or {})
        self._agent_class = self._remote_agent_class()

    def _remote_agent_class(self) -> Any:
        import ray

        if self.ship_runtime:
            # The agent class travels by value, so a node needs no air-runtime installed:
            # the agent then unpacks the runtime the gateway sends through the object
            # store. (A job-level py_modules runtime_env does the same but costs every
            # worker an extra Python start: measured here 9.6-12.6 s per actor, not 2.5-6.)
            import ray.cloudpickle

            from air_sdk.runner.backends import ray_node

            ray.cloudpickle.register_pickle_by_value(ray_node)
            data = zip_package(Path(ray_node.__file__).resolve().parents[3])
            self._runtime = (ray.put(data), hashlib.sha256(data).hexdigest())
        options: dict[str, Any] = {"max_restarts": 0, "max_concurrency": AGENT_CONCURRENCY}
        return ray.remote(**options)(RayNodeAgent)

    # -- inventory -------------------------------------------------------------------------

    def inventory(self) -> list[NodeSpec]:
        """The cluster's nodes that can run ranks; a node that left stays, unhealthy, for
        `lost_node_grace_s`, so a job that needs it waits for it or a replacement."""
        now = time.monotonic()
        with self._lock:
            if now - self._inventory_at < INVENTORY_TTL_S:
                return list(self._inventory)
        self._release_expired()  # the runner asks every tick: a good time to tidy up
        self._refresh()
        with self._lock:
            return list(self._inventory)

    def _refresh(self) -> dict[str, RayNode]:
        """Read the node table now; returns the alive nodes by AIR name."""
        import ray

        try:
            alive = {n.spec.name: n for n in ray_nodes(ray.nodes())}
        except Exception as exc:  # the GCS restarting: keep the last view, do not fail jobs
            log.warning("could not read Ray's node table: %s", exc)
            with self._lock:
                return {k: v for k, v in self._known.items() if k not in self._gone}
        now = time.monotonic()
        with self._lock:
            for name in self._known.keys() - alive.keys():
                self._gone.setdefault(name, now)
            for name in alive:
                self._gone.pop(name, None)
            self._known.update(alive)
            inventory = [n.spec for n in alive.values()]
            for name, since in self._gone.items():
                if now - since < self.lost_node_grace_s:
                    inventory.append(unhealthy(self._known[name].spec))
            self._inventory = sorted(inventory, key=lambda s: s.name)
            self._inventory_at = now
        return alive

    # -- launch ----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> RayAttempt:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from air_sdk.bundle import pack_directory

        spec, placement = request.spec, request.placement
        num_nodes = len(placement.nodes)
        ckpt = checkpoint_dir(
            job_id=request.job_id,
            explicit=spec.checkpoint.dir,
            default=request.worker.checkpoint_dir or "",
            num_nodes=num_nodes,
            storage=self.storage,
        )
        check_output_dir(spec.output_dir, num_nodes=num_nodes, storage=self.storage)
        with self._lock:
            known = dict(self._known)
        if any(a.node not in known for a in placement.nodes):
            self._refresh()
            with self._lock:
                known = dict(self._known)
        nodes = []
        for i, a in enumerate(placement.nodes):
            where = known.get(a.node)
            if where is None:
                raise ConfigError(f"node {a.node} is not a node of the Ray cluster")
            nodes.append(_Node(a.node, where.node_id, where.address, i))
        unreachable = gateway_unreachable(
            request.worker.gateway_url or "", [n.address for n in nodes], local_addresses()
        )
        if unreachable:
            raise ConfigError(unreachable)
        ranks = spec.resources.ranks_per_node
        gpus = spec.resources.gpus_per_node
        shape: dict[str, float] = {"CPU": float(ranks)}
        if gpus:
            shape["GPU"] = float(gpus)
        kept = self._take_kept(request.job_id, [n.name for n in nodes], shape)
        if kept is not None:
            pg = kept.pg
        else:
            pg = placement_group(
                [dict(shape) for _ in nodes],
                strategy="STRICT_SPREAD" if num_nodes > 1 else "PACK",
                name=f"air:{request.job_id}:{request.attempt}",
                bundle_label_selector=[{"ray.io/node-id": n.node_id} for n in nodes],
            )
        bundle = pack_directory(request.code_dir)
        handle = RayAttempt(
            request.job_id, request.attempt, pg, nodes, ray.put(bundle.data), bundle.sha256
        )
        handle.shape = shape
        worker = request.worker.model_copy(update={"checkpoint_dir": ckpt})
        # a private CA for https gateways (same path on every node)
        passed = {k: os.environ[k] for k in PASSED_THROUGH_ENV if k in os.environ}
        for n in nodes:
            launch = plan_node(
                worker=worker,
                spec=spec,
                node=n.name,
                group_rank=n.index,
                num_nodes=num_nodes,
                entrypoint=request.entrypoint,
                cwd="",  # node-local: the actor fills in where it unpacked the code
                attempt_dir="",
                log_path="",
                master=None,  # rank 0's node picks the port; the actor learns it at start
                # GPU jobs keep the devices Ray gives the actor; CPU jobs see none
                cuda_visible_devices=None if gpus else "",
                loopback=False,
                warm=self.warm,
                extra_env=passed,
            )
            if kept is not None:
                # The previous attempt's actor on this node: no new placement group,
                # worker process or code download for a relaunch on the same nodes.
                n.actor = kept.nodes[n.index].actor
                n.prepare_ref = n.actor.prepare.remote(
                    handle.bundle_ref, bundle.sha256, *self._runtime_args(), launch, gpus > 0
                )
                n.notes.append(
                    f"[air] bundle {n.index} of placement group {pg.id.hex()[:12]} on Ray node"
                    f" {n.node_id[:12]} ({n.address}), actor kept from attempt {kept.attempt}"
                )
                continue
            n.actor = self._agent_class.options(
                name=f"air:{request.job_id}:{request.attempt}:{n.index}",
                num_cpus=ranks,
                num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=n.index
                ),
            ).remote(request.job_id, n.name)
            n.prepare_ref = n.actor.prepare.remote(
                handle.bundle_ref, bundle.sha256, *self._runtime_args(), launch, gpus > 0
            )
            n.notes.append(
                f"[air] bundle {n.index} of placement group {pg.id.hex()[:12]} on Ray node"
                f" {n.node_id[:12]} ({n.address}): {shape}"
            )
        return handle

    def _runtime_args(self) -> tuple[Any, str]:
        return self._runtime if self._runtime is not None else (None, "")

    def _take_kept(
        self, job_id: str, names: list[str], shape: dict[str, float]
    ) -> RayAttempt | None:
        """The job's kept attempt if the relaunch has the same nodes and shape; any other
        kept attempt of the job is released (its bundles are someone else's now)."""
        with self._lock:
            kept = self._kept.pop(job_id, None)
        if kept is None:
            return None
        if [n.name for n in kept.nodes] == names and kept.shape == shape:
            return kept
        self._release(kept)
        return None

    # -- watching --------------------------------------------------------------------------

    def poll(self, handle: RayAttempt) -> list[NodeStatus]:
        if handle.phase == "preparing":
            self._advance_preparing(handle)
        if handle.phase == "running":
            self._advance_running(handle)
        return [n.final or NodeStatus(n.name, None) for n in handle.nodes]

    def _advance_preparing(self, handle: RayAttempt) -> None:
        import ray

        pending = [n for n in handle.nodes if n.final is None]
        refs = [n.prepare_ref for n in pending]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        ports: dict[int, int] = {}
        for n in pending:
            if n.prepare_ref not in ready_set:
                continue
            try:
                ports[n.index] = ray.get(n.prepare_ref, timeout=CALL_TIMEOUT_S)
            except Exception as exc:
                self._ended(n, exc, while_="preparing the node")
        if any(n.final is not None for n in handle.nodes):
            handle.phase = "ended"
            return
        if len(ready) < len(refs):
            self._check_pinned_nodes(handle)
            return
        handle.pg_ready = True  # every actor ran prepare(): every bundle is placed
        first = handle.nodes[0]
        handle.master = first.address
        for n in handle.nodes:
            started = n.actor.start.remote(first.address, ports[0])
            # `started` as an argument: Ray runs the watch only once start() returned, so
            # on a kept actor (concurrent calls) it never reports the attempt before
            n.watch_ref = n.actor.watch.remote(None, started)
        handle.phase = "running"

    def _check_pinned_nodes(self, handle: RayAttempt) -> None:
        """A bundle pinned to a node that left can never be placed: say so now rather
        than at the startup timeout."""
        self.inventory()
        with self._lock:
            gone = set(self._gone)
        for n in handle.nodes:
            if n.name in gone and n.final is None:
                n.final = NodeStatus(
                    n.name,
                    LOST_EXIT_CODE,
                    f"Ray node {n.node_id[:12]} ({n.address}) left the cluster before the job"
                    " started",
                    lost=True,
                )
                n.dead = True
                handle.phase = "ended"

    def _advance_running(self, handle: RayAttempt) -> None:
        import ray

        pending = [n for n in handle.nodes if n.final is None]
        if not pending:
            handle.phase = "ended"
            return
        ready, _ = ray.wait([n.watch_ref for n in pending], num_returns=len(pending), timeout=0)
        ready_set = set(ready)
        for n in pending:
            if n.watch_ref not in ready_set:
                continue
            try:
                code, detail, exits = ray.get(n.watch_ref, timeout=CALL_TIMEOUT_S)
            except Exception as exc:
                self._ended(n, exc, while_="running")
                continue
            n.final = NodeStatus(n.name, code, detail if code else "", rank_exits=tuple(exits))

    def _ended(self, n: _Node, exc: BaseException, *, while_: str) -> None:
        """Name what ended a node whose actor call failed: its machine, its actor, or
        (a task error) something in the node's own work."""
        from ray.exceptions import RayActorError

        if not isinstance(exc, RayActorError):
            message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            n.final = NodeStatus(n.name, 1, f"failed while {while_}: {message}")
            n.notes.append(f"[air] {n.final.detail}")
            return
        n.dead = True
        alive = self._refresh()
        # A worker's death is reported by its node's raylet, so the node is still there;
        # a machine (or raylet) that vanished makes the GCS say the node died.
        lost = n.name not in alive or "because its node has died" in str(exc)
        if lost:
            detail = f"Ray node {n.node_id[:12]} ({n.address}) left the cluster"
        else:
            detail = f"its Ray actor died while {while_}: {first_cause(exc)}"
        n.final = NodeStatus(n.name, LOST_EXIT_CODE, detail, lost=lost)
        n.notes.append(f"[air] {detail}")
        n.notes.extend(f"[ray] {line}" for line in str(exc).strip().splitlines()[:8])

    # -- stopping --------------------------------------------------------------------------

    def terminate(
        self, handle: RayAttempt, grace_s: float = 5.0, *, wait_first_s: float = 0.0
    ) -> None:
        """Stop every rank of the attempt. The actors and placement group are kept for a
        relaunch of the job on the same nodes when every actor is still alive (a relaunch
        then skips placing bundles and starting worker processes); `release` (the job
        ended, or went back to the queue), a launch elsewhere or `KEEP_S` frees them."""
        import ray
        from ray.exceptions import RayActorError

        if handle.phase == "running" and wait_first_s > 0:
            refs = [n.watch_ref for n in handle.nodes if n.final is None]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=wait_first_s)
        live = [n for n in handle.nodes if n.actor is not None and not n.dead]
        stops = {n.index: n.actor.stop.remote(grace_s) for n in live}
        if stops:
            ray.wait(list(stops.values()), num_returns=len(stops), timeout=grace_s + 20)
        stopped = 0
        for n in live:
            try:
                n.tail = list(ray.get(stops[n.index], timeout=0.1))
                stopped += 1
            except Exception as exc:
                n.tail = None
                # A node whose machine left the cluster while the attempt was failing
                # (its peers' crashes reached the runner first) is named here.
                if n.final is None and isinstance(exc, RayActorError):
                    self._ended(n, exc, while_="stopping")
        handle.phase = "ended"
        handle.bundle_ref = None
        if handle.nodes and stopped == len(handle.nodes) and handle.pg_ready:
            with self._lock:
                previous = self._kept.pop(handle.job_id, None)
                self._kept[handle.job_id] = handle
                handle.kept_at = time.monotonic()
            if previous is not None and previous is not handle:
                self._release(previous)
            return
        self._release(handle)

    def release(self, job_id: str) -> None:
        """Free what the backend kept of `job_id` (its actors and placement group); the
        controller calls it when the job ends or goes back to the queue."""
        with self._lock:
            kept = self._kept.pop(job_id, None)
        if kept is not None:
            self._release(kept)

    def _release_expired(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [j for j, h in self._kept.items() if now - h.kept_at > KEEP_S]
            handles = [self._kept.pop(j) for j in expired]
        for h in handles:
            self._release(h)

    def _release(self, handle: RayAttempt) -> None:
        """Kill the attempt's actors, remove its placement group, wait until both are gone."""
        import ray
        from ray.util.placement_group import remove_placement_group

        live = [n for n in handle.nodes if n.actor is not None and not n.dead]
        closes = [n.actor.close.remote() for n in live]
        if closes:  # node-local code and logs; a dead node's files went with it
            ray.wait(closes, num_returns=len(closes), timeout=CALL_TIMEOUT_S)
        for n in handle.nodes:
            if n.actor is not None:
                try:
                    ray.kill(n.actor, no_restart=True)
                except Exception:
                    pass
        try:
            remove_placement_group(handle.pg)
        except Exception as exc:
            log.warning("could not remove placement group of %s: %s", handle.job_id, exc)
        self._wait_gone(handle)

    def _wait_gone(self, handle: RayAttempt, timeout_s: float = 30.0) -> None:
        """Return once every actor is dead and the placement group removed (bounded)."""
        import ray
        from ray.util.placement_group import placement_group_table

        deadline = time.monotonic() + timeout_s
        probes = [n.actor.log_tail.remote(0) for n in handle.nodes if n.actor is not None]
        for ref in probes:
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                pass  # RayActorError: dead, as wanted
        while time.monotonic() < deadline:
            try:
                if placement_group_table(handle.pg).get("state") == "REMOVED":
                    return
            except Exception:
                return
            time.sleep(0.05)
        log.warning(
            "placement group of %s attempt %s not removed after %.0f s",
            handle.job_id,
            handle.attempt,
            timeout_s,
        )

    # -- diagnostics -----------------------------------------------------------------------

    def failure_marks(self, handle: RayAttempt) -> set[str]:
        """Each live node's failure-save marks (its ranks write them on that node)."""
        import ray

        live = [n for n in handle.nodes if n.actor is not None and not n.dead]
        if not live:
            return set()
        refs = [n.actor.failure_marks.remote() for n in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=MARKS_TIMEOUT_S)
        marks: set[str] = set()
        for ref in ready:
            try:
                marks.update(ray.get(ref, timeout=0))
            except Exception:
                continue  # a node that died has nothing to wait for
        return marks

    def rank_stacks(self, handle: RayAttempt) -> dict[int, str]:
        import ray

        live = [n for n in handle.nodes if n.actor is not None and not n.dead]
        refs = [n.actor.stacks.remote() for n in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=30) if refs else ([], [])
        stacks: dict[int, str] = {}
        for ref in ready:
            try:
                stacks.update(ray.get(ref, timeout=0.1))
            except Exception:
                continue
        return stacks

    def node_log_tail(self, handle: RayAttempt, node: str, num_lines: int = 20) -> list[str]:
        import ray

        for n in handle.nodes:
            if n.name != node:
                continue
            lines = n.tail
            if lines is None and n.actor is not None and not n.dead:
                try:
                    lines = list(ray.get(n.actor.log_tail.remote(num_lines), timeout=5))
                except Exception:
                    lines = None
            return (n.notes + list(lines or []))[-num_lines:]
        return []
