"""Escapes from the local rank sandbox an outside attacker reproduced (issue 19).

Each attack runs through a real gateway (two tenants, the attacker holds a member
token of one) whose ranks run sandboxed with bwrap, then the `unshare` jail:

* item 2: the job's `env` reached the sandbox's wrapper, which runs outside the
  sandbox: an `LD_PRELOAD` library ran inside bwrap and a `PYTHONPATH` module inside
  the jail, before the hiding, and read the admin token;
* item 3: `output_dir` and `checkpoint.dir` could name any path (the home's parent,
  `/`, `/etc`, `~/.ssh`), which the gateway created and bound read-write;
* item 4: under a root gateway (as here: `make demo` and CI run as root) a rank held
  every capability: it could mount, remount / read-write, write under /usr and leave
  a setuid-root program in a directory others run from.

bubblewrap must be installed on Linux (`make sandbox-deps`); the LD_PRELOAD attack
builds its library with the C compiler (Debian's build-essential).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from airtest import stop_gateway_and_its_jobs, wait_for

from air_sdk.client import Client
from air_sdk.gateway.server import GatewayOptions, start_detached
from air_sdk.runner.backends.local import free_port
from air_sdk.schema import JobState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandboxes need Linux"),
]
KINDS = ["bwrap", "unshare"]


@dataclass
class Gateway:
    attacker: Client  # a member of tenant "acme"
    admin_token: str
    home: Path
    approved: Path  # the gateway's allowed_data_roots


@pytest.fixture(scope="module", params=KINDS)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    if request.param == "bwrap" and shutil.which("bwrap") is None:
        pytest.fail("bwrap is not installed: apt-get install bubblewrap (make sandbox-deps)")
    home = tmp_path_factory.mktemp("air-home")
    approved = tmp_path_factory.mktemp("approved")
    opts = GatewayOptions(
        port=free_port(),
        home=home,
        num_nodes=1,
        slots_per_node=2,
        write_client_config=False,
        sandbox=request.param,
        allowed_data_roots=(approved,),
    )
    gw = start_detached(opts)
    try:
        assert f"sandboxed with {request.param}" in gw.log_path.read_text()
        admin = Client(gw.url, gw.token).admin
        admin.create_tenant("acme")
        member = admin.create_token(tenant="acme", role="member", name="attacker").token
        yield Gateway(Client(gw.url, member), gw.token, home, approved)
    finally:
        stop_gateway_and_its_jobs(gw.url, gw.token, home)


def _run(gateway: Gateway, workdir: Path, expect: str, **options: object) -> list[str]:
    """The job's log lines once one holds `expect` (a rank's last lines may reach the
    gateway a moment after the job ended)."""
    job = gateway.attacker.submit_script(workdir / "train.py", **options)  # type: ignore[arg-type]
    record = job.wait(timeout=240)
    lines = [line.text for line in job.logs()]
    assert record.state is JobState.SUCCEEDED, (record.state_reason, lines)

    def complete() -> list[str] | None:
        lines[:] = [line.text for line in job.logs()]
        return lines if any(expect in t for t in lines) else None

    wait_for(complete, 60, f"a log line with {expect!r}")
    return lines


# ---- item 2: the job's env reached the wrapper --------------------------------------------

#: from the ranks' working directory (AIR_HOME/jobs/<id>/code), the home's admin token
PRELOAD = r"""
#include <stdio.h>
static void __attribute__((constructor)) steal(void) {
    char buf[256] = {0};
    FILE *f = fopen("../../../token", "r");
    fprintf(stderr, "PRELOADED\n");
    if (f) { fread(buf, 1, sizeof buf - 1, f); fclose(f); fprintf(stderr, "LEAK:%s\n", buf); }
}
"""

#: a `json` that reads the token, then hands over to the real one (the jail imports json)
JSON_SHIM = """
import os, sys
try:
    sys.stderr.write("LEAK:" + open("../../../token").read() + "\\n")
except OSError:
    sys.stderr.write("SHIMMED\\n")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
del sys.modules[__name__]
import json as _real
sys.modules[__name__] = _real
"""

TRAIN = """
import json, os
print(json.dumps("rank ran"), flush=True)
print("rank ran with LD_PRELOAD=" + os.environ.get("LD_PRELOAD", ""), flush=True)
"""


def test_the_jobs_env_shapes_its_ranks_but_not_the_sandbox_wrapper(gateway, tmp_path):
    if shutil.which("cc") is None:
        pytest.fail("no C compiler to build the LD_PRELOAD library: apt-get install gcc")
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(TRAIN))
    (work / "json.py").write_text(textwrap.dedent(JSON_SHIM))
    (work / "steal.c").write_text(PRELOAD)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(work / "steal.so"), str(work / "steal.c")],
        check=True,
    )
    lines = _run(
        gateway, work, "rank ran with", env={"LD_PRELOAD": "./steal.so", "PYTHONPATH": "."}
    )
    text = "\n".join(lines)
    assert "LEAK:" not in text and gateway.admin_token not in text, lines
    # the env still reached the rank: the library and the module were loaded inside
    assert "rank ran with LD_PRELOAD=./steal.so" in text, lines
    assert "PRELOADED" in text, lines
    assert "SHIMMED" in text, lines


# ---- item 4: a root gateway's ranks held every capability --------------------------------

ROOT_ESCAPE = """
import ctypes, json, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND = 32, 4096
canary = sys.argv[1]
result = {}

def status(text, name):
    return next(l.split()[1] for l in text.splitlines() if l.startswith(name + ":"))

def syscall(name, ret):
    result[name] = "DONE" if ret == 0 else os.strerror(ctypes.get_errno())

