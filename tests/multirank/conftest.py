"""Fixtures of tests/multirank that more than one module reads (the session's fp32 run is tests/conftest.py's
trainer_run).

fp16_stopped_run: ONE real 2-rank fp16 run (the shipped v100_fp16_zero2.json with torch's AdamW and a loss
scale that overflows at once and grows every 2 good steps) stopped by SIGTERM at step 7, with the plots its
stop rendered. tests/multirank/test_fp16.py resumes a copy of it; test_report_multirank.py reads its report.
"""
from __future__ import annotations

import time

import pytest

from launcher.report.hook import LOG_NAME
from launcher.run_dir.layout import RunDir
from tests.support.fp16_cpu import fp16_rank_env
from tests.support.helpers import TEST_RANK_ENTRY, events, start_run, tiny_run_config

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
