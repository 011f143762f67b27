"""The stages of a run at a world size: each stage's micro-batch and grad-accum, resolved once.

For every stage: global_batch_size = micro_batch_size x grad_accum_steps x world_size (data
parallel only). Every check runs before any process trains and names the stage that fails.

A stage with a batch ramp resolves to one entry per constant-batch piece (`piece` k of `pieces`, the same
`index`, name and data settings), so every entry has one batch; what belongs to the stage as a whole (its
end: validation, the stage-end checkpoint and jobs; its span) is `stage_first_step` / `stage_end_step`.

`micro_batch_size: auto` (per stage): the largest micro-batch that divides the per-rank batch and whose planned
memory (launcher/pricing/estimate.py) fits AUTO_MICRO_HEADROOM of the target device's memory. The caller hands
the target over as a small value (MicroBatchTarget, built by launcher/resolved/run_stages.py: `hardware.device`
when declared, else the resolving machine's accelerator), so `roformer plan`, the dry run and every rank size a
declared target alike; a target without memory (a CPU machine) falls back to schedule.max_tokens_per_micro_batch's
rule, and the plan says so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from data_pipeline.documents import DocumentView
from launcher.config.run_config import RunConfig
from launcher.config.schedule import AUTO_MICRO, Mixture, Stage, format_tokens
from launcher.common.errors import UserError

AUTO_MICRO_HEADROOM = 0.85
"""`micro_batch_size: auto` plans into this share of the target device's memory (the rest: allocator
fragmentation and what the estimate leaves out; the plan was within 0.93 of the measured peak on an H200)."""


class MemoryPlan(Protocol):
    """Planned memory per rank of this run at a stage's shape (launcher/resolved/run_stages.py implements it:
    launcher.config does not import the pricing)."""

    def largest_micro_batch(self, seq_len: int, budget_bytes: int) -> int:
        """The largest micro-batch whose planned memory fits `budget_bytes` (0: not even one sequence)."""

    def planned_bytes(self, micro_batch: int, seq_len: int) -> int:
        """Planned memory per rank of one micro-batch of `seq_len`."""


@dataclass(frozen=True)
class MicroBatchTarget:
    """The device `micro_batch_size: auto` sizes against."""

    label: str
    """What it is and where it came from, e.g. '16 GiB V100 (hardware.device)', 'this machine: cpu'."""
    device_bytes: int = 0
    """Memory per device; 0 = no accelerator (a CPU rank): the schedule.max_tokens_per_micro_batch rule."""
    plan: MemoryPlan | None = field(default=None, compare=False)
    """The run's memory plan (None with device_bytes 0)."""


@dataclass(frozen=True)
class ResolvedStage:
    index: int
    """0-based position in the schedule."""
    name: str
    max_seq_len: int
    global_batch_size: int
    micro_batch_size: int
    """Sequences per rank per forward/backward."""
    grad_accum_steps: int
    """Micro-batches per rank per optimizer step."""
    steps: int
    first_step: int
    """Global step at which this stage starts (0-based)."""
    lr_scale: float
    rope_theta: float | None = None
    """RoPE base in force during this stage (the stage's, else the model config's); None for models
    without RoPE."""
    mask_prob: float = 0.15
    """Share of tokens chosen for MLM in force during this stage (the stage's, else data.masking.mask_prob)."""
    mixture: Mixture | None = None
    """(source, share) pairs of this stage's sequences, shares summing to 1; None = sources by their size."""
    piece: int = 0
    """0-based position of this entry in its stage's batch ramp (0 without a ramp)."""
    pieces: int = 1
    """Entries of this stage (its ramp's batches; 1 without a ramp)."""
    stage_first_step: int = -1
    """Global step at which the whole stage starts (-1 = first_step: a stage of one piece)."""
    stage_steps: int = 0
    """Steps of the whole stage (0 = steps: a stage of one piece)."""
    attention: str = "sequence"
    """data.attention in force during this stage (the stage's `attention`, else the run config's)."""
    positions: str = "sequence"
    """data.positions in force during this stage (the stage's `positions`, else the run config's)."""
    micro_batch_note: str = field(default="", compare=False)
    """Why this micro-batch, for `micro_batch_size: auto` ('auto: largest fitting ...'); not in stages.json."""

    def __post_init__(self):
        if self.stage_first_step < 0:
            object.__setattr__(self, "stage_first_step", self.first_step)
        if not self.stage_steps:
            object.__setattr__(self, "stage_steps", self.steps)

    @property
    def end_step(self) -> int:
        """Where this entry (a ramp's piece, else the stage) ends."""
        return self.first_step + self.steps

    @property
    def stage_end_step(self) -> int:
        """Where the whole stage ends (its stage-end validation, checkpoint and jobs run there)."""
        return self.stage_first_step + self.stage_steps

    @property
    def is_stage_end(self) -> bool:
        """This entry is the stage's last."""
        return self.piece == self.pieces - 1

    @property
    def label(self) -> str:
        """"'short'", or "'warmup' piece 2/15" for a ramp's piece."""
        return f"'{self.name}'" + ("" if self.pieces == 1 else f" piece {self.piece + 1}/{self.pieces}")

    @property
    def document_view(self) -> DocumentView:
        """What this stage's batches carry about their documents (data_pipeline/documents.py)."""
        return DocumentView(self.attention, self.positions)

    @property
    def mixture_dict(self) -> dict[str, float] | None:
        """The mixture as {source: share} in file order (the JSON form), None when the stage has none."""
        return None if self.mixture is None else dict(self.mixture)

    def to_dict(self) -> dict:
        """The stages.json row; the ramp fields only for a stage of several pieces (one-piece rows as before)."""
        out = {**asdict(self), "mixture": self.mixture_dict}
        out.pop("micro_batch_note")
        if self.pieces == 1:
            for key in ("piece", "pieces", "stage_first_step", "stage_steps"):
                out.pop(key)
        return out


