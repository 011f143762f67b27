#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side. tests/cluster (the two-node
# network-namespace cluster, MPI, Slurm) spends most of its time waiting: watchdog bounds, ssh
# sessions, pulled links, restart backoff; on 2 cores it leaves one idle. So it runs beside the rest
# (unit, multirank, gpu), its output kept in a log and printed after the main run. Same arguments to
# both; the exit status is the first non-zero one. One folder alone: `.venv/bin/python -m pytest tests/unit`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp "${TMPDIR:-/tmp}/roformer-cluster-tests.XXXXXX.log")
"$PY" -m pytest tests/cluster "$@" >"$log" 2>&1 &
cluster=$!
# A stop of `make test` stops the cluster run too (it cleans up its namespaces on SIGTERM).
trap 'kill -TERM "$cluster" 2>/dev/null; wait "$cluster"; exit 130' INT TERM
"$PY" -m pytest tests --ignore=tests/cluster "$@"
main_rc=$?
wait "$cluster"
cluster_rc=$?
trap - INT TERM
echo "=== tests/cluster (ran beside the rest; log: $log) ==="
cat "$log"
[ "$main_rc" -ne 0 ] && exit "$main_rc"
exit "$cluster_rc"
