"""The stages of a run at a world size: each stage's micro-batch and grad-accum, resolved once.

For every stage: global_batch_size = micro_batch_size x grad_accum_steps x world_size (data
parallel only). Every check runs before any process trains and names the stage that fails.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from launcher.config.run_config import RunConfig
from launcher.config.schedule import Mixture, Stage
from launcher.common.errors import UserError


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

    @property
    def end_step(self) -> int:
        return self.first_step + self.steps

    @property
    def mixture_dict(self) -> dict[str, float] | None:
        """The mixture as {source: share} in file order (the JSON form), None when the stage has none."""
        return None if self.mixture is None else dict(self.mixture)

    def to_dict(self) -> dict:
        return {**asdict(self), "mixture": self.mixture_dict}


def resolve_stages(run_config: RunConfig, world_size: int) -> list[ResolvedStage]:
    """Validate the schedule for `world_size` ranks and fix each stage's micro-batch and grad-accum."""
    if not isinstance(world_size, int) or world_size < 1:
        raise UserError(f"world size must be a positive integer, got {world_size!r}")
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
        theta = (stage.rope_theta if stage.rope_theta is not None else model.rope_theta) \
            if model.position_encoding == "rope" else None
        micro = _micro_batch_size(stage, world_size, run_config.schedule.max_tokens_per_micro_batch, where)
        resolved.append(ResolvedStage(index=index, name=stage.name, max_seq_len=stage.max_seq_len,
                                      global_batch_size=stage.global_batch_size, micro_batch_size=micro,
                                      grad_accum_steps=stage.global_batch_size // (micro * world_size),
                                      steps=stage.steps, first_step=first, lr_scale=stage.lr_scale,
                                      rope_theta=theta, mask_prob=stage.mask_prob if stage.mask_prob is not None
                                      else run_config.data.masking.mask_prob, mixture=stage.mixture))
        first += stage.steps
    return resolved


def _micro_batch_size(stage: Stage, world_size: int, max_tokens: int, where: str) -> int:
    if stage.global_batch_size % world_size:
        raise UserError(f"{where}: global_batch_size {stage.global_batch_size} is not divisible by the "
                        f"world size {world_size}")
    per_rank = stage.global_batch_size // world_size
    if stage.micro_batch_size is not None:
        if per_rank % stage.micro_batch_size:
            raise UserError(f"{where}: global_batch_size {stage.global_batch_size} is not divisible by "
                            f"micro_batch_size {stage.micro_batch_size} x world size {world_size}")
        return stage.micro_batch_size
    if max_tokens <= 0:
        raise UserError(f"{where}: micro_batch_size is not set and schedule.max_tokens_per_micro_batch is 0; "
                        f"set one of them")
    fitting = [d for d in range(1, per_rank + 1) if per_rank % d == 0 and d * stage.max_seq_len <= max_tokens]
    if not fitting:
        raise UserError(f"{where}: one sequence of max_seq_len {stage.max_seq_len} does not fit "
                        f"schedule.max_tokens_per_micro_batch {max_tokens}")
    return max(fitting)


def format_plan(stages: list[ResolvedStage], world_size: int) -> str:
    """The stages as a table (`roformer plan`, `roformer pretrain --dry-run`)."""
    header = f"{'#':>2}  {'stage':<16}{'max_len':>8}{'global':>8}{'micro':>7}{'accum':>7}{'steps':>9}{'first':>9}" \
             f"{'lr_scale':>9}"
    rows = [f"plan for world size {world_size}: global batch = micro x accum x {world_size}", header]
    for s in stages:
        rows.append(f"{s.index + 1:>2}  {s.name[:15]:<16}{s.max_seq_len:>8}{s.global_batch_size:>8}"
                    f"{s.micro_batch_size:>7}{s.grad_accum_steps:>7}{s.steps:>9}{s.first_step:>9}{s.lr_scale:>9g}")
    thetas = {s.rope_theta for s in stages}
    if len(thetas) > 1:  # a context-extension schedule: say which stage runs at which base
        rows.append("rope_theta per stage: " + ", ".join(f"{s.name} {s.rope_theta:g}" for s in stages))
    if len({s.mask_prob for s in stages}) > 1:  # an annealed mask rate: which stage masks how much
        rows.append("mask_prob per stage: " + ", ".join(f"{s.name} {s.mask_prob:g}" for s in stages))
    if any(s.mixture is not None for s in stages):
        rows.append("mixture per stage: " + "; ".join(f"{s.name} " + (
            "sources by size" if s.mixture is None else ", ".join(f"{source} {share:.3g}" for source, share in s.mixture))
            for s in stages))
    tokens = sum(s.steps * s.global_batch_size * s.max_seq_len for s in stages)
    rows.append(f"total: {stages[-1].end_step} optimizer steps, {tokens:,} token slots")
    return "\n".join(rows)