def entry_at(stages: list[ResolvedStage], step: int) -> ResolvedStage:
    """The entry (a stage, or a ramp's piece) that trains global step `step`; the last at or past the end."""
    for s in stages:
        if step < s.end_step:
            return s
    return stages[-1]


def stage_ends(stages: list[ResolvedStage]) -> list[int]:
    """Each stage's end step by stage index (a ramp's pieces share their stage's): the trackers' stage ends
    (launcher/run_dir/records.py stage_ends reads the same from a run's stages.json rows)."""
    return list({s.index: s.stage_end_step for s in stages}.values())


def resolve_stages(run_config: RunConfig, world_size: int,
                   micro_target: MicroBatchTarget | None = None) -> list[ResolvedStage]:
    """Validate the schedule for `world_size` ranks and fix each stage's micro-batch and grad-accum.
    `micro_target`: the device that `micro_batch_size: auto` sizes against (launcher/resolved/run_stages.py);
    required when a stage says auto."""
    if not isinstance(world_size, int) or world_size < 1:
        raise UserError(f"world size must be a positive integer, got {world_size!r}")
    if micro_target is None and any(s.micro_batch_size == AUTO_MICRO for s in run_config.schedule.stages):
        raise ValueError("resolve_stages: a stage has micro_batch_size auto: pass micro_target "
                         "(launcher.resolved.run_stages.micro_batch_target)")
    model = run_config.model
    resolved, first = [], 0
    for index, stage in enumerate(run_config.schedule.stages):
        where = f"{run_config.schedule.file}: stage {index + 1} ({stage.name})"
        if model.position_encoding != "rope" and stage.max_seq_len > model.max_position_embeddings:
            raise UserError(f"{where}: max_seq_len {stage.max_seq_len} is longer than the model's "
                            f"{model.position_encoding} position table (model.max_position_embeddings = "
                            f"{model.max_position_embeddings})")
        if stage.rope_theta is not None and model.position_encoding != "rope":
            raise UserError(f"{where}: rope_theta needs a RoPE model (model.position_encoding is "
                            f"'{model.position_encoding}')")
        attention = stage.attention or run_config.data.attention
        if attention == "document" and model.attention != "softmax":
            raise UserError(f"{where}: attention 'document' needs model.attention 'softmax' ({model.attention!r} sums "
                            f"over the whole sequence)")
        theta = (stage.rope_theta if stage.rope_theta is not None else model.rope_theta) \
            if model.position_encoding == "rope" else None
        pieces = stage.pieces or ((stage.global_batch_size, stage.steps),)
        stage_first = first
        for k, (batch, steps) in enumerate(pieces):
            piece_where = where if len(pieces) == 1 else f"{where}, ramp batch {k + 1}/{len(pieces)}"
            micro, note = _micro_batch_size(replace(stage, global_batch_size=batch), world_size,
                                            run_config.schedule.max_tokens_per_micro_batch, piece_where, micro_target)
            resolved.append(ResolvedStage(index=index, name=stage.name, max_seq_len=stage.max_seq_len,
                                          global_batch_size=batch, micro_batch_size=micro,
                                          grad_accum_steps=batch // (micro * world_size),
                                          steps=steps, first_step=first, lr_scale=stage.lr_scale,
                                          rope_theta=theta, mask_prob=stage.mask_prob if stage.mask_prob is not None
                                          else run_config.data.masking.mask_prob, mixture=stage.mixture,
                                          piece=k, pieces=len(pieces), stage_first_step=stage_first,
                                          stage_steps=stage.steps, attention=attention,
                                          positions=stage.positions or run_config.data.positions,
                                          micro_batch_note=note))
            first += steps
    return resolved


