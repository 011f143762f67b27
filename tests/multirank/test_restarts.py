"""`roformer pretrain --max-restarts N` on this machine, with real DeepSpeed jobs (2 ranks; 1 where the ranks'
exchange plays no part).

A rank SIGKILLed once mid-run (tests/support/rank_wrapper.py, ROFORMER_TEST_SIGKILL_ONCE_AT): the job is
stopped, started again from the newest checkpoint and finishes by itself, with final weights equal to an
uninterrupted run's (the session's trainer_run) within 1e-6 (dropout off, as in the exact-resume tests);
the restart is in RUN_DIR/restarts.json and in `roformer report`'s restarts table. A rank killed at the
same step every time (a one-rank job): restarted once, then not again, named; its first fault also damages the
newest checkpoint, so the restart resumes from the older one and says so in restarts.json.
"""
from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file

from launcher.run_dir.layout import RunDir
from launcher.run_dir.restart_records import read_restarts
from tests.support.helpers import NO_DROPOUT, TINY_TOTAL_STEPS, events, free_port, metrics_steps, report_of, \
    roformer, roformer_env, tiny_run_config

WRAPPER = "tests.support.rank_wrapper"
KILL = "1:9"  # rank 1, before the step after 9 completed: the newest checkpoint is global_step8
KILL_ONE_RANK = "0:9"  # the same in a one-rank job


def _pretrain(config, run_dir, *flags, ranks=2, timeout=600, **env):
    return roformer("pretrain", "--num_gpus", str(ranks), "--master_port", str(free_port()), "--config", str(config),
                    "--run-dir", str(run_dir), "--entry-module", WRAPPER, "--set", "restarts.backoff_seconds=1",
                    *flags, env=roformer_env(ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1", **env), timeout=timeout)


def test_a_killed_rank_is_restarted_and_the_run_ends_as_an_uninterrupted_one(tiny_data, trainer_run, tmp_path):
    # Dropout off, as in the exact-resume tests (tests/multirank/test_resume.py): resumes compare exactly.
    # The uninterrupted run is the session's trainer_run: the same config, its live weights saved.
    config = tiny_run_config(tmp_path / "config", tiny_data, model=NO_DROPOUT)
    run_dir = tmp_path / "run"
    result = _pretrain(config, run_dir, "--max-restarts", "2", ROFORMER_TEST_SIGKILL_ONCE_AT=KILL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "error: rank 1 (local rank 1) on node localhost: killed by SIGKILL" in output
    assert ("roformer pretrain: restart 1/2 in 1 s from global_step8 (step 8; 1 step(s) to redo) after: rank 1 "
            "(local rank 1) on node localhost: killed by SIGKILL") in output, output[-4000:]
    [record] = read_restarts(RunDir(run_dir))
    assert (record.action, record.kind, record.node, record.rank) == ("restart", "rank", "localhost", 1)
    assert (record.failed_at_step, record.restarted_from_step, record.restarted_from_tag, record.steps_lost) == \
        (9, 8, "global_step8", 1)
    assert record.world_size == 2 and record.excluded_nodes == []
    assert record.restart_seconds is not None and record.restart_seconds > 0
    assert record.seconds_lost == round(record.stop_seconds + record.backoff_seconds + record.restart_seconds
                                        + record.redo_seconds, 2)
    # Step 9 was trained twice; the resumed rank 0 dropped the first one's line (metrics.jsonl reads as one run).
    assert metrics_steps(run_dir) == list(range(1, TINY_TOTAL_STEPS + 1))

    ours = load_file(str(run_dir / "reference.safetensors"))
    theirs = load_file(str(trainer_run / "reference.safetensors"))
    assert ours.keys() == theirs.keys()
    worst = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours)
    assert worst <= 1e-6, worst

    text = report_of(run_dir, tmp_path / "report")  # in this process (the command itself: tests/unit/test_report.py)
    assert "## Restarts" in text
    assert "| 1 | restart | rank 1 (local rank 1) on node localhost: killed by SIGKILL | localhost | 9 | 8 | 1 |" in text
    print(f"\nrestart after a SIGKILLed rank: stop {record.stop_seconds} s + backoff {record.backoff_seconds} s + "
          f"restart {record.restart_seconds} s + redo {record.redo_seconds} s = {record.seconds_lost} s lost; "
          f"weights vs uninterrupted: max |diff| {worst:.2e}")


def test_the_same_error_twice_at_the_same_step_is_not_retried(tiny_data, tmp_path):
    """The first fault also damages the newest checkpoint (global_step8): the restart resumes from the older
    global_step6, and restarts.json names the checkpoint the ranks resumed from, not the damaged one.
    A one-rank job (the launcher's restart policy is the subject, not the ranks' exchange; 2 ranks: the test
    above) on one torch thread (the default, the cores / the ranks, would give it both cores' threads to spin on):
    ~23 CPU-s against ~30 for 2 ranks."""
    config = tiny_run_config(tmp_path / "config", tiny_data)
    run_dir = tmp_path / "run"
    result = _pretrain(config, run_dir, "--max-restarts", "3", ranks=1, OMP_NUM_THREADS="1",
                       ROFORMER_TEST_SIGKILL_AT=KILL_ONE_RANK, ROFORMER_TEST_DAMAGE_NEWEST_AT=KILL_ONE_RANK)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "roformer pretrain: restart 1/3 in 1 s from global_step6 (step 6; 3 step(s) to redo)" in output, \
        output[-4000:]
    assert "checkpoint global_step8 is damaged (" in output and "resuming from global_step6 (step 6)" in output
    assert [e["tag"] for e in events(run_dir, "resume")][-1:] == ["global_step6"]
    assert ("roformer pretrain: not restarting: the same error twice at step 9 (killed by SIGKILL): a deterministic "
            "fault (a bug, a bad batch, a config error) is not retried") in output, output[-4000:]
    records = read_restarts(RunDir(run_dir))
    assert [(r.action, r.failed_at_step, r.restarted_from_step, r.restarted_from_tag) for r in records] == \
        [("restart", 9, 6, "global_step6"), ("gave up", 9, 8, "global_step8")]
    assert "restart 2/3" not in output
