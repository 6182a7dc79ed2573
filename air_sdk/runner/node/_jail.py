"""A rank's sandbox without bubblewrap: `python -I -S _jail.py SPEC_JSON [ENV_FD] -- ARGV...`.

Standard library only (it runs as a script, before anything is imported), isolated
(`-I`) and with an empty environment: it runs outside the sandbox until unshare(2),
so nothing of the job's may shape it. The rank's environment comes as a JSON object
on ENV_FD (`air_sdk.runner.node.sandbox.wrap`) and is applied only when the rank is
exec'd. The process the NodeRunner starts ("outer") dies with it (parent-death
signal), calls unshare(2) for a user, a mount and a pid namespace (a root gateway's
too: uid 0 maps to itself), and forks the namespace's init, which

1. opens every directory it will bind back, while they are still visible;
2. makes every mount private, then read-only;
3. mounts a fresh /dev (a tmpfs with null, zero, ... and the GPUs bound in), a
   /proc of the new pid namespace, the job's /tmp and /dev/shm;
4. covers the hidden directories with empty tmpfs and binds the job's directories
   back at their paths (`air_sdk.runner.node.sandbox.SandboxSpec`);
5. forks the rank in a session of its own, which drops every capability (the
   bounding and ambient sets too, root's exec fix-ups locked off) and sets
   PR_SET_NO_NEW_PRIVS before it execs, and passes it the signals it gets.

A rank killed by a signal makes outer die by the same signal, so the NodeRunner
reads it as Popen does without a sandbox (an OOM kill stays a SIGKILL).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
#: SECBIT_NOROOT, _NO_SETUID_FIXUP, _KEEP_CAPS, _NO_CAP_AMBIENT_RAISE, each locked (but
#: KEEP_CAPS itself): uid 0 gains nothing from exec, setuid or ambient capabilities
_SECUREBITS = 0b11101111
_CAPABILITY_VERSION_3 = 0x20080522
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
_FORWARD = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


class JailError(Exception):
    pass


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        errno = ctypes.get_errno()
        raise JailError(f"mount {target}: {os.strerror(errno)}")


def _bind_fd(
    fd: int, target: str, read_only: bool = False, device: bool = False, recursive: bool = True
) -> None:
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | (MS_REC if recursive else 0))
    # a bind copies its source's flags, read-only since `_read_only_root`: set them;
    # nosuid and (but for the devices) nodev, as bwrap's binds
    flags = MS_NOSUID | (MS_RDONLY if read_only else 0) | (0 if device else MS_NODEV)
    mount(None, target, None, MS_REMOUNT | MS_BIND | flags)


def _within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it."""
    directory = directory.rstrip("/")
    return path == directory or path.startswith(directory + "/") or not directory


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None


def _make_target(path: str, like_dir: bool) -> None:
    if os.path.lexists(path):
        return
    if like_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _mounts() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")
            flags = 0
            for option in parts[5].split(","):
                flags |= _KEEP_FLAGS.get(option, 0)
            found.append((point, flags))
    return found


def _read_only_root() -> None:
    for point, flags in _mounts():
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except JailError:
            if point == "/":
                raise
            # a mount we cannot remount (autofs, one already covered) stays as it is


