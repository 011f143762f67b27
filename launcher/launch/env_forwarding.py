"""Which environment variables every rank of a run gets, and the run's `.deepspeed_env` file.

DeepSpeed's runner forwards only `PYTHON*`, `MLFLOW*`, `MV2*`, `UCX*` (plus the accelerator's
own, `NCCL*` on CUDA) to other nodes; everything else must be listed in an env file. It reads
`$DS_ENV_FILE` (a name, default `.deepspeed_env`) joined to `~` and to its working directory
(`runner.py`: DEEPSPEED_ENVIRONMENT_PATHS); an absolute DS_ENV_FILE therefore names one file. We
write `RUN_DIR/.deepspeed_env` and point DS_ENV_FILE at it, so each run documents exactly what its
ranks were given and a stray `~/.deepspeed_env` is not picked up.

The forwarded list (documented in docs/multinode.md; keep the two in sync):
- computed: `PATH` (this machine's PATH, with the venv's `bin` appended when missing: ranks find
  the venv's tools, e.g. `ninja` for DeepSpeed's JIT ops, but resolve every tool exactly as the
  launching shell does. Not prepended: two ninja versions (the venv's 1.13, Debian's 1.11)
  sharing one TORCH_EXTENSIONS_DIR rebuild DeepSpeed's shm op on every switch, 40-170 s each,
  measured here),
  `PYTHONPATH` (the project root first), `OMP_NUM_THREADS` (when unset: cores / ranks per node,
  so ranks do not oversubscribe the CPU), `MASTER_PORT` (MPI launchers, see launch_plan.py);
  `TORCH_EXTENSIONS_DIR` (DeepSpeed's JIT op cache, one per Python environment: launcher/ops_cache.py;
  a value set in the launching shell is kept unless it is the shared cache root);
- copied when set: the names in FORWARDED_NAMES and every variable starting with a prefix in
  FORWARDED_PREFIXES (`NCCL_*`, `GLOO_*`, `TORCH_*`, `HF_*`, `ROFORMER_*`, ...), except names that
  look like credentials (CREDENTIAL_NAME_RE: `HF_TOKEN`, `..._SECRET`, ...).

The pdsh launcher pastes `export KEY=VALUE;` into a remote shell command (values with unusual
characters in double quotes, `%` substituted by pdsh), so a value containing `"`, `$`, a backtick,
a backslash, `%` or a line break is refused with the variable's name instead of being run.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from launcher import ops_cache
from launcher.errors import UserError
from launcher.io import atomic_write_text
from launcher.run_dir.layout import RunDir


FORWARDED_NAMES = (
    "DS_ACCELERATOR",  # cpu here; unset on GPU nodes (DeepSpeed detects CUDA)
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "DEEPSPEED_TIMEOUT",  # minutes for collectives before a hung rank errors out
    "LD_LIBRARY_PATH",  # CUDA / NCCL / MPI libraries outside the default search path
    "CUDA_HOME",
    "VIRTUAL_ENV",
)
FORWARDED_PREFIXES = (
    "NCCL_",  # NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_DEBUG ...
    "GLOO_",  # GLOO_SOCKET_IFNAME: the interface the CPU (gloo) backend binds to
    "TORCH_",  # TORCH_EXTENSIONS_DIR (compiled ops cache), TORCH_DISTRIBUTED_DEBUG, TORCH_NCCL_* ...
    "HF_",  # HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, HF_HOME ...
    "ROFORMER_",  # the project's own settings
)
# What DeepSpeed's runner forwards by itself (runner.EXPORT_ENVS and CUDA's export_envs): we do
# not write these, but they reach the same remote shell, so they are checked too.
RUNNER_FORWARDED_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")

# Credentials under a forwarded prefix (HF_TOKEN, ...) would be written to the shared RUN_DIR/.deepspeed_env,
# printed by --dry-run and shown in every node's `ps`; the ranks never need them (no hub access).
CREDENTIAL_NAME_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL", re.IGNORECASE)

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE_VALUE_CHARS = frozenset('"$`\\%\n\r')


def project_root() -> Path:
    """The directory holding the `launcher` package: ranks run `python -m launcher...` from it."""
    import launcher

    return Path(launcher.__file__).resolve().parent.parent


def forwarded_environment(base: dict[str, str], *, ranks_per_node: int, python: str = sys.executable) -> dict[str, str]:
    """The variables written to `.deepspeed_env` (and set for local ranks), from `base` (os.environ)."""
    env = {k: v for k, v in base.items()
           if k in FORWARDED_NAMES or (k.startswith(FORWARDED_PREFIXES) and not CREDENTIAL_NAME_RE.search(k))}
    venv_bin = str(Path(python).parent)
    env["PATH"] = _append(base.get("PATH", os.defpath), venv_bin)
    env["PYTHONPATH"] = _prepend(str(project_root()), base.get("PYTHONPATH", ""))
    env[ops_cache.ENV_VAR] = str(ops_cache.extensions_dir(base, python))
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, ranks_per_node)))
    return env


def _prepend(first: str, path_list: str) -> str:
    entries = [first, *(p for p in path_list.split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(entries))  # first occurrence wins, order kept


def _append(path_list: str, last: str) -> str:
    entries = [*(p for p in path_list.split(os.pathsep) if p), last]
    return os.pathsep.join(dict.fromkeys(entries))


def check_shell_safe(env: dict[str, str], *, also_from: dict[str, str] | None = None) -> None:
    """Refuse variables that would be interpreted by the remote shell pdsh runs (see module doc).

    `also_from` is the environment DeepSpeed's runner will forward on its own (RUNNER_FORWARDED_PREFIXES).
    """
    candidates = dict(env)
    for key, value in (also_from or {}).items():
        if key.startswith(RUNNER_FORWARDED_PREFIXES):
            candidates.setdefault(key, value)
    for key, value in candidates.items():
        if not _KEY_RE.fullmatch(key):
            raise UserError(f"environment variable {key!r}: not a valid variable name to forward to other nodes")
        bad = sorted(set(value) & _UNSAFE_VALUE_CHARS)
        if bad:
            raise UserError(
                f"environment variable {key}: its value contains {''.join(bad)!r}, which the remote shell "
                "started by pdsh would interpret; unset or simplify it before a multi-node launch"
            )


def render_env_file(env: dict[str, str]) -> str:
    """`KEY=VALUE` lines as DeepSpeed's runner parses them (split at the first '=', no blank lines)."""
    for key, value in env.items():
        if "\n" in value or "\r" in value:
            raise UserError(f"environment variable {key}: line breaks cannot be forwarded")
    return "".join(f"{key}={value}\n" for key, value in sorted(env.items()))


def write_env_file(run_dir: Path, env: dict[str, str]) -> Path:
    """Write RUN_DIR/.deepspeed_env atomically and return its path."""
    path = RunDir(run_dir).env_file
    atomic_write_text(path, render_env_file(env))
    return path
