#!/usr/bin/env bash
# `make test`: the whole suite as six pytest processes side by side on the 2-core reference machine. Each lane
# keeps about 0.55-0.65 of a core busy on its own (it waits on jobs starting, ssh sessions, watchdog bounds, pulled
# links, restart backoff, servers), so several lanes keep both cores busy where two or three left them ~15% idle.
# - cluster lane: tests/cluster (the two-node network-namespace cluster, MPI, Slurm).
# - three unit lanes, tests/unit split by file name (a-f, g-q, r-z with the runs from object storage,
#   test_remote_training.py), but the files other lanes take. With two (a-m, n-z) the n-z lane was the tail of every
#   CI; with three the clean-clone CI at 0ada7f0 took 21.8 min against 22.4 at the same yardstick, the cores as busy
#   (86-87%), and the tail moved to the cluster and multirank lanes (20.3 min; the unit lanes ended at 17.9, 13.2
#   and 18.6: g-q has room).
# - launch lane: the multirank tests whose jobs are `roformer pretrain` commands (stops, restarts, trackers, the
#   guard, init-from, BERT), which share the guard's session run, then the quick reproduction
#   (test_reproduce_multirank.py: `roformer` jobs of its own, no session fixture) and the downstream tasks' build
#   (test_tasks.py: 111 s of the then n-z lane's wall, 38 s here).
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
# One torch thread per process: six lanes keep both cores busy, and torch's default (a thread a core; a 1-rank job's
# rank gets the node's cores) spins waiting for a core another lane holds (a tiny training 64 -> 5.5 CPU-s at load 9).
# Ranks get it forwarded as a user's setting; the default's computation is tests/unit/test_node_environment.py's.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The project's bytecode once, before ~470 processes import it: where PYTHONDONTWRITEBYTECODE=1 (CI's machine) each
# would compile the modules it imports again (the venv's were compiled by the set-up).
"$PY" -m compileall -q launcher data_pipeline roformer tests >/dev/null
UNIT_IN_MULTIRANK_LANE=(tests/unit/test_model_compile.py tests/unit/test_finetune_own_files.py)
UNIT_IN_LAUNCH_LANE=(tests/unit/test_tasks.py)
CLUSTER_LANE=(tests/cluster)
unit_files() {  # tests/unit/test_$1*.py but the other lanes' (pytest's --ignore skips no file named on its line)
  local path
  for path in tests/unit/test_$1*.py; do
    [[ " ${UNIT_IN_MULTIRANK_LANE[*]} ${UNIT_IN_LAUNCH_LANE[*]} " == *" $path "* ]] || echo "$path"
  done
}
mapfile -t UNIT_A_TO_F_LANE < <(unit_files "[a-f]")
mapfile -t UNIT_G_TO_Q_LANE < <(unit_files "[g-q]")
mapfile -t UNIT_R_TO_Z_LANE < <(unit_files "[r-z]"; echo tests/multirank/test_remote_training.py)
LAUNCH_LANE=(tests/multirank/test_stop_at_start.py tests/multirank/test_init_from_multirank.py
             tests/multirank/test_guard.py tests/multirank/test_trackers.py tests/multirank/test_bert_multirank.py
             tests/multirank/test_restarts.py tests/multirank/test_fork_server.py
             tests/multirank/test_rank_teardown.py tests/multirank/test_reproduce_multirank.py "${UNIT_IN_LAUNCH_LANE[@]}")
lane_paths() {  # the paths of lane $1 (one of names)
  local -n paths="${1^^}_LANE"
  printf '%s\n' "${paths[@]}"
}
names=(cluster unit_a_to_f unit_g_to_q unit_r_to_z launch)
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
  mapfile -t paths < <(lane_paths "${names[$i]}")
  shown="${paths[*]:0:9}"
  [ "${#paths[@]}" -le 9 ] || shown+=" and $(( ${#paths[@]} - 9 )) more files"
  echo "=== the ${names[$i]} lane: $shown (ran beside the rest; log: ${logs[$i]}) ==="
  cat "${logs[$i]}"
done
trap - INT TERM
exit "$status"
