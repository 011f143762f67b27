"""A branch (`branch_from: RUN_DIR:TAG`) of the session's `trainer_run` (2 ranks, ZeRO-2, fp32, no dropout) with
the same schedule continues exactly as the source itself did: the same losses for the steps after the
branch point. The branch runs on ONE rank, so its checkpoint goes through the universal conversion, which
must be written into the branch's run directory: the source is only read (every file byte-identical
afterwards). One run of 4 steps; the bad inputs are unit tests (tests/unit/test_branch_from.py). Loading
the source's own files directly (same shape) is the code path of every resume (tests/multirank/test_resume.py)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from launcher.run_dir.layout import RunDir
from launcher.export.exporter import export_checkpoint
from launcher.run_dir.records import describe_start, read_branch_record, read_versions
from tests.support.helpers import TINY_TOTAL_STEPS, events, run_to_end, train_losses

BRANCH_TAG, BRANCH_STEP = "global_step12", 12


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_branch_continues_like_the_source_and_only_reads_it(trainer_run, tmp_path):
    before = _tree_digest(trainer_run)
    config = trainer_run.parent / "run.yaml"  # the source's own config: the schedules agree
    branch = tmp_path / "branch"
    run_to_end(1, config, branch, extra_args=["--set", f"branch_from={trainer_run}:{BRANCH_TAG}",
                                              "--set", "logging.plots=false"])

    assert _tree_digest(trainer_run) == before  # the source: only read, not locked, nothing converted into it
    assert (branch / "universal" / BRANCH_TAG / "zero").is_dir()  # 2 ranks -> 1: converted, into the branch
    source, mine = train_losses(trainer_run), train_losses(branch)
    assert sorted(mine) == list(range(BRANCH_STEP + 1, TINY_TOTAL_STEPS + 1))
    for step, loss in mine.items():
        assert abs(loss - source[step]) <= 1e-6, (step, loss, source[step])
    (resume,) = events(branch, "resume")
    assert resume["tag"] == BRANCH_TAG and resume["step"] == BRANCH_STEP and resume["from_world_size"] == 2

    record = read_branch_record(RunDir(branch))
    sidecar = trainer_run / "checkpoints" / BRANCH_TAG / "sidecar.json"
    assert record["source_run_dir"] == str(trainer_run.resolve()) and record["tag"] == BRANCH_TAG
    assert record["step"] == BRANCH_STEP and record["sidecar_sha256"] == hashlib.sha256(sidecar.read_bytes()).hexdigest()
    (version,) = read_versions(RunDir(branch))
    assert version.from_step == BRANCH_STEP and version.resumed_from == f"{trainer_run.resolve()}:{BRANCH_TAG}"
    assert json.loads((branch / "stages.json").read_text())["stages"][-1]["name"] == "wide"
    started = f"a branch of {trainer_run.resolve()} at {BRANCH_TAG} (step {BRANCH_STEP}"
    assert describe_start(RunDir(branch)).startswith(started)  # the report's and the model card's "started from"
    card = (export_checkpoint(branch, tmp_path / "export", verify=False) / "README.md").read_text()
    assert f"| started from | {started}" in card
