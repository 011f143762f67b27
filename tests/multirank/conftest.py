"""Fixtures of tests/multirank that more than one module reads (the session's fp32 run is tests/conftest.py's
trainer_run).

fp16_stopped_run: ONE real 2-rank fp16 run (the shipped v100_fp16_zero2.json with torch's AdamW and a loss
scale that overflows at once and grows every 2 good steps) stopped by SIGTERM at step 7, with the plots its
stop rendered. tests/multirank/test_fp16.py resumes a copy of it; test_report_multirank.py reads its report.

one_rank_resume: a copy of the session's 2-rank trainer_run trimmed to its global_step10 and resumed on ONE rank
(through the universal checkpoint) to the end of the schedule: test_resume.py checks the schedule and loss curve
across the change of world size, test_export.py the export of the resumed run.

poisoned_rewind_run: ONE real 2-rank ZeRO-2 run whose steps 7 and 8 carry a poisoned stretch of data, rewound by the
guard, reporting to the session's `mlflow_server`: test_guard.py (b) checks the rewind and the weights,
test_trackers.py (b) the redone steps in MLflow.
"""
from __future__ import annotations

import time

import pytest

from launcher.report.hook import LOG_NAME
from launcher.run_dir.layout import RunDir
from tests.support.fp16_cpu import fp16_rank_env
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, events, run_to_end, start_run, tiny_run_config, \
    trimmed_copy

FP16_OVERRIDES = {"optimizer": {"params": {"torch_adam": True}},
                  "fp16": {"initial_scale_power": 24, "loss_scale_window": 2, "hysteresis": 1}}
FP16_STOP_AT_STEP = 7
RENDER_SECONDS = 180


@pytest.fixture(scope="session")
def fp16_stopped_run(tmp_path_factory, tiny_data):
    """(config, run dir) of the stopped fp16 run; its log is RUN_DIR/../run.log. Read-only: copy it
    before resuming. Returned once the render its stop started has finished (its line in
    plots/render.log), so a copy never catches a plot half-written."""
    root = tmp_path_factory.mktemp("fp16_stopped")
    config = tiny_run_config(root, tiny_data, ds_config="v100_fp16_zero2.json",
                             deepspeed={"overrides": FP16_OVERRIDES}, logging={"plots": True})
    run_dir = root / "run"
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY,
                     ROFORMER_TEST_SIGTERM_LAUNCHER_AT=str(FP16_STOP_AT_STEP), **fp16_rank_env())
    assert proc.wait(timeout=300) != 0, (root / "run.log").read_text()[-4000:]
    (stopped,) = events(run_dir, "stopped")
    log = RunDir(run_dir).plots / LOG_NAME
    deadline = time.time() + RENDER_SECONDS  # the render started at the stop outlives the run
    while not (log.is_file() and f"plots of step {stopped['step']} (stopped)" in log.read_text()):
        assert time.time() < deadline, log.read_text() if log.is_file() else f"{log}: never written"
        time.sleep(1)
    return config, run_dir


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` (tests/support/mlflow_server.py) for the multirank tests, up for the whole session
    (test_trackers.py's run resumed without a server points at a port nothing listens on instead)."""
    pytest.importorskip("mlflow")
    from tests.support.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


REWIND_EXPERIMENT = "rewind"
"""The MLflow experiment poisoned_rewind_run reports to."""


@pytest.fixture(scope="session")
def poisoned_rewind_run(tmp_path_factory, tiny_data, mlflow_server):
    """(config, run dir) of the run: one flat 12-step stage, no dropout, a checkpoint every 3 steps (keep_last 2),
    a guard over 3 steps (patience 2, spike x1.5) that rewinds skipping 2 batches; global sequences 48-63 (steps 7
    and 8) poisoned (tests/support/rank_wrapper.py), so it rewinds to step 6 and redoes 7-12 as attempt 1; its live
    weights saved at the end (reference.safetensors). Reports to MLflow (REWIND_EXPERIMENT). Read-only."""
    root = tmp_path_factory.mktemp("poisoned_rewind")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT,
                             stages=[{"name": "flat", "max_seq_len": 32, "global_batch_size": 8, "steps": 12}],
                             checkpoint={"every_steps": 3, "keep_last": 2},
                             logging={"report_to": ["tensorboard", "mlflow"]},
                             guard={"window": 3, "patience": 2, "spike_factor": 1.5, "action": "rewind",
                                    "skip_batches": 2})
    run_dir = root / "run"
    run_to_end(2, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_POISON_SEQUENCES="48:16",
               ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1", MLFLOW_TRACKING_URI=mlflow_server.uri,
               MLFLOW_EXPERIMENT_NAME=REWIND_EXPERIMENT)
    return config, run_dir


RESUMED_FROM = "global_step10"
"""The checkpoint of trainer_run one_rank_resume resumes from (the start of the third stage)."""


@pytest.fixture(scope="session")
def one_rank_resume(tmp_path_factory, tiny_data, trainer_run):
    """(config, run dir): trainer_run copied without its checkpoints after RESUMED_FROM, then the same config on ONE
    rank with its live weights saved at the end (reference.safetensors). DeepSpeed refuses a ZeRO checkpoint at
    another data-parallel size, so the rank converts RESUMED_FROM to a universal checkpoint first. Read-only."""
    root = tmp_path_factory.mktemp("one_rank_resume")
    run_dir = trimmed_copy(trainer_run, root / "run", int(RESUMED_FROM.removeprefix("global_step")))
    # trainer_run's training and noise measurement (without its plots)
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, logging={"noise_every": 3})
    run_to_end(1, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    return config, run_dir
