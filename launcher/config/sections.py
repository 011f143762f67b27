"""The plain sections of a run config (launcher/config/run_config.py parses the file into them): `data`,
`optimizer`, `schedule`, `checkpoint`, `logging` and `deepspeed`, each field documented where it is declared."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from data_pipeline.documents import DocumentView
from data_pipeline.masking import MaskingConfig
from launcher.config.schedule import (BATCH_SCALINGS, DECAY_SHAPES, Piece, Stage, piece_at, stage_index_at,
                                      tokens_before)
from data_pipeline.remote.client import RemoteOptions
from data_pipeline.remote.url import is_remote, parse_size


DECAY_KINDS = ("linear", "cosine", "constant", "wsd")
REMOTE_KEYS = ("cache_dir", "cache_limit", "remote_retries", "remote_timeout")


@dataclass
class DataSection:
    data_dir: str = ""
    """Prepared data directory (`roformer data prepare --out DIR`): manifest, tokenizer, train/ and valid/;
    or an s3://BUCKET/PREFIX location of one, read through the node-local cache (docs/data_format.md)."""
    seed: int = 1234
    """Seed of the data order and the masking; the global stream depends on it, not on the world size."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    """MLM corruption (`data_pipeline.MaskingConfig`; the YAML mapping holds its fields, empty = defaults)."""
    verify: bool = True
    """Check the manifest checksums and tokenizer hash when opening the corpus."""
    order: str = "global"
    """'global': every epoch a permutation of all documents (needs a cache that holds the whole corpus when
    data_dir is remote); 'shard_window': documents shuffled within windows of `shard_window` shards, the
    windows in a seeded order (a cache of two windows is enough)."""
    shard_window: int = 8
    """Shards per window of the shard_window order."""
    attention: str = "sequence"
    """'sequence': a token attends to its whole packed sequence, across the [SEP]s (BERT's FULL-SENTENCES);
    'document': only to its own document (data_pipeline/documents.py; docs/training.md)."""
    positions: str = "sequence"
    """'sequence': positions count from the sequence's [CLS]; 'document': they restart at each document."""
    cache_dir: str = ""
    """s3:// data only: the node-local cache ('' = ~/.cache/roformer-ds/remote), shared by a node's ranks."""
    cache_limit: str = ""
    """s3:// data only: bytes the cache may hold, e.g. 2GB or 512MiB ('' or 0 = no limit)."""
    remote_retries: int = 5
    """s3:// data only: retries of a request that timed out, could not connect or got a 5xx answer."""
    remote_timeout: float = 30.0
    """s3:// data only: seconds to connect and between bytes of an answer before a request is retried."""

    @property
    def document_view(self) -> DocumentView:
        """What the batches carry about their documents (attention, positions)."""
        return DocumentView(self.attention, self.positions)

    @property
    def is_remote(self) -> bool:
        return is_remote(self.data_dir)

    @property
    def cache_limit_bytes(self) -> int:
        return parse_size(self.cache_limit or 0, "data.cache_limit")

    def remote_options(self):
        """The data_pipeline.remote.client.RemoteOptions of these settings."""
        return RemoteOptions(cache_dir=self.cache_dir, cache_limit=self.cache_limit_bytes,
                             retries=self.remote_retries, timeout=self.remote_timeout)


@dataclass
class OptimizerSection:
    lr: float = 5e-4
    """Peak learning rate (reached at the end of warmup), before the stage's lr_scale."""
    warmup_steps: int = 100
    """Linear warmup from 0 over this many optimizer steps, counted from the start of the run."""
    decay: str = "linear"
    """Decay after warmup over the remaining steps of the whole run: 'linear', 'cosine' or 'constant';
    'wsd' (warmup-stable-decay): flat at lr after warmup, then down to lr * min_lr_ratio over the last
    decay_steps steps, the last step of the run at exactly that floor (launcher/config/schedule.py)."""
    min_lr_ratio: float = 0.0
    """The decay ends at lr * min_lr_ratio."""
    decay_steps: int = 0
    """decay 'wsd' only: steps of the decay window at the end of the run (0 = the last stage's steps)."""
    decay_shape: str = ""
    """decay 'wsd' only: 'linear', 'cosine' or '1-sqrt' ('' = 1-sqrt, as ModernBERT)."""
    warmup_tokens: str = ""
    """warmup_steps in tokens ("2B", 3e9; '' = warmup_steps): the warmup ends at the first step whose token
    slots from the start of the run reach it. Resolved at load into warmup_steps, which the run records."""
    decay_tokens: str = ""
    """decay 'wsd' only: decay_steps in tokens: the window starts at the first step whose token slots reach the
    run's total minus this. Resolved at load into decay_steps."""
    batch_scaling: str = "none"
    """'none', 'linear' or 'sqrt': the LR curve's value times (the step's global batch / reference_batch) ** p,
    p = 1 or 1/2, at every step (batch ramps and stage boundaries alike)."""
    reference_batch: int = 0
    """The global batch at which the LR is the curve's value (required when batch_scaling is on)."""

    def check(self, fail: Callable[[str, str], None], given: dict) -> None:
        """fail(field, message) for the first bad value (fields named as optimizer.<field>). given: the section as
        written (after --set), for reference_batch, whose default 0 means 'not set'."""
        if not self.lr > 0:
            fail("optimizer.lr", f"must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            fail("optimizer.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if self.decay not in DECAY_KINDS:
            fail("optimizer.decay", f"must be one of {', '.join(DECAY_KINDS)}, got {self.decay!r}")
        if self.decay != "wsd":
            for key, unset in (("decay_steps", 0), ("decay_shape", "")):
                if getattr(self, key) != unset:
                    fail(f"optimizer.{key}", f"only applies to optimizer.decay: wsd (decay is {self.decay!r})")
        if self.decay_steps < 0:
            fail("optimizer.decay_steps", f"must be >= 1 (or 0 = the last stage's steps), got {self.decay_steps}")
        if self.decay_shape and self.decay_shape not in DECAY_SHAPES:
            fail("optimizer.decay_shape", f"must be one of {', '.join(DECAY_SHAPES)}, got {self.decay_shape!r}")
        if self.batch_scaling not in BATCH_SCALINGS:
            fail("optimizer.batch_scaling", f"must be one of {', '.join(BATCH_SCALINGS)}, got {self.batch_scaling!r}")
        if self.reference_batch < 0 or (self.reference_batch == 0 and "reference_batch" in given):
            fail("optimizer.reference_batch", f"must be a positive global batch, got {self.reference_batch}")
        if self.batch_scaling == "none" and self.reference_batch:  # as decay_steps without wsd: it would do nothing
            fail("optimizer.reference_batch", "only applies with optimizer.batch_scaling linear or sqrt (it is "
                 "'none'): drop it, or set batch_scaling")
        if self.batch_scaling != "none" and not self.reference_batch:
            fail("optimizer.reference_batch", f"required when optimizer.batch_scaling is {self.batch_scaling!r} (the "
                 f"global batch at which the LR is optimizer.lr)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            fail("optimizer.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class ScheduleSection:
    file: str = ""
    """Schedule YAML/JSON (launcher/schedules/): the stages, each max_seq_len / global_batch_size / steps."""
    max_tokens_per_micro_batch: int = 0
    """Memory budget for stages without an explicit micro_batch_size: the micro-batch is the largest
    divisor of global_batch_size / world_size with micro x max_seq_len <= this. 0 = stages must say."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer's activations in backward instead of keeping them: only the layers'
    inputs stay in memory (`roformer plan` shows both estimates), for about one more forward of compute
    per step. The losses are unchanged (the recompute draws the same dropout masks)."""
    stages: tuple[Stage, ...] = field(default=(), init=False)
    """The stages of `file`, read at load (not a YAML key)."""
    pieces: tuple[Piece, ...] = field(default=(), init=False)
    """The stages' constant-batch pieces in step order (launcher/config/schedule.py schedule_pieces): one per
    stage without a batch ramp."""

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (the same at every world size)."""
        return sum(stage.steps for stage in self.stages)

    def stage_for_step(self, step: int) -> tuple[int, int]:
        """(stage index, step within that stage) of global step `step` (0-based)."""
        return stage_index_at([stage.steps for stage in self.stages], step)

    def global_batch_at(self, step: int) -> int:
        """The global batch of step `step` (0-based; a ramp's piece, else its stage's)."""
        return piece_at(self.pieces, step).global_batch_size

    def tokens_before(self, step: int) -> int:
        """Token slots (global batch x max_seq_len per step) of the first `step` steps."""
        return tokens_before(self.pieces, step)

    @property
    def in_tokens(self) -> bool:
        """Whether the schedule is written in tokens: a stage's length (`tokens:`) or a batch ramp's `over:`. The
        console, the run's stages.json (`schedule_unit`) and the report then count tokens where they counted steps."""
        return any(stage.tokens is not None or (stage.ramp is not None and stage.ramp.unit == "tokens")
                   for stage in self.stages)


@dataclass
class CheckpointSection:
    every_steps: int = 0
    """Save every N optimizer steps (0 = only at stage ends and the end of the run)."""
    every_tokens: str = ""
    """every_steps in tokens ("500M"; '' = every_steps): N = the steps from the start of the run whose token
    slots reach it (fixed at load; under a batch ramp the interval stays N steps). Resolved into every_steps."""
    keep_last: int = 3
    """Keep this many complete checkpoints; older ones are deleted after a new one is complete."""


@dataclass
class LoggingSection:
    log_every: int = 1
    """Write TensorBoard scalars every N steps (metrics.jsonl gets every step)."""
    valid_every: int = 0
    """Validate on held-out shards every N steps and at every stage end (0 = stage ends only)."""
    valid_batches: int = 2
    """Micro-batches per rank in one validation pass (at the current stage's length and micro-batch)."""
    progress_bar: bool = True
    """Show rank 0's progress (step, stage, loss, speed, stage and run ETA) on the console: a status line
    when `roformer pretrain` writes to a terminal, else a plain line every `progress_every` steps."""
    progress_every: int = 0
    """Steps between plain progress lines when the output is not a terminal (0 = about 20 per run)."""
    plots: bool = True
    """Keep RUN_DIR/plots/ current from the run itself (a background render at every stage end and at
    the end). false: none while training (each render costs a few CPU-seconds beside the ranks);
    `roformer report RUN_DIR` draws them whenever asked."""
    noise_every: int = 100
    """Measure the gradient noise scale (the critical batch, launcher/train/noise_scale.py) every N steps: one
    extra forward and backward of a micro-batch each time (0 = off). With one micro-batch per step (the worst
    case) a measurement cost 0.87 steps on a quiet machine, so N >= 44 keeps it within 2% of training time and 100
    at 0.9% (bench/results/noise_scale.json). metrics.jsonl: grad_noise_scale, grad_sq_norm, grad_noise_trace."""
    peak_tflops: float = 0.0
    """Peak TFLOP/s of one rank's device that MFU is measured against (0 = from the table of known
    accelerators in launcher/common/mfu.py, or measured by a timed matmul at start-up on CPU)."""
    stage_end_evals: list = field(default_factory=list)
    """Evals run in the background on each stage-end checkpoint (`mlm` or a task name with optional
    `:field=value` fine-tune options; launcher/stage_evals/job.py). Empty = none."""
    report_to: list = field(default_factory=lambda: ["tensorboard"])
    """Where rank 0's records go besides metrics.jsonl: any of tensorboard, mlflow, wandb, or [none]
    (`roformer pretrain --report-to`; launcher/tracking/, docs/training.md#trackers)."""


@dataclass
class DeepSpeedSection:
    config: str = ""
    """DeepSpeed JSON (ds_configs/) without batch sizes: they are resolved from the schedule."""
    overrides: dict = field(default_factory=dict)
    """Deep-merged into that JSON (e.g. {fp16: {initial_scale_power: 8}}); keys still checked."""
