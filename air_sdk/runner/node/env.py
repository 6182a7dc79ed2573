"""Which variables of the gateway's (or a Ray node's) environment reach a rank.

Ranks do not inherit the gateway's whole environment: the gateway may hold
secrets of its own (its admin token, cloud credentials, a database password)
that a job must never see. A rank's environment is, in this order:

1. `allowed_env(os.environ)`: the variables below, from the environment of the
   process that starts the node's ranks (the gateway for local virtual nodes, the
   node actor on a Ray node), less any whose name says it is a secret
   (`air_sdk.redact.is_secret_env`: `HF_TOKEN`, an AIR token in any value) and proxy URLs
   that carry a password;
2. AIR's defaults, where 1 did not set them (`OMP_NUM_THREADS=1`,
   `PYTHONUNBUFFERED=1`, `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`, and
   `GLOO_SOCKET_IFNAME=lo` for local virtual nodes);
3. the job's own `env` (its secrets included: the job asked for them);
4. the env contract, `air_sdk.schema.WorkerEnv` (RANK, AIR_JOB_ID, ...).

Passed by name, and why:

| names | why |
| --- | --- |
| PATH, HOME, USER, LOGNAME, SHELL | finding programs, caches under ~ (torch hub, inductor's per-user cache dir), `getpass.getuser()` |
| LANG, LANGUAGE, LC_*, TZ, TERM | text encoding of the output, local time in logs, terminal-aware libraries |
| TMPDIR, TEMP, TMP | where temporary files go (the operator chose a disk for them) |
| PYTHON* (PYTHONPATH, PYTHONHOME, ...) | the ranks run the gateway's interpreter and must import the same packages |
| VIRTUAL_ENV, CONDA_PREFIX, CONDA_DEFAULT_ENV | tools that look for the active environment |
| LD_LIBRARY_PATH | shared libraries (CUDA, NCCL plugins) outside the default paths |
| CUDA_*, NVIDIA_*, NCCL_*, GLOO_*, UCX_*, FI_* | GPU and interconnect settings of the machine (not CUDA_VISIBLE_DEVICES on a local node: the placement sets it) |
| TORCH*, PYTORCH_*, TRITON_* | torch settings and compile caches the operator set (TORCHELASTIC_* excepted: AIR sets those) |
| OMP_*, MKL_*, KMP_*, OPENBLAS_* | CPU thread pools |
| HF_*, TRANSFORMERS_*, XDG_CACHE_HOME, XDG_CONFIG_HOME | model and data caches shared by every job of the machine |
| REQUESTS_CA_BUNDLE, SSL_CERT_FILE, SSL_CERT_DIR, CURL_CA_BUNDLE | a private CA, to reach an https gateway or a model hub |
| HTTP_PROXY, HTTPS_PROXY, NO_PROXY (either case) | the machine's way out, unless the URL holds a password |
| AIR_CHECKPOINT_ON_FAILURE, AIR_CHECKPOINT_SNAPSHOT | operator defaults for the runtime's checkpointing |

Everything else (AIR_TOKEN, RAY_AUTH_TOKEN, AWS_*, DATABASE_URL, ...) stays with
the gateway; a job that needs a variable sets it in its own `env`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from air_sdk.redact import is_secret_env
from air_sdk.schema.worker_env import WorkerEnv

__all__ = ["PASSED_NAMES", "PASSED_PREFIXES", "allowed_env"]

PASSED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "TEMP",
        "TMP",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "LD_LIBRARY_PATH",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        WorkerEnv.env_name("checkpoint_on_failure"),
        WorkerEnv.env_name("checkpoint_snapshot"),
    }
)
PASSED_PREFIXES = (
    "LC_",
    "PYTHON",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "GLOO_",
    "UCX_",
    "FI_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "HF_",
    "TRANSFORMERS_",
)
#: AIR sets these for every rank; a value in the starting process's env says nothing
_OWNED = WorkerEnv.names() - {
    WorkerEnv.env_name("checkpoint_on_failure"),
    WorkerEnv.env_name("checkpoint_snapshot"),
}
_URL_WITH_USERINFO = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def allowed_env(
    environ: Mapping[str, str], *, keep: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The part of `environ` a rank may see (see the module docstring); `keep` names
    contract variables to pass anyway (a Ray node's CUDA_VISIBLE_DEVICES).

    Example:
        >>> allowed_env({"PATH": "/bin", "AIR_TOKEN": "air_x", "HF_TOKEN": "t", "HF_HOME": "/h"})
        {'PATH': '/bin', 'HF_HOME': '/h'}
    """
    out = {}
    for name, value in environ.items():
        if name in _OWNED and name not in keep:
            continue
        if name.startswith("TORCHELASTIC_") or is_secret_env(name, value):
            continue
        if name not in PASSED_NAMES and not name.startswith(PASSED_PREFIXES):
            continue
        if name.lower().endswith("_proxy") and _URL_WITH_USERINFO.match(value):
            continue
        out[name] = value
    return out
