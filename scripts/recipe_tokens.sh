#!/usr/bin/env bash
# The ModernBERT-style recipe in small (configs/recipes/demo_batch_warmup_tokens.yaml, issue 51) on this CPU:
# prepare the bundled English and Chinese corpora from the set-up data cache `make demo` uses (the recipe's
# mixture draws from the two sources `en` and `zh`), print the plan, train with 2 local ranks under ZeRO-2,
# and write the run's report.md and plots (batch and LR against tokens: plots/batch_lr_tokens.png).
# About 10 minutes on an idle 2-core machine; re-running resumes. docs/token_schedules.md shows one run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$PWD/.venv/bin"
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
DATA_CACHE=${ROFORMER_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/roformer-ds/data}
RUN_DIR=${RUN_DIR:-runs/recipe-tokens}
DATA_DIR=runs/recipe-data   # the recipe reads it from here
CONFIG=configs/recipes/demo_batch_warmup_tokens.yaml

if [ ! -f "$DATA_DIR/manifest.json" ]; then
  roformer data prepare --default-corpus en,zh --data-cache "$DATA_CACHE" --out "$DATA_DIR" --vocab-size 8000 \
    --workers 2
else
  echo "reusing $DATA_DIR (delete it to prepare again)"
fi
roformer plan --config "$CONFIG" --world-size 2
roformer pretrain --num_gpus 2 --config "$CONFIG" --run-dir "$RUN_DIR"
roformer report "$RUN_DIR"
