#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side on the 2-core reference machine.
# - side lane: tests/cluster (the two-node network-namespace cluster, MPI, Slurm), which spends most
#   of its time waiting (watchdog bounds, ssh sessions, pulled links, restart backoff), then tests/unit but MAIN_UNIT
#   (one process, one core); its output is kept in a log and printed after the main lane.
#   It ends with the quick reproduction (tests/multirank/test_reproduce_multirank.py: ~3 min of `roformer`
#   jobs of its own, no session fixture) and the runs from object storage (test_remote_training.py: its
#   moto server and bucket are the side lane's too), which even the two lanes.
# - main lane: the rest (multirank: real 2-rank DeepSpeed runs; gpu, which skips without CUDA), and the
#   unit files of MAIN_UNIT (real MLflow / fine-tuning runs, about 100 s in CI), which even the lanes.
# Ports: every test port is claimed (tests/support/helpers.free_port, launcher/launch/ports.py: a lock file
# per port, held until the pytest process exits), so the two lanes never get the same one.
# Same arguments to both; the exit status is the first non-zero one. One folder alone:
# `.venv/bin/python -m pytest tests/unit` (`make test-fast`).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp "${TMPDIR:-/tmp}/roformer-side-lane.XXXXXX.log")
SIDE_MULTIRANK=(tests/multirank/test_reproduce_multirank.py tests/multirank/test_remote_training.py)
MAIN_UNIT=(tests/unit/test_tracking.py tests/unit/test_retrieval.py tests/unit/test_finetune_own_files.py
           tests/unit/test_tasks.py)
SIDE_UNIT=()
for file in tests/unit/test_*.py; do
  [[ " ${MAIN_UNIT[*]} " == *" $file "* ]] || SIDE_UNIT+=("$file")
done
"$PY" -m pytest tests/cluster "${SIDE_UNIT[@]}" "${SIDE_MULTIRANK[@]}" "$@" >"$log" 2>&1 &
side=$!
# A stop of `make test` stops the side lane too (the cluster tests clean up their namespaces on SIGTERM).
trap 'kill -TERM "$side" 2>/dev/null; wait "$side"; exit 130' INT TERM
"$PY" -m pytest tests --ignore=tests/cluster "${SIDE_UNIT[@]/#/--ignore=}" "${SIDE_MULTIRANK[@]/#/--ignore=}" "$@"
main_rc=$?
wait "$side"
side_rc=$?
trap - INT TERM
echo "=== tests/cluster, tests/unit but ${MAIN_UNIT[*]}, and ${SIDE_MULTIRANK[*]} (ran beside the rest; log: $log) ==="
cat "$log"
[ "$main_rc" -ne 0 ] && exit "$main_rc"
exit "$side_rc"
