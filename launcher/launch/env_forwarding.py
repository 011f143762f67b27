"""Which environment variables every rank of a run gets, and the run's `.deepspeed_env` file.

DeepSpeed's runner forwards only a few prefixes to other nodes and reads the rest from an env file: we
write RUN_DIR/.deepspeed_env and point DS_ENV_FILE at it, so each run documents exactly what its ranks were
given and a stray ~/.deepspeed_env is not picked up. A rank gets this list and nothing else of the
launching shell (docs/multinode.md, "Environment forwarding": keep the two in sync). pdsh pastes values
into a remote shell command, so a value with `"`, `$`, a backtick, a backslash, `%` or a line break is
refused, naming the variable.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from launcher.deepspeed_env import ops_cache
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_text
from launcher.run_dir.layout import RunDir
import launcher


FORWARDED_NAMES = (
    "OMP_NUM_THREADS",  # only when set: each node computes its own otherwise
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "DEEPSPEED_TIMEOUT",  # minutes for collectives before a hung rank errors out
)
FORWARDED_PREFIXES = (
    "NCCL_",  # NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_DEBUG ...
    "CUDA_",  # CUDA_HOME, CUDA_LAUNCH_BLOCKING ... (DeepSpeed's launcher sets CUDA_VISIBLE_DEVICES per node)
    "DS_",  # DS_ACCELERATOR (cpu here; unset on GPU nodes: DeepSpeed detects CUDA), DS_SKIP_CUDA_CHECK ...
    "GLOO_",  # GLOO_SOCKET_IFNAME: the interface the CPU (gloo) backend binds to
    "TORCH_",  # TORCH_DISTRIBUTED_DEBUG, TORCH_NCCL_* ... (not TORCH_EXTENSIONS_DIR: NODE_LOCAL_NAMES)
    "HF_",  # HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, HF_HOME ...
    "ROFORMER_",  # the project's own settings
    "MLFLOW_",  # MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME (rank 0's tracker, launcher/tracking/)
    "WANDB_",  # WANDB_PROJECT, WANDB_MODE, WANDB_ENTITY, WANDB_BASE_URL (not WANDB_API_KEY: a credential)
    "AWS_",  # s3:// data: AWS_ENDPOINT_URL, AWS_PROFILE, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SHARED_CREDENTIALS_FILE ...
    # (not AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN: credentials, see held_back_credentials)
)
# Set on every node from that node's own software (launcher/deepspeed_env/ops_cache.py): this machine's value
# (e.g. a CPU torch's op cache on a login node) would be wrong there.
NODE_LOCAL_NAMES = (ops_cache.ENV_VAR, "DS_ENV_FILE")
RANKS_PER_NODE_VAR = "ROFORMER_RANKS_PER_NODE"
# What DeepSpeed's runner forwards by itself (runner.EXPORT_ENVS and CUDA's export_envs): we do
# not write these, but they reach the same remote shell, so they are checked too.
RUNNER_FORWARDED_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")

# Credentials under a forwarded prefix (HF_TOKEN, ...) would be written to the shared RUN_DIR/.deepspeed_env,
# printed by --dry-run and shown in every node's `ps`; the ranks never need them (no hub access).
CREDENTIAL_NAME_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL", re.IGNORECASE)
# ... unless the name says it holds a path (AWS_SHARED_CREDENTIALS_FILE): where a node finds its own credentials.
_PATH_NAME_RE = re.compile(r"_(FILE|PATH)$")


def is_credential(name: str) -> bool:
    return bool(CREDENTIAL_NAME_RE.search(name)) and not _PATH_NAME_RE.search(name)

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE_VALUE_CHARS = frozenset('"$`\\%\n\r')


def project_root() -> Path:
    """The directory holding the `launcher` package: ranks run `python -m launcher...` from it."""
    return Path(launcher.__file__).resolve().parent.parent


def forwarded_environment(base: dict[str, str], *, ranks_per_node: int, python: str = sys.executable,
                          local: bool = True) -> dict[str, str]:
    """The variables written to `.deepspeed_env` (and set for local ranks), from `base` (os.environ).

    local: the ranks run on this machine, so this machine's PATH and core count are theirs too."""
    env = {k: v for k, v in base.items()
           if k not in NODE_LOCAL_NAMES
           and (k in FORWARDED_NAMES or (k.startswith(FORWARDED_PREFIXES) and not is_credential(k)))}
    env.update(user_env_file_entries(base))
    env["PYTHONPATH"] = _prepend(str(project_root()), env.get("PYTHONPATH", base.get("PYTHONPATH", "")))
    env[RANKS_PER_NODE_VAR] = str(ranks_per_node)
    if local:
        env["PATH"] = append_venv_bin(base.get("PATH", os.defpath), python)
        if "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, ranks_per_node)))
    return env


def held_back_credentials(base: dict[str, str]) -> list[str]:
    """Credential variables set here under a forwarded prefix that other nodes do not get (AWS_SECRET_ACCESS_KEY):
    DeepSpeed's runner would write them into the shared .deepspeed_env and log them in its pdsh command line.
    Each node finds its own through the standard chain (AWS_PROFILE and its credentials file, an instance role)."""
    return sorted(k for k in base if k.startswith(FORWARDED_PREFIXES) and is_credential(k))


def append_venv_bin(path_list: str, python: str = sys.executable) -> str:
    """PATH with the venv's `bin` (the directory of `python`) appended when missing (see the module doc)."""
    return _append(path_list, str(Path(python).parent))


def user_env_files(base: dict[str, str]) -> list[Path]:
    """The user's DeepSpeed env files that exist, where DeepSpeed's runner would read them."""
    name = base.get("DS_ENV_FILE", ".deepspeed_env")
    home = Path(base.get("HOME") or Path.home())
    candidates = [Path(name)] if Path(name).is_absolute() else [home / name, project_root() / name]
    return [path for path in dict.fromkeys(candidates) if path.is_file()]


def user_env_file_entries(base: dict[str, str]) -> dict[str, str]:
    """KEY=VALUE lines of the user's DeepSpeed env files (blank lines and '#' comments skipped);
    UserError naming file and line for anything else."""
    entries: dict[str, str] = {}
    for path in user_env_files(base):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not _KEY_RE.fullmatch(key.strip()):
                raise UserError(f"{path}:{number}: expected KEY=VALUE (a DeepSpeed env file), got {line!r}")
            if CREDENTIAL_NAME_RE.search(key):
                continue  # would be copied into the shared RUN_DIR/.deepspeed_env
            entries[key.strip()] = value
    return entries


def node_computed(python: str = sys.executable) -> list[tuple[str, str]]:
    """(variable, what each node sets it to when a rank starts): for the --dry-run listing."""
    return [("PATH", f"the node's own PATH, {Path(python).parent} appended when missing"),
            (ops_cache.ENV_VAR, f"~/.cache/roformer-ds/torch_extensions/py<version>-torch<the node's torch version>-<hash of "
                                f"{Path(python).parent.parent}> (launcher/deepspeed_env/ops_cache.py), unless set on the node"),
            ("OMP_NUM_THREADS", f"the node's cores / its ranks ({RANKS_PER_NODE_VAR}), unless forwarded")]


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
