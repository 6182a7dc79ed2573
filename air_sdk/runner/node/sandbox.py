"""Sandboxes for a job's ranks on the local backend (Linux): what a rank may see.

Every tenant's ranks run as the gateway's user, on the gateway's machine. Without a
sandbox a rank can read the gateway's home (`AIR_HOME`: the admin token, `air.db`,
every job's secrets file and directory) and, through /proc, other jobs' ranks and
their environment (their worker tokens and secrets). A sandboxed rank instead runs
in a mount and a pid namespace of its own where

* the root filesystem is read-only (python, site-packages, the user's data);
* `AIR_HOME` and the client config directory (`~/.config/air`, the admin token) are
  empty, except the job's own code, attempts and checkpoint directories (and its
  output directory), bound back read-write at the same paths (the same for every
  attempt of the job, so warm interpreters start in it too);
* directories the gateway was told to share (`--sandbox-bind`) are read-write;
* `/tmp` is the job's own (`jobs/<id>/tmp`), `/dev/shm` the job's own on this node,
  `/dev` holds only null, zero, full, random, urandom, tty and the GPUs
  (`/dev/nvidia*`, `/dev/dri`, `/dev/kfd`, `/dev/infiniband`);
* `/proc` shows only the rank's own processes.

The network is the host's: ranks reach the gateway and each other on 127.0.0.1.

Two ways to build one, same result: `bwrap` (bubblewrap) when it is installed, else
`_jail.py` (the `unshare(2)` system call, as `unshare -m -p` does, and the mounts
made by hand). `choose_sandbox` picks and tries one; a `Sandbox` turns a
`SandboxSpec` into the command line put in front of a rank's interpreter
(`NodeLaunch.wrapper`).

Example:
    >>> spec = SandboxSpec(hide=["/home/u/.local/share/air"], writable=["/home/u/.local/share/air/jobs/j/code"],
    ...                    tmp="/home/u/.local/share/air/jobs/j/tmp", cwd="/home/u/.local/share/air/jobs/j/code")
    >>> argv = bwrap_argv(spec, bwrap="bwrap")
    >>> argv[:4], argv[-1]
    (['bwrap', '--ro-bind', '/', '/'], '--')
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "SANDBOX_MODES",
    "Sandbox",
    "SandboxMode",
    "SandboxSpec",
    "bwrap_argv",
    "choose_sandbox",
    "gpu_devices",
    "is_sandbox_wrapper",
    "sandboxed_returncode",
    "unshare_argv",
    "wrap",
]

SandboxMode = Literal["auto", "bwrap", "unshare", "off"]
SANDBOX_MODES: tuple[str, ...] = ("auto", "bwrap", "unshare", "off")

#: what a sandbox's /dev holds besides the GPUs
BASIC_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: device entries a GPU job needs (NVIDIA, DRM render nodes, AMD's KFD, RDMA for NCCL)
_GPU_DEVICE_PREFIXES = ("nvidia",)
_GPU_DEVICE_NAMES = ("dri", "kfd", "infiniband", "nvidia-caps")
_JAIL = str(Path(__file__).with_name("_jail.py"))


def gpu_devices(dev: str = "/dev") -> list[str]:
    """The GPU and RDMA entries of `dev` a sandboxed rank gets (none on a CPU box).

    Example:
        >>> gpu_devices("/nonexistent")
        []
    """
    try:
        names = sorted(os.listdir(dev))
    except OSError:
        return []
    return [
        os.path.join(dev, n)
        for n in names
        if n.startswith(_GPU_DEVICE_PREFIXES) or n in _GPU_DEVICE_NAMES
    ]


@dataclass(frozen=True)
class SandboxSpec:
    """What one rank's sandbox shows beyond the read-only root filesystem.

    Example:
        >>> SandboxSpec(hide=["/h"], writable=["/h/jobs/j/code"], tmp="/h/jobs/j/tmp").shm
    """

    #: directories that look empty inside (a fresh tmpfs over each)
    hide: list[str]
    #: directories bound back read-write at the same path, after the hiding
    writable: list[str]
    #: the host directory that is the rank's /tmp
    tmp: str
    #: the host directory that is the rank's /dev/shm (None: an empty one)
    shm: str | None = None
    #: directories every job may write (`--sandbox-bind`), bound before the hiding
    shared: list[str] = field(default_factory=list)
    #: files that read as empty inside (e.g. a TLS key outside the hidden directories)
    hide_files: list[str] = field(default_factory=list)
    #: directories inside a writable one bound back read-only, when they exist
    read_only: list[str] = field(default_factory=list)
    #: /dev entries bound in (see `gpu_devices`)
    devices: list[str] = field(default_factory=list)
    #: directories under /tmp the rank must still see, read-only, over its private /tmp:
    #: the interpreter and its packages when they live there (`under_tmp`)
    keep: list[str] = field(default_factory=list)
    #: the rank's working directory
    cwd: str | None = None


def bwrap_argv(spec: SandboxSpec, bwrap: str = "bwrap") -> list[str]:
    """bubblewrap's command line for `spec`, ending in `--` (the rank's argv follows).

    Order matters: bwrap applies its options one after the other, so /tmp comes before
    the hidden directories (a home under /tmp stays hidden) and the binds come last.

    Example:
        >>> argv = bwrap_argv(SandboxSpec(hide=["/h"], writable=["/h/c"], tmp="/h/t",
        ...                               read_only=["/h/c/n"], devices=["/dev/nvidia0"]))
        >>> " ".join(argv[argv.index("--proc"):])
        '--proc /proc --bind /h/t /tmp --tmpfs /h --bind /h/c /h/c --ro-bind-try /h/c/n /h/c/n --unshare-user --disable-userns --cap-drop ALL --unshare-pid --die-with-parent --new-session --'
        >>> argv[argv.index("--dev-bind-try"):argv.index("--dev-bind-try") + 3]
        ['--dev-bind-try', '/dev/nvidia0', '/dev/nvidia0']
    """
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev"]
    for device in spec.devices:
        argv += ["--dev-bind-try", device, device]
    if spec.shm is not None:
        argv += ["--bind", spec.shm, "/dev/shm"]
    argv += ["--proc", "/proc", "--bind", spec.tmp, "/tmp"]
    for path in spec.keep:  # an interpreter or package under /tmp stays there
        argv += ["--ro-bind-try", path, path]
    for path in spec.shared:  # before the hiding: a home inside one stays hidden
        argv += ["--bind", path, path]
    for path in spec.hide:
        argv += ["--tmpfs", path]
    for path in spec.hide_files:
        argv += ["--ro-bind-try", "/dev/null", path]
    for path in spec.writable:
        argv += ["--bind", path, path]
    for path in spec.read_only:
        argv += ["--ro-bind-try", path, path]
    if spec.cwd:
        argv += ["--chdir", spec.cwd]
    # --new-session: the rank leads a session of its own, so the NodeRunner can signal
    # it (and its children) without signalling bwrap, whose death would SIGKILL them.
    # A user namespace and no capabilities, also under a root gateway: the rank cannot
    # unmount the hiding, remount / read-write or gain root from a setuid file (bwrap
    # binds are nosuid and it sets PR_SET_NO_NEW_PRIVS)
    argv += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    argv += ["--unshare-pid", "--die-with-parent", "--new-session", "--"]
    return argv


def unshare_argv(spec: SandboxSpec, python: str | None = None) -> list[str]:
    """`_jail.py`'s command line for `spec`, ending in `--` (the rank's argv follows).

    Example:
        >>> argv = unshare_argv(SandboxSpec(hide=["/h"], writable=[], tmp="/t"), python="python3")
        >>> argv[:3], argv[3].endswith("_jail.py"), argv[-1]
        (['python3', '-I', '-S'], True, '--')
    """
    from dataclasses import asdict

    # -I: the jail runs outside the sandbox until unshare(2), so no PYTHONPATH, user
    # site or script directory of anyone's choosing may shape its imports
    return [python or sys.executable, "-I", "-S", _JAIL, json.dumps(asdict(spec)), "--"]


def wrap(
    wrapper: list[str], argv: list[str], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str], int | None]:
    """How to start `argv` with environment `env` behind `wrapper`: (command line, the
    wrapper's own environment, a file descriptor to pass and close after the start).

    The wrapper runs outside the sandbox, so it gets an empty environment: a job's
    `LD_PRELOAD` or `PYTHONPATH` would run code in it before the hiding. `env` reaches
    the rank through an anonymous file (not the command line, which every user of the
    host can read): bwrap reads `--clearenv --setenv ...` from it (`--args FD`), the
    jail a JSON object it applies only when it execs the rank. No wrapper: `argv` as is.

    Example:
        >>> wrap([], ["python", "t.py"], {"A": "1"})
        (['python', 't.py'], {'A': '1'}, None)
        >>> argv, env, fd = wrap(["bwrap", "--ro-bind", "/", "/", "--"], ["python"], {"A": "1"})
        >>> argv[-4:-2] == ["--args", str(fd)], argv[-2:], env
        (True, ['--', 'python'], {})
        >>> os.close(fd)
    """
    if not wrapper:
        return list(argv), dict(env), None
    if wrapper[-1] != "--":
        raise ValueError(f"a sandbox wrapper ends in '--': {wrapper[-3:]}")
    fd = os.memfd_create("air-rank-env", 0)
    try:
        if is_sandbox_wrapper(wrapper) and os.path.basename(wrapper[0]) != "bwrap":
            data = json.dumps(dict(env)).encode()
            inserted = [str(fd)]
        else:
            words = ["--clearenv"]
            for name, value in env.items():
                words += ["--setenv", name, value]
            data = b"".join(os.fsencode(w) + b"\0" for w in words)
            inserted = ["--args", str(fd)]
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return [*wrapper[:-1], *inserted, "--", *argv], {}, fd


def under_tmp(paths: list[str]) -> list[str]:
    """Of `paths`, the existing directories under /tmp, outermost first, each once: what
    a private /tmp would hide from the rank (a virtualenv or checkout in /tmp).

    Example:
        >>> under_tmp(["/usr/lib/python3", "/nonexistent-air/x"])
        []
    """
    found: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if p}):
        inside = any(path == f or path.startswith(f + "/") for f in found)
        if path.startswith("/tmp/") and os.path.isdir(path) and not inside:
            found.append(path)
    return found


def sandboxed_returncode(code: int, wrapper: list[str]) -> int:
    """bwrap exits 128+N when its program was killed by signal N: read it as Popen
    would (-N), so an OOM kill stays a SIGKILL. `_jail.py` dies by the signal itself.

    Example:
        >>> sandboxed_returncode(137, ["bwrap"]), sandboxed_returncode(137, []), sandboxed_returncode(1, ["bwrap"])
        (-9, 137, 1)
    """
    if wrapper and os.path.basename(wrapper[0]) == "bwrap" and 128 < code < 128 + 65:
        return -(code - 128)
    return code


def is_sandbox_wrapper(argv: list[str]) -> bool:
    """Whether a process's command line is one of ours (bwrap or `_jail.py`).

    Example:
        >>> is_sandbox_wrapper(["/usr/bin/bwrap", "--ro-bind", "/", "/"]), is_sandbox_wrapper(["python"])
        (True, False)
    """
    if not argv:
        return False
    return os.path.basename(argv[0]) == "bwrap" or argv[1:4] == ["-I", "-S", _JAIL]


@dataclass(frozen=True)
class Sandbox:
    """The sandbox a gateway puts its local ranks in (`kind` None: none), and why.

    Example:
        >>> print(Sandbox(None, "--sandbox off").describe()[:46])
        ranks are NOT sandboxed (--sandbox off): a job
        >>> Sandbox("bwrap", "", "/usr/bin/bwrap").wrapper(SandboxSpec([], [], "/t"))[0]
        '/usr/bin/bwrap'
    """

    kind: Literal["bwrap", "unshare"] | None
    #: why there is none (or why the one chosen)
    reason: str
    #: bwrap's path
    program: str | None = None

    @property
    def enabled(self) -> bool:
        return self.kind is not None

    def wrapper(self, spec: SandboxSpec) -> list[str]:
        """The command line to put in front of a rank's interpreter ([] with none)."""
        if self.kind == "bwrap":
            return bwrap_argv(spec, self.program or "bwrap")
        if self.kind == "unshare":
            return unshare_argv(spec)
        return []

    def describe(self) -> str:
        """One line for the gateway's start-up."""
        if self.kind == "bwrap":
            return f"ranks run sandboxed with bwrap ({self.program})"
        if self.kind == "unshare":
            return f"ranks run sandboxed with unshare (mount + pid namespaces){self.reason}"
        return (
            f"ranks are NOT sandboxed ({self.reason}): a job can read AIR_HOME (the admin"
            " token, every job's secrets) and other jobs' processes"
        )


@functools.lru_cache(maxsize=8)
def choose_sandbox(mode: str = "auto") -> Sandbox:
    """The sandbox `mode` asks for, tried once: `auto` takes bwrap, else unshare, else
    none (and says why); `bwrap` or `unshare` that cannot work is a `ConfigError`.

    Example:
        >>> choose_sandbox("off").enabled
        False
    """
    from air_sdk.errors import ConfigError

    if mode not in SANDBOX_MODES:
        raise ConfigError(f"--sandbox {mode!r}: give one of {', '.join(SANDBOX_MODES)}")
    if mode == "off":
        return Sandbox(None, "--sandbox off")
    if not sys.platform.startswith("linux"):
        if mode == "auto":
            return Sandbox(None, f"no sandbox on {sys.platform}: it needs Linux namespaces")
        raise ConfigError(f"--sandbox {mode} needs Linux; use --sandbox off on {sys.platform}")
    problems = []
    if mode in ("auto", "bwrap"):
        program = shutil.which("bwrap")
        error = _try(bwrap_argv, program) if program else "bwrap is not installed"
        if error is None:
            return Sandbox("bwrap", "", program)
        if mode == "bwrap":
            raise ConfigError(
                f"--sandbox bwrap: {error}; install it (apt-get install bubblewrap) or use"
                " --sandbox auto"
            )
        problems.append(error)
    error = _try(unshare_argv, None)
    if error is None:
        note = f" ({problems[0]})" if problems else ""
        return Sandbox("unshare", note)
    if mode == "unshare":
        raise ConfigError(f"--sandbox unshare: {error}; install bubblewrap or use --sandbox off")
    problems.append(error)
    return Sandbox(None, "; ".join(problems) + "; install bubblewrap (apt-get install bubblewrap)")


def _try(build: object, program: str | None) -> str | None:
    """Run `python -c pass` in a sandbox built by `build`; None if it worked, else why."""
    with tempfile.TemporaryDirectory(prefix="air-sandbox-probe-") as tmp:
        home = os.path.join(tmp, "home")
        code = os.path.join(home, "code")
        os.makedirs(code)
        interpreter = [sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
        spec = SandboxSpec(
            hide=[home], writable=[code], tmp=tmp, cwd=code, keep=under_tmp(interpreter)
        )
        wrapper = build(spec, program) if program else build(spec)  # type: ignore[operator]
        argv, env, fd = wrap(wrapper, [sys.executable, "-S", "-c", "pass"], {})
        try:
            out = subprocess.run(
                argv,
                env=env,
                pass_fds=() if fd is None else (fd,),
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{os.path.basename(argv[0])} did not run ({exc})"
        finally:
            if fd is not None:
                os.close(fd)
        if out.returncode == 0:
            return None
        detail = (out.stderr or out.stdout).strip().splitlines()
        name = os.path.basename(argv[0]) if program else "unshare"
        return f"{name} failed: {detail[-1] if detail else out.returncode}"
