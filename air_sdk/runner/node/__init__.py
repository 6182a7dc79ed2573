"""The NodeRunner: one node's ranks of a job, the same code on every backend.

* `launch.py`: `NodeLaunch`, what a node runs for one attempt (stdlib, JSON);
* `plan.py`: the runner builds those from the job, the placement and `WorkerEnv`;
* `env.py`: which variables of the gateway's environment ranks get (an allow-list);
* `runner.py`: `NodeRunner`, which starts, watches, reports and stops the ranks;
* `_warm.py`, `_boot.py`: pre-imported interpreters for the next attempt;
* `process.py`: the local backend's NodeRunner process and the gateway's handle on it;
* `records.py`: what a NodeRunner leaves on disk for a gateway that restarts;
* `_procs.py`: pids with start times, a process's descendants, signals, py-spy.

Importing this package loads nothing but the standard library: a NodeRunner process
starts its ranks before it loads anything else.
"""
