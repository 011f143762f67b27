"""Where DeepSpeed's JIT-compiled ops are cached: one directory per Python environment.

torch rebuilds an op in TORCH_EXTENSIONS_DIR whenever its build inputs (torch's include paths and flags,
the ninja binary) differ, so environments sharing one directory rebuild each other's op at every start
(docs/training.md). Each gets its own directory under CACHE_ROOT, keyed by the environment's prefix (not
resolved: every venv's python links to the same interpreter) and torch's version; a TORCH_EXTENSIONS_DIR
other than CACHE_ROOT is used as it is. `python -m launcher.deepspeed_env.ops_cache` prints it. Imports no torch.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ENV_VAR = "TORCH_EXTENSIONS_DIR"


def cache_root(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "roformer-ds" / "torch_extensions"


def environment_key(python: str | None = None) -> str:
    """'py311-torch2.13.0-1a2b3c4d' for the environment `python` (default: this interpreter) belongs to."""
    from importlib import metadata  # here: importing it costs `roformer pretrain --help` 20 ms

    python = python or sys.executable
    prefix = Path(os.path.abspath(python)).parent.parent  # <venv>/bin/python -> <venv>
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    digest = hashlib.sha256(f"{prefix}\0{torch_version}".encode()).hexdigest()[:8]
    return f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch_version}-{digest}"


def extensions_dir(environ=None, python: str | None = None) -> Path:
    """TORCH_EXTENSIONS_DIR for `python`'s environment (see the module doc)."""
    environ = os.environ if environ is None else environ
    root = cache_root(environ)
    given = environ.get(ENV_VAR)
    if given and Path(given).expanduser() != root:
        return Path(given).expanduser()
    return root / environment_key(python)


ARCH_LIST_VAR = "TORCH_CUDA_ARCH_LIST"


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder can read it: '9.0a' -> '9.0'.

    CUDA images for Hopper set arch-specific entries ('9.0a'); DeepSpeed 0.19 parses each entry with
    int() and fails, so FusedAdam never builds. Its ops use no arch-specific instructions."""
    entries = [entry for entry in value.replace(" ", ";").split(";") if entry]
    plain = []
    for entry in entries:
        number, ptx = (entry[:-4], "+PTX") if entry.endswith("+PTX") else (entry, "")
        number = number.rstrip("af") + ptx
        if number not in plain:
            plain.append(number)
    return ";".join(plain)


def prepare_arch_list(environ=None) -> None:
    """Rewrites TORCH_CUDA_ARCH_LIST in `environ` (default os.environ) for DeepSpeed, when it is set."""
    environ = os.environ if environ is None else environ
    if environ.get(ARCH_LIST_VAR):
        environ[ARCH_LIST_VAR] = deepspeed_arch_list(environ[ARCH_LIST_VAR])


if __name__ == "__main__":
    print(extensions_dir())