own = open("/proc/self/status").read()
result["uid"] = os.getuid()
result["CapEff"], result["CapBnd"] = status(own, "CapEff"), status(own, "CapBnd")
result["NoNewPrivs"] = status(own, "NoNewPrivs")
os.makedirs("/tmp/m", exist_ok=True)
syscall("mount tmpfs", libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None))
home = os.path.realpath("../../..")  # the gateway's home, hidden by a tmpfs
syscall("unmount the hiding", libc.umount2(home.encode(), 2))
syscall("remount / rw", libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None))
try:
    open(f"/usr/{canary}", "w").write("x")
    result["write /usr"] = "WROTE"
except OSError as exc:
    result["write /usr"] = type(exc).__name__
out = os.environ["AIR_OUTPUT_DIR"]
suid = os.path.join(out, "suid-cat")
shutil.copy("/bin/cat", suid)
os.chmod(suid, 0o4755)
result["setuid bit"] = bool(os.stat(suid).st_mode & 0o4000)
result["output dir nosuid"] = bool(os.statvfs(out).f_flag & os.ST_NOSUID)
child = subprocess.run([suid, "/proc/self/status"], capture_output=True, text=True).stdout
result["setuid child CapEff"] = status(child, "CapEff")
print("RESULT " + json.dumps(result), flush=True)
"""


def test_a_root_gateways_rank_holds_no_capability(gateway, tmp_path):
    import os
    import secrets

    if os.geteuid() != 0:
        pytest.skip(
            "the gateway here is not root; this attack needs a root gateway (CI, make demo)"
        )
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(ROOT_ESCAPE))
    canary = f"air-escape-{secrets.token_hex(6)}"
    try:
        lines = _run(gateway, work, "RESULT ", args=[canary])
    finally:
        if os.path.exists(f"/usr/{canary}"):
            os.unlink(f"/usr/{canary}")
            pytest.fail(f"a rank wrote /usr/{canary} on the host")
    found = [json.loads(t[len("RESULT ") :]) for t in lines if t.startswith("RESULT ")]
    assert found, lines
    result = found[0]
    assert result["CapEff"] == "0000000000000000" and result["CapBnd"] == "0000000000000000"
    assert result["NoNewPrivs"] == "1"
    for attack in ("mount tmpfs", "unmount the hiding", "remount / rw"):
        assert result[attack] != "DONE", result
    assert result["write /usr"] in ("OSError", "PermissionError"), result
    # a setuid-root program the rank leaves in its output directory runs without
    # privileges inside (nosuid, no capability to regain)
    assert result["output dir nosuid"] is True, result
    assert result["setuid child CapEff"] == "0000000000000000", result


# ---- item 3: job-chosen directories anywhere ---------------------------------------------

WRITE_OUTPUT = """
import os
open(os.path.join(os.environ["AIR_OUTPUT_DIR"], "ok.txt"), "w").write("ok")
print("wrote", flush=True)
"""


def test_job_chosen_directories_are_refused_outside_the_approved_roots(gateway, tmp_path):
    import os
    import secrets

    from air_sdk.errors import ApiError

    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(WRITE_OUTPUT))
    canary = f"/etc/air-escape-{secrets.token_hex(6)}"
    attacks = {
        "output_dir": [
            str(gateway.home.parent),
            str(gateway.home),
            "/",
            canary,
            str(Path.home() / ".ssh" / "air"),
            str(gateway.home / "jobs" / "someone-elses"),
        ],
        "checkpoint": ["/etc", str(gateway.home / "secrets")],
    }
    for field, paths in attacks.items():
        for path in paths:
            options = {"checkpoint": {"dir": path}} if field == "checkpoint" else {field: path}
            with pytest.raises(ApiError) as refused:
                gateway.attacker.submit({"entrypoint": "train.py", **options}, workdir=work)
            assert refused.value.status == 400, (path, refused.value)
            assert "leave it unset" in str(refused.value), refused.value
    assert not os.path.exists(canary)
    # under the operator's approved root it works, and the error named that setting
    assert "allowed_data_roots" in str(refused.value) or "home" in str(refused.value)
    run = gateway.approved / "acme" / "run-1"  # the attacker's tenant's part of the root
    _run(gateway, work, "wrote", output_dir=str(run))
    assert (run / "ok.txt").read_text() == "ok"


def test_a_link_planted_after_submit_is_refused_at_launch(tmp_path):
    """The launch checks again: a directory that passed at submit and became a link
    to the gateway's home by launch time is refused, not created or bound."""
    import os

    from air_sdk.errors import ConfigError
    from air_sdk.runner.backends.local import LocalBackend
    from air_sdk.runner.node.launch import NodeLaunch, RankLaunch
    from air_sdk.schema import WorkerEnv

    home, approved = tmp_path / "home", tmp_path / "approved"
    attempt_dir = home / "jobs" / "j1" / "attempts" / "1"
    for d in (home / "jobs" / "j1" / "code", attempt_dir, approved):
        d.mkdir(parents=True)
    backend = LocalBackend(1, 1, sandbox="unshare", home=home, allowed_data_roots=[approved])
    spec_path = str(approved / "default" / "run")
    assert backend.path_policy().refusal("output_dir", spec_path) is None  # as at submit
    (approved / "default").mkdir()
    os.symlink(home, approved / "default" / "run")
    env = {WorkerEnv.env_name("output_dir"): spec_path}
    launch = NodeLaunch(
        "j1", 1, "node-0", str(home / "jobs" / "j1" / "code"), ["t.py"],
        [RankLaunch(0, 0, env)], str(attempt_dir), str(attempt_dir / "n.log"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="symbolic link"):
        backend.sandbox_spec("j1", attempt_dir, launch)
