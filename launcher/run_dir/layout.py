"""The run directory's layout: every file and folder name of RUN_DIR, defined here and nowhere else.

    RUN_DIR/
      config.yaml                 resolved run config (absolute paths), written before the first step
      stages.json                 the stages at the run's world size (batch arithmetic)
      ds_config.resolved.json     the DeepSpeed config the engine started with
      config.N.yaml, stages.N.json, ds_config.resolved.N.json
                                  version N of one of those, written by an accepted resume whose
                                  config differs (the originals are never replaced); listed with the
                                  step each took effect at in config_versions.json (launcher/run_dir/records.py)
      metrics.jsonl, tb/          rank-0 metrics (tb/evals: stage-end eval scalars)
      checkpoints/<tag>/          DeepSpeed's files, rng_rank<r>.pt, sidecar.json (written last); .save.json
                                  (written first: a save of this run started here; only such folders are
                                  ever pruned or set aside: launcher/checkpoint/catalogue.py)
      checkpoints/latest          the newest complete tag
      checkpoints/damaged/<tag>-<time>/  a checkpoint that failed verification, set aside (never pruned)
      universal/<tag>/            ds_to_universal output when resuming at another world size
      evals/, exports/<tag>/      stage-end eval reports and their exports
      plots/, report.md           PNGs rendered at every stage end and by `roformer report` (+ its page)
      heartbeats/rank<r>.json     rank r's progress (phase, step, its bound); rank<r>.guard.json: what
                                  its rank guard sees (process state, network); the hang watchdog's input
      .deepspeed_env, launch/     what `roformer pretrain` gave the ranks (env file, hostfile copy)
      logs/launcher.log           everything the job printed, appended by each `roformer pretrain`
      logs/rank<r>.log            what rank r wrote after its console went away (pdsh killed, ssh gone:
                                  launcher/common/io.py keep_console); absent while the console is there
      restarts.json               every restart `roformer pretrain --max-restarts` made, and why (launcher/run_dir/restart_records.py)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TAG_PREFIX = "global_step"
SIDECAR_NAME = "sidecar.json"
SAVE_RECORD_NAME = ".save.json"
DAMAGED_DIR = "damaged"
ENV_FILE_NAME = ".deepspeed_env"
RENDER_LOCK = ".render.lock"
"""In plots/: the lock renders of the plots take turns on (launcher/report/hook.py); left there, it marks
the folder as ours."""


def tag_for_step(step: int) -> str:
    """Checkpoint tag after `step` optimizer steps (DeepSpeed's own naming)."""
    return f"{TAG_PREFIX}{step}"


def step_of_tag(tag: str) -> int | None:
    number = tag[len(TAG_PREFIX):]
    return int(number) if tag.startswith(TAG_PREFIX) and number.isdigit() else None


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (nothing is created here)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def stages(self) -> Path:
        return self.root / "stages.json"

    @property
    def ds_config(self) -> Path:
        return self.root / "ds_config.resolved.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def eval_tensorboard(self) -> Path:
        return self.tensorboard / "evals"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest(self) -> Path:
        return self.checkpoints / "latest"

    @property
    def damaged(self) -> Path:
        return self.checkpoints / DAMAGED_DIR

    @property
    def config_versions(self) -> Path:
        return self.root / "config_versions.json"

    @property
    def restarts(self) -> Path:
        return self.root / "restarts.json"

    def checkpoint(self, tag: str) -> Path:
        return self.checkpoints / tag

    @property
    def universal(self) -> Path:
        return self.root / "universal"

    @property
    def evals(self) -> Path:
        return self.root / "evals"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    def export(self, tag: str) -> Path:
        return self.root / "exports" / tag

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / f"rank{rank}.json"

    def guard_status(self, rank: int) -> Path:
        return self.heartbeats / f"rank{rank}.guard.json"

    @property
    def env_file(self) -> Path:
        return self.root / ENV_FILE_NAME

    @property
    def hostfile_copy(self) -> Path:
        return self.root / "launch" / "hostfile"

    @property
    def launcher_log(self) -> Path:
        return self.root / "logs" / "launcher.log"

    def rank_log(self, rank: int) -> Path:
        return self.root / "logs" / f"rank{rank}.log"


def versioned(path: Path, version: int) -> Path:
    """Version `version` of a record file: config.yaml (1), config.2.yaml, ds_config.resolved.3.json."""
    if version == 1:
        return path
    stem, _, suffix = path.name.rpartition(".")
    return path.with_name(f"{stem}.{version}.{suffix}")


def sidecar_path(checkpoint_dir: Path) -> Path:
    return Path(checkpoint_dir) / SIDECAR_NAME


def save_record_path(checkpoint_dir: Path) -> Path:
    return Path(checkpoint_dir) / SAVE_RECORD_NAME


def rng_path(checkpoint_dir: Path, rank: int) -> Path:
    return Path(checkpoint_dir) / f"rng_rank{rank}.pt"