def _micro_batch_size(stage: Stage, world_size: int, max_tokens: int, where: str,
                      target: MicroBatchTarget | None = None) -> tuple[int, str]:
    """(micro-batch, why: '' unless auto)."""
    if stage.global_batch_size % world_size:
        raise UserError(f"{where}: global_batch_size {stage.global_batch_size} is not divisible by the "
                        f"world size {world_size}")
    per_rank = stage.global_batch_size // world_size
    if stage.micro_batch_size == AUTO_MICRO:
        if target.device_bytes and target.plan is not None:
            return _auto_micro_batch(stage, per_rank, target, where)
        if max_tokens <= 0:
            raise UserError(f"{where}: micro_batch_size auto on {target.label} (no accelerator memory to plan "
                            f"against) needs schedule.max_tokens_per_micro_batch > 0, or declare hardware.device")
        micro, _ = _micro_batch_size(replace(stage, micro_batch_size=None), world_size, max_tokens, where)
        return micro, (f"auto: {target.label} has no accelerator memory to plan against: "
                       f"schedule.max_tokens_per_micro_batch {max_tokens}'s rule (declare hardware.device to size it)")
    if stage.micro_batch_size is not None:
        if per_rank % stage.micro_batch_size:
            raise UserError(f"{where}: global_batch_size {stage.global_batch_size} is not divisible by "
                            f"micro_batch_size {stage.micro_batch_size} x world size {world_size}")
        return stage.micro_batch_size, ""
    if max_tokens <= 0:
        raise UserError(f"{where}: micro_batch_size is not set and schedule.max_tokens_per_micro_batch is 0; "
                        f"set one of them")
    fitting = [d for d in range(1, per_rank + 1) if per_rank % d == 0 and d * stage.max_seq_len <= max_tokens]
    if not fitting:
        raise UserError(f"{where}: one sequence of max_seq_len {stage.max_seq_len} does not fit "
                        f"schedule.max_tokens_per_micro_batch {max_tokens}")
    return max(fitting), ""


def _auto_micro_batch(stage: Stage, per_rank: int, target: MicroBatchTarget, where: str) -> tuple[int, str]:
    """The largest divisor of the per-rank batch whose planned memory fits AUTO_MICRO_HEADROOM of the target."""
    budget = int(AUTO_MICRO_HEADROOM * target.device_bytes)
    largest = target.plan.largest_micro_batch(stage.max_seq_len, budget)
    share = f"{AUTO_MICRO_HEADROOM:.0%} of {target.label}"
    if largest < 1:
        one = target.plan.planned_bytes(1, stage.max_seq_len)
        raise UserError(f"{where}: micro_batch_size auto: not even one sequence of max_seq_len {stage.max_seq_len} "
                        f"fits {share} ({_gib(budget)}): one plans {_gib(one)}; shorten the stage, turn on "
                        f"schedule.activation_checkpointing or use more ranks / a larger ZeRO stage")
    micro = max(d for d in range(1, min(largest, per_rank) + 1) if per_rank % d == 0)
    return micro, f"auto: largest fitting {share}: {_gib(target.plan.planned_bytes(micro, stage.max_seq_len))} planned"


def _gib(count: int) -> str:
    return f"{count / 2 ** 30:.1f} GiB"


