"""Start a checkpoint's stage-end evals as a detached job (launcher.downstream.stage_evals, a separate
process, so the trainer never imports the fine-tuning code; its specs were checked at start-up by
launcher.config.stage_end_evals.check_eval_specs).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.checkpoint.catalogue import read_sidecar
from launcher.config.stage_end_evals import STAGE_EVALS_MODULE, eval_args
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import files_in_effect


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


def snapshot_checkpoint(run_dir: RunDir, tag: str) -> Path:
    """Hard links to the checkpoint's files (instant, no copy) in a run-dir-shaped folder under
    RUN_DIR/evals/: the eval job reads those, so the trainer's retention may delete the original
    while the job is queued or running. Returns the snapshot's run directory."""
    snapshot = RunDir(run_dir.evals / f".snapshot-{tag}" / run_dir.root.name)
    shutil.rmtree(snapshot.root.parent, ignore_errors=True)
    snapshot.checkpoint(tag).mkdir(parents=True)
    for path in run_dir.checkpoint(tag).iterdir():
        if path.is_file():
            _link_or_copy(path, snapshot.checkpoint(tag) / path.name)
    in_effect = files_in_effect(run_dir, read_sidecar(run_dir.checkpoint(tag)).step)  # the run's config versions
    for source, dest in ((in_effect["config"], snapshot.config), (in_effect["stages"], snapshot.stages)):
        if source.is_file():
            shutil.copy2(source, dest)
    return snapshot.root


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, dest)
