#!/usr/bin/env bash
# `make test`: the whole suite as three pytest processes side by side on the 2-core reference machine.
# - cluster lane: tests/cluster (the two-node network-namespace cluster, MPI, Slurm), which spends much of its
#   time waiting (watchdog bounds, ssh sessions, pulled links, restart backoff): ~0.7 of a core.
# - unit lane: tests/unit (one process, one core), the quick reproduction (tests/multirank/test_reproduce_multirank.py:
#   `roformer` jobs of its own, no session fixture) and the runs from object storage (test_remote_training.py).
# - multirank lane: the rest (real 2-rank DeepSpeed jobs, most forked warm: tests/support/fork_server.py; gpu,
#   which skips without CUDA).
# The two CPU lanes share the cores the cluster lane leaves idle; the lanes end within a minute or two of each
# other (README "Tests"; rebalance from `--cpu-report`).
# Ports: every test port is claimed (tests/support/helpers.free_port, launcher/launch/ports.py: a lock file
# per port, held until the pytest process exits), so two lanes never get the same one.
# Same arguments to every lane; the exit status is the first non-zero one. One folder alone:
# `.venv/bin/python -m pytest tests/unit` (`make test-fast`).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
UNIT_LANE_MULTIRANK=(tests/multirank/test_reproduce_multirank.py tests/multirank/test_remote_training.py)
cluster_log=$(mktemp "${TMPDIR:-/tmp}/roformer-cluster-lane.XXXXXX.log")
unit_log=$(mktemp "${TMPDIR:-/tmp}/roformer-unit-lane.XXXXXX.log")
"$PY" -m pytest tests/cluster "$@" >"$cluster_log" 2>&1 &
cluster=$!
"$PY" -m pytest tests/unit "${UNIT_LANE_MULTIRANK[@]}" "$@" >"$unit_log" 2>&1 &
unit=$!
# A stop of `make test` stops every lane (the cluster tests clean up their namespaces on SIGTERM).
trap 'kill -TERM "$cluster" "$unit" 2>/dev/null; wait "$cluster" "$unit"; exit 130' INT TERM
"$PY" -m pytest tests --ignore=tests/cluster --ignore=tests/unit "${UNIT_LANE_MULTIRANK[@]/#/--ignore=}" "$@"
multirank_rc=$?
wait "$unit"
unit_rc=$?
echo "=== tests/unit and ${UNIT_LANE_MULTIRANK[*]} (ran beside the rest; log: $unit_log) ==="
cat "$unit_log"
wait "$cluster"
cluster_rc=$?
trap - INT TERM
echo "=== tests/cluster (ran beside the rest; log: $cluster_log) ==="
cat "$cluster_log"
for rc in "$multirank_rc" "$unit_rc" "$cluster_rc"; do
  [ "$rc" -ne 0 ] && exit "$rc"
done
exit 0
