#!/usr/bin/env bash
# `make test`: the whole suite as four pytest processes side by side on the 2-core reference machine. Each lane
# keeps about 0.55-0.65 of a core busy on its own (it waits on jobs starting, ssh sessions, watchdog bounds, pulled
# links, restart backoff, servers), so four lanes keep both cores busy where two or three left them ~15% idle.
# - cluster lane: tests/cluster (the two-node network-namespace cluster, MPI, Slurm).
# - unit lane: tests/unit but the two files the multirank lane takes, then the runs from object storage
#   (test_remote_training.py).
# - launch lane: the multirank tests whose jobs are `roformer pretrain` commands (stops, restarts, trackers, the
#   guard, init-from, BERT), which share the guard's session run, then the quick reproduction
#   (test_reproduce_multirank.py: `roformer` jobs of its own, no session fixture).
# - multirank lane: the rest of tests/multirank (their jobs mostly forked warm: tests/support/fork_server.py),
#   tests/gpu (skipped without CUDA) and two unit files (torch.compile, fine-tuning on the user's files: 200 s);
#   its output is the console's, the other lanes' logs follow it.
# The lanes end within a minute or two of each other (README "Tests"; rebalance from `--cpu-report`).
# Ports: every test port is claimed (tests/support/helpers.free_port, launcher/launch/ports.py: a lock file
# per port, held until the pytest process exits), so two lanes never get the same one.
# Same arguments to every lane; the exit status is the first non-zero one. One folder alone:
# `.venv/bin/python -m pytest tests/unit` (`make test-fast`).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
UNIT_IN_MULTIRANK_LANE=(tests/unit/test_model_compile.py tests/unit/test_finetune_own_files.py)
CLUSTER_LANE=(tests/cluster)
UNIT_LANE=(tests/unit "${UNIT_IN_MULTIRANK_LANE[@]/#/--ignore=}" tests/multirank/test_remote_training.py)
LAUNCH_LANE=(tests/multirank/test_stop_at_start.py tests/multirank/test_init_from_multirank.py
             tests/multirank/test_guard.py tests/multirank/test_trackers.py tests/multirank/test_bert_multirank.py
             tests/multirank/test_restarts.py tests/multirank/test_fork_server.py
             tests/multirank/test_rank_teardown.py tests/multirank/test_reproduce_multirank.py)
lane_paths() {  # the paths of lane $1 (cluster, unit, launch)
  local -n paths="${1^^}_LANE"
  printf '%s\n' "${paths[@]}"
}
names=(cluster unit launch)
pids=()
logs=()
for name in "${names[@]}"; do
  mapfile -t paths < <(lane_paths "$name")
  log=$(mktemp "${TMPDIR:-/tmp}/roformer-$name-lane.XXXXXX.log")
  "$PY" -m pytest "${paths[@]}" "$@" >"$log" 2>&1 &
  pids+=($!)
  logs+=("$log")
done
# A stop of `make test` stops every lane (the cluster tests clean up their namespaces on SIGTERM).
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait "${pids[@]}"; exit 130' INT TERM
elsewhere=()
for path in "${CLUSTER_LANE[@]}" tests/unit/test_*.py tests/multirank/test_remote_training.py "${LAUNCH_LANE[@]}"; do
  [[ " ${UNIT_IN_MULTIRANK_LANE[*]} " == *" $path "* ]] || elsewhere+=("--ignore=$path")
done
"$PY" -m pytest tests "${elsewhere[@]}" "$@"
status=$?
for i in "${!names[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  [ "$status" -eq 0 ] && status=$rc
  echo "=== the ${names[$i]} lane: $(lane_paths "${names[$i]}" | tr '\n' ' ')(ran beside the rest; log: ${logs[$i]}) ==="
  cat "${logs[$i]}"
done
trap - INT TERM
exit "$status"
