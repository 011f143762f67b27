"""Start a checkpoint's stage-end evals as a detached job (launcher.downstream.stage_evals, a separate
process, so the trainer never imports the fine-tuning code; its specs were checked at start-up by
launcher.config.stage_end_evals.check_eval_specs).
"""
from __future__ import annotations

import os
import subprocess
import sys

from launcher.checkpoint.weights import snapshot_checkpoint
from launcher.config.stage_end_evals import STAGE_EVALS_MODULE, eval_args
from launcher.run_dir.layout import RunDir


def start_stage_end_job(run_dir: RunDir, tag: str, stage_name: str, specs: list[str]) -> subprocess.Popen:
    """Start the evals of checkpoint `tag` in a detached process (own session, output to
    RUN_DIR/evals/<tag>.log) and return at once."""
    run_dir.evals.mkdir(parents=True, exist_ok=True)
    snapshot = snapshot_checkpoint(run_dir, tag)
    cmd = [sys.executable, "-m", STAGE_EVALS_MODULE, "--run-dir", str(run_dir.root), "--snapshot", str(snapshot),
           "--tag", tag, "--stage", stage_name, *eval_args(specs)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(run_dir.evals / f"{tag}.log", "ab") as log:
        # Own session: a Ctrl-C or a signal to the training job's process group does not reach it.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
