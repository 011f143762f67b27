"""What one rank starts from (launcher/train/rank.py step 1, check_inputs): the run as resolved (RunSetup) with this
rank's place, its run directory (checked, not created) and its own data streams."""
from __future__ import annotations

from dataclasses import dataclass

from data_pipeline import PretrainBatches
from launcher.checkpoint.resume import BranchPoint, ScannedCheckpoints
from launcher.config.run_config import RunConfig
from launcher.resolved.run_setup import RunSetup
from launcher.run_dir.layout import RunDir


@dataclass(frozen=True)
class RankSetup:
    """Everything a rank starts from, resolved and checked once (step 1): nothing is written and no process group
    exists yet. The steps after it (the resume plan, the engine, the trainer) read it and never re-read a file."""

    run: RunSetup
    """The typed config, the stages at this world size with each one's DeepSpeed config, the run's shape and the
    init_from directory as read (launcher/resolved/run_setup.py; `roformer plan` and --dry-run resolve the same)."""
    rank: int
    run_dir: RunDir
    """Checked, not created (the rank entry creates and holds it: lock.held_run_dir)."""
    train_batches: PretrainBatches
    """This rank's training stream (data checked: launcher/inputs/run_checks.py)."""
    valid_batches: PretrainBatches
    branch_point: BranchPoint | None = None
    """The branch point of `branch_from`, checked with the inputs (None: no branch, or one already started)."""
    own_checkpoints: ScannedCheckpoints | None = None
    """A branch's own checkpoints as the input checks scanned them (rank 0's `decide` reuses the scan)."""

    @property
    def cfg(self) -> RunConfig:
        return self.run.cfg

    @property
    def world_size(self) -> int:
        return self.run.world_size