def _new_dev(spec: dict, fds: dict[str, int], devices: list[str]) -> None:
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755")
    for path in devices:
        fd = fds.get(path)
        if fd is None:
            continue
        _make_target(path, os.path.isdir(f"/proc/self/fd/{fd}"))
        _bind_fd(fd, path, device=True)
    for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(to, f"/dev/{name}")
    os.symlink("/proc/self/fd/1", "/dev/stdout")
    os.symlink("/proc/self/fd/2", "/dev/stderr")
    os.makedirs("/dev/shm", exist_ok=True)
    shm = spec.get("shm")
    if shm:
        _bind_fd(fds[shm], "/dev/shm")
    else:
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def build(spec: dict) -> None:
    """Steps 1-4 of the module docstring, in this (init) process's namespaces."""
    devices = [f"/dev/{n}" for n in ("null", "zero", "full", "random", "urandom", "tty")]
    devices += spec.get("devices", [])
    sources = [*devices, spec["tmp"], *spec.get("shared", []), *spec.get("writable", [])]
    sources += spec.get("read_only", []) + spec.get("keep", [])
    if spec.get("shm"):
        sources.append(spec["shm"])
    fds = {}
    for path in sources:
        fd = _open(path)
        if fd is not None:
            fds[path] = fd
        elif path in spec.get("writable", []) or path == spec["tmp"]:
            raise JailError(f"{path} is missing")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    _read_only_root()
    _new_dev(spec, fds, devices)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _bind_fd(fds[spec["tmp"]], "/tmp")
    for path in spec.get("keep", []):  # an interpreter or package under /tmp stays there
        if path in fds:
            _make_target(path, True)
            _bind_fd(fds[path], path, read_only=True)
    for path in spec.get("shared", []):  # before the hiding: a home inside one stays hidden
        if path in fds:
            _make_target(path, True)
            # with the mounts under it, a directory holding /tmp, /dev or /proc would bring
            # the ones placed above (the job's /tmp over the host's) back over itself:
            # bound alone, it shows the host's, as bwrap's bind from the old root does
            mine = ("/tmp", "/dev", "/proc")
            _bind_fd(fds[path], path, recursive=not any(_within(m, path) for m in mine))
    for path in spec.get("hide", []):
        _make_target(path, True)
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    null = fds.get("/dev/null")
    for path in spec.get("hide_files", []):
        if null is not None and os.path.isfile(path):
            _bind_fd(null, path, read_only=True, device=True)
    for path in spec.get("writable", []):
        _make_target(path, True)
        _bind_fd(fds[path], path)
    for path in spec.get("read_only", []):
        if path in fds:
            _make_target(path, True)
            _bind_fd(fds[path], path, read_only=True)
    for fd in fds.values():
        os.close(fd)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_privileges() -> None:
    """No capability now or after exec, whatever the uid (0 under a root gateway)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    if _libc.prctl(PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        raise JailError(f"securebits: {os.strerror(ctypes.get_errno())}")
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise JailError(f"drop capability {cap}: {os.strerror(ctypes.get_errno())}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on old kernels
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise JailError(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise JailError(f"capset: {os.strerror(ctypes.get_errno())}")


def _forward(target: int, group: bool) -> None:
    def handler(signum: int, frame: object) -> None:
        try:
            if group:
                os.killpg(target, signum)
            else:
                os.kill(target, signum)
        except OSError:
            pass

    for sig in _FORWARD:
        signal.signal(sig, handler)


def _init(spec: dict, argv: list[str], env: dict[str, str] | None, report: int) -> None:
    """The pid namespace's init: build the sandbox, run the rank, reap, report."""
    try:
        build(spec)
    except (JailError, OSError) as exc:
        print(f"air sandbox (unshare): {exc}", file=sys.stderr, flush=True)
        os._exit(126)
    pid = os.fork()
    if pid == 0:
        for sig in _FORWARD:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        try:
            drop_privileges()
            if env is None:  # started by hand, as a test does: the rank gets ours
                os.execvp(argv[0], argv)
            os.execvpe(argv[0], argv, env)
        except JailError as exc:
            print(f"air sandbox (unshare): {exc}", file=sys.stderr)
            os._exit(126)
        except OSError as exc:
            print(f"air sandbox (unshare): cannot run {argv[0]}: {exc}", file=sys.stderr)
            os._exit(127)
    _forward(pid, group=True)
    while True:  # pid 1 reaps every orphan of the namespace
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if done == pid:
            os.write(report, struct.pack("i", status))
            os._exit(os.waitstatus_to_exitcode(status) % 256)


def _user_namespace() -> None:
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID) != 0:
        raise JailError(f"unshare: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _read_env(fd: int) -> dict[str, str]:
    with os.fdopen(fd, "rb") as f:
        env = json.loads(f.read())
    if not isinstance(env, dict):
        raise SystemExit("air sandbox (unshare): the environment is not a JSON object")
    return {str(k): str(v) for k, v in env.items()}


def main(args: list[str]) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    env = None
    if len(args) >= 4 and args[1].isdigit() and args[2] == "--":
        env = _read_env(int(args[1]))
        args = [args[0], *args[2:]]
    if len(args) < 3 or args[1] != "--":
        print("usage: python -I -S _jail.py SPEC_JSON [ENV_FD] -- ARGV...", file=sys.stderr)
        os._exit(2)
    spec, argv = json.loads(args[0]), args[2:]
    try:
        _user_namespace()
    except (JailError, OSError) as exc:
        print(f"air sandbox (unshare): {exc}", file=sys.stderr, flush=True)
        os._exit(126)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _init(spec, argv, env, write)
    os.close(write)
    _forward(pid, group=False)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    data = os.read(read, 4)
    if len(data) == 4:
        status = struct.unpack("i", data)[0]
    if os.WIFSIGNALED(status):  # die as the rank did: Popen reads -SIGNAL
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    main(sys.argv[1:])