def format_plan(stages: list[ResolvedStage], world_size: int, cfg: RunConfig | None = None) -> str:
    """The stages as a table (`roformer plan`, `roformer pretrain --dry-run`): one row per stage (a ramp's batches
    as a range), its token slots; with the run config `cfg` also each stage's LR range, the token counts the
    schedule asked for and their rounding, each ramp's batches and the schedule's warnings."""
    header = f"{'#':>2}  {'stage':<16}{'max_len':>8}{'global':>12}{'micro':>7}{'accum':>7}{'steps':>9}{'first':>9}" \
             f"{'tokens':>9}{'lr_scale':>9}" + (f"{'lr':>20}" if cfg is not None else "")
    rows = [f"plan for world size {world_size}: global batch = micro x accum x {world_size}", header]
    for entries in _by_stage(stages):
        s, last = entries[0], entries[-1]
        batch = _span(e.global_batch_size for e in entries)
        tokens = sum(e.steps * e.global_batch_size * e.max_seq_len for e in entries)
        lr = ""
        if cfg is not None:
            low, high = lr_range(cfg, s.stage_first_step, s.stage_end_step)
            lr = f"{low:.3g}-{high:.3g}" if f"{low:.3g}" != f"{high:.3g}" else f"{low:.3g}"
        rows.append(f"{s.index + 1:>2}  {s.name[:15]:<16}{s.max_seq_len:>8}{batch:>12}"
                    f"{_span(e.micro_batch_size for e in entries):>7}{_span(e.grad_accum_steps for e in entries):>7}"
                    f"{s.stage_steps:>9}{s.stage_first_step:>9}{format_tokens(tokens):>9}{s.lr_scale:>9g}"
                    + (f"{lr:>20}" if cfg is not None else ""))
        if len(entries) > 1:
            rows.append("    ramp: " + ", ".join(f"{e.global_batch_size} x {e.steps}" for e in entries)
                        + f" (batch x steps; from step {s.stage_first_step} to {last.end_step})")
    if cfg is not None:
        for index, stage in enumerate(cfg.schedule.stages):
            if stage.tokens is not None:
                got = sum(b * n for b, n in stage.pieces) * stage.max_seq_len
                rows.append(f"stage '{stage.name}' in tokens: asked {format_tokens(stage.tokens)} ({stage.tokens:,}), "
                            f"{stage.steps} steps train {got:,} ({got - stage.tokens:+,}, rounded to whole steps)")
    thetas = {s.rope_theta for s in stages}
    if len(thetas) > 1:  # a context-extension schedule: say which stage runs at which base
        rows.append("rope_theta per stage: " + ", ".join(f"{e[0].name} {e[0].rope_theta:g}" for e in _by_stage(stages)))
    if len({s.mask_prob for s in stages}) > 1:  # an annealed mask rate: which stage masks how much
        rows.append("mask_prob per stage: " + ", ".join(f"{e[0].name} {e[0].mask_prob:g}" for e in _by_stage(stages)))
    for key in ("attention", "positions"):  # document-aware packing in some stages, or others than data.<key>
        default = {getattr(cfg.data, key)} if cfg is not None else set()
        if len({getattr(s, key) for s in stages} | default) > 1:
            rows.append(f"{key} per stage: " + ", ".join(f"{e[0].name} {getattr(e[0], key)}" for e in _by_stage(stages)))
    for s in stages:  # micro_batch_size: auto: what it chose and why
        if s.micro_batch_note:
            rows.append(f"stage {s.label}: micro {s.micro_batch_size} ({s.micro_batch_note})")
    if any(s.mixture is not None for s in stages):
        rows.append("mixture per stage: " + "; ".join(f"{s.name} " + (
            "sources by size" if s.mixture is None else ", ".join(f"{source} {share:.3g}" for source, share in s.mixture))
            for s in (e[0] for e in _by_stage(stages))))
    tokens = sum(s.steps * s.global_batch_size * s.max_seq_len for s in stages)
    rows.append(f"total: {stages[-1].end_step} optimizer steps, {tokens:,} token slots")
    if cfg is not None:
        opt = cfg.optimizer
        if opt.batch_scaling != "none":
            rows.append(f"lr: the curve x (global batch / {opt.reference_batch}) ** "
                        f"{'1' if opt.batch_scaling == 'linear' else '1/2'} (optimizer.batch_scaling {opt.batch_scaling})")
        rows += [f"warning: {note}" for note in cfg.schedule_warnings()]
    return "\n".join(rows)


def lr_range(cfg: RunConfig, first: int, end: int) -> tuple[float, float]:
    """(lowest, highest) LR of steps [first, end): the curve is monotone between its breaks (warmup's end, the
    decay window's start, a change of batch), so those and the ends are enough."""
    total = cfg.schedule.total_steps
    candidates = {first, end - 1, cfg.optimizer.warmup_steps - 1, cfg.optimizer.warmup_steps,
                  total - cfg.decay_steps - 1, total - cfg.decay_steps}
    for piece in cfg.schedule.pieces:
        candidates |= {piece.first_step, piece.end_step - 1}
    values = [cfg.learning_rate(step, cfg.schedule.stages[cfg.schedule.stage_for_step(step)[0]].lr_scale)
              for step in sorted(candidates) if first <= step < end]
    return min(values), max(values)


def _by_stage(stages: list[ResolvedStage]) -> list[list[ResolvedStage]]:
    """The entries grouped by stage (a ramp's pieces together), in order."""
    groups: list[list[ResolvedStage]] = []
    for s in stages:
        if groups and groups[-1][0].index == s.index:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def _span(values) -> str:
    values = list(values)
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"
