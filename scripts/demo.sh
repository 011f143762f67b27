#!/usr/bin/env bash
# The main job (README command 1), on this CPU: prepare the bundled real corpus and tokenizer,
# run the tiny 3-stage schedule with 2 local ranks under ZeRO-2, export the final checkpoint as a
# transformers RoFormer directory, run the downstream evaluations on the export, and write the
# run's report.md and plots.
set -euo pipefail
cd "$(dirname "$0")/.."
# Appended, as the launcher does for its ranks: the shell's own tools (ninja, ssh) stay first.
export PATH="$PATH:$PWD/.venv/bin"
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
DATA_CACHE=${ROFORMER_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/roformer-ds/data}
RUN_DIR=${RUN_DIR:-runs/demo}
DATA_DIR=runs/demo-data   # configs/demo_cpu.yaml reads it from here

step() { printf '\n=== %s\n' "$*"; }

step "1/6 data: linux-doc English corpus (22 MB) -> SentencePiece (8k) -> shards"
if [ ! -f "$DATA_DIR/manifest.json" ]; then
  roformer data prepare --default-corpus en --data-cache "$DATA_CACHE" --out "$DATA_DIR" \
    --vocab-size 8000 --workers 2
else
  echo "reusing $DATA_DIR (delete it to prepare again)"
fi

step "2/6 pretrain: tiny 3-stage schedule, 2 CPU ranks, ZeRO-2 (re-running resumes)"
roformer plan --config configs/demo_cpu.yaml --world-size 2
roformer pretrain --num_gpus 2 --config configs/demo_cpu.yaml --run-dir "$RUN_DIR"

step "3/6 export: consolidated fp32 transformers directory"
roformer export "$RUN_DIR" --out "$RUN_DIR/export"

step "4/6 eval-mlm: masked-LM figures at trained and longer-than-trained lengths, and the random-init twin's"
# The JSON reports go to --out only (their stdout copies are dropped); the summary at the end shows them.
# The twin (same architecture and tokenizer, fresh weights) on the same validation tokens and masks:
# the difference is what the pretraining learned.
roformer eval-mlm "$RUN_DIR/export" --data "$DATA_DIR" --seq-lens 128,512 --out "$RUN_DIR/eval_mlm.json" >/dev/null
roformer eval-mlm "$RUN_DIR/export" --random-init --data "$DATA_DIR" --seq-lens 128 \
  --out "$RUN_DIR/eval_mlm_random_init.json" >/dev/null

step "5/6 finetune: movie-review sentiment (binary), the export next to its random-init twin"
# The twin has the same architecture, tokenizer and fine-tuning; only the weights are fresh, so the
# difference printed is what this short pretraining bought (measured: nothing yet, see README).
roformer finetune "$RUN_DIR/export" --task movie-reviews --max-length 64 \
  --max-train-examples 2000 --epochs 2 --compare-random-init --out "$RUN_DIR/finetune_movie_reviews.json"

step "6/6 report: one page and plots of the run ($RUN_DIR/report.md, $RUN_DIR/plots/)"
roformer report "$RUN_DIR"

step "summary (read from the JSON reports written above)"
python3 scripts/demo_summary.py "$RUN_DIR/eval_mlm.json" "$RUN_DIR/eval_mlm_random_init.json" \
  "$RUN_DIR/finetune_movie_reviews.json" "$RUN_DIR/report.md"

printf '\ndemo: done. Report: %s/report.md ; TensorBoard: tensorboard --logdir %s/tb ; export: %s/export\n' "$RUN_DIR" "$RUN_DIR" "$RUN_DIR"
