"""Training stages and the learning rate: pure functions of the global optimizer step.

A schedule file (YAML or JSON) lists stages in order, each {name, max_seq_len, global_batch_size, steps}
plus optional micro_batch_size, lr_scale and the recipe fields rope_theta, mask_prob and mixture (what
each does: docs/training.md, "Stages" and "Recipes"). Steps are counted from 0 over the whole run; stage i
covers [first_step_i, first_step_i + steps_i).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.config import MIN_SEQ_LEN
from launcher.common.io import read_mapping
from launcher.common.errors import UserError
from roformer.config import MAX_SIZE

STAGE_KEYS = ("name", "max_seq_len", "global_batch_size", "steps", "micro_batch_size", "lr_scale", "rope_theta",
              "mask_prob", "mixture")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
"""How the learning rate falls inside a warmup-stable-decay (`optimizer.decay: wsd`) decay window."""

Mixture = tuple[tuple[str, float], ...]
"""(source name, share) pairs in file order; the shares sum to 1."""


@dataclass(frozen=True)
class Stage:
    """One stage as written in the schedule file (before the world size is known)."""

    name: str
    """Shown in logs, the progress bar and checkpoint sidecars."""
    max_seq_len: int
    """Length of every packed training sequence in this stage."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks (micro x grad-accum x data-parallel size)."""
    steps: int
    """Optimizer steps in this stage."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward pass; None = derived from schedule.max_tokens_per_micro_batch."""
    lr_scale: float = 1.0
    """Multiplies the run's learning-rate curve while this stage runs."""
    rope_theta: float | None = None
    """RoPE base while this stage runs; None = the model config's rope_theta."""
    mask_prob: float | None = None
    """Share of tokens chosen for MLM while this stage runs; None = the run config's data.masking.mask_prob."""
    mixture: Mixture | None = None
    """Share of each named data source in this stage's sequences; None = the sources in proportion to size."""


def load_schedule(path: str | Path) -> list[Stage]:
    """Parse and validate a schedule file; errors name the file and the stage."""
    path = Path(path)
    raw = read_mapping(path, "schedule")
    if set(raw) - {"stages", "description"}:
        raise UserError(f"{path}: a schedule is a mapping with the key 'stages' (and optional 'description')")
    entries = raw.get("stages")
    if entries is not None and not isinstance(entries, list):
        raise UserError(f"{path}: stages: must be a list of stages (each line starting with '- '), got "
                        f"{type(entries).__name__} {entries!r}")
    if not entries:
        raise UserError(f"{path}: stages: the schedule is empty (at least one stage is needed)")
    return [_parse_stage(entry, i, path) for i, entry in enumerate(entries)]


def _parse_stage(entry: object, index: int, path: Path) -> Stage:
    where = f"{path}: stage {index + 1}"
    if not isinstance(entry, dict):
        raise UserError(f"{where}: must be a mapping of {', '.join(STAGE_KEYS)}")
    name = entry.get("name", f"stage{index + 1}")
    where = f"{path}: stage {index + 1} ({name})"
    unknown = sorted(set(entry) - set(STAGE_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(STAGE_KEYS)})")
    for key in ("max_seq_len", "global_batch_size", "steps"):
        if key not in entry:
            raise UserError(f"{where}: {key} is required")
    for key in ("max_seq_len", "global_batch_size", "steps", "micro_batch_size"):
        value = entry.get(key)
        if key == "micro_batch_size" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{where}: {key} must be a positive integer, got {value!r}")
        if value > MAX_SIZE:  # a typo whose estimates and step counters overflow
            raise UserError(f"{where}: {key} {value:,} is larger than any run (at most {MAX_SIZE:,})")
    if entry["max_seq_len"] < MIN_SEQ_LEN:
        raise UserError(f"{where}: max_seq_len {entry['max_seq_len']} is too short: a sequence is [CLS] plus at "
                        f"least one token (>= {MIN_SEQ_LEN})")
    lr_scale = entry.get("lr_scale", 1.0)
    if not _is_number(lr_scale) or not lr_scale > 0:
        raise UserError(f"{where}: lr_scale must be a positive number, got {lr_scale!r}")
    rope_theta = entry.get("rope_theta")
    if rope_theta is not None and (not _is_number(rope_theta) or not rope_theta > 1):
        raise UserError(f"{where}: rope_theta must be a number > 1 (RoPE's base), got {rope_theta!r}")
    mask_prob = entry.get("mask_prob")
    if mask_prob is not None and (not _is_number(mask_prob) or not 0.0 < mask_prob < 1.0):
        raise UserError(f"{where}: mask_prob must be a number in (0, 1) (the share of tokens chosen for MLM), "
                        f"got {mask_prob!r}")
    return Stage(name=str(name), max_seq_len=entry["max_seq_len"], global_batch_size=entry["global_batch_size"],
                 steps=entry["steps"], micro_batch_size=entry.get("micro_batch_size"), lr_scale=float(lr_scale),
                 rope_theta=None if rope_theta is None else float(rope_theta),
                 mask_prob=None if mask_prob is None else float(mask_prob),
                 mixture=None if entry.get("mixture") is None else _parse_mixture(entry["mixture"], where))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_mixture(raw: object, where: str) -> Mixture:
    """{SOURCE: weight} -> (source, share) pairs in file order, the shares normalised to sum 1."""
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{where}: mixture must be a mapping of source name to weight, e.g. {{en: 3, zh: 1}}, "
                        f"got {raw!r}")
    for source, weight in raw.items():
        if not isinstance(source, str) or not source:
            raise UserError(f"{where}: mixture: source names must be non-empty strings, got {source!r}")
        if not _is_number(weight) or weight < 0:
            raise UserError(f"{where}: mixture.{source}: the weight must be a number >= 0, got {weight!r}")
    total = float(sum(raw.values()))
    if not total > 0:
        raise UserError(f"{where}: mixture: all weights are 0 (at least one source needs a weight > 0)")
    return tuple((source, weight / total) for source, weight in raw.items())


def stage_index_at(stage_steps: list[int], step: int) -> tuple[int, int]:
    """(stage index, step within that stage) of global step `step`; stage_steps = steps per stage.

    Steps at or past the end of the run map to the last stage (step_in_stage >= its steps).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    first = 0
    for index, steps in enumerate(stage_steps):
        if step < first + steps:
            return index, step - first
        first += steps
    last = len(stage_steps) - 1
    return last, step - (first - stage_steps[last])


def run_learning_rate(step: int, optimizer, stage_steps: Sequence[int], lr_scale: float = 1.0) -> float:
    """LR of optimizer step `step` of a run: `optimizer` is its optimizer section (run_config.OptimizerSection,
    or the mapping a recorded config.yaml holds: lr, warmup_steps, decay, min_lr_ratio, and for 'wsd'
    decay_steps / decay_shape, absent = defaults), `stage_steps` the steps of each stage."""
    get = optimizer.get if isinstance(optimizer, Mapping) else (lambda key, default=None: getattr(optimizer, key, default))
    return learning_rate(step, sum(stage_steps), get("lr"), get("warmup_steps"), get("decay"), get("min_lr_ratio"),
                         lr_scale, decay_steps=wsd_decay_steps(get("decay_steps", 0), stage_steps),
                         decay_shape=get("decay_shape", "") or "1-sqrt")


def wsd_decay_steps(decay_steps: int | None, stage_steps: Sequence[int]) -> int:
    """The WSD decay window in steps: optimizer.decay_steps, or (0 / None) the last stage's steps."""
    return decay_steps or stage_steps[-1]


def learning_rate(step: int, total_steps: int, peak: float, warmup_steps: int, decay: str,
                  min_lr_ratio: float, lr_scale: float = 1.0, decay_steps: int = 0,
                  decay_shape: str = "1-sqrt") -> float:
    """LR of optimizer step `step` (0-based): linear warmup, then decay to peak*min_lr_ratio at the end
    of the whole run (not per stage), times the current stage's lr_scale.

    decay "wsd" (warmup-stable-decay): flat at peak after warmup until the last `decay_steps` steps of
    the run (the decay window), then floor + (peak - floor) * f(p) with p = (step - (total - decay_steps)
    + 1) / decay_steps, so the window's first step is already one step down and the LAST step of the
    run (total_steps - 1) trains at exactly the floor; f = 1 - p (linear), (1 + cos(pi p)) / 2 (cosine)
    or 1 - sqrt(p) (1-sqrt, ModernBERT's). decay_steps must be >= 1 (run_config resolves its default).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return peak * lr_scale * (step + 1) / warmup_steps
    floor = peak * min_lr_ratio
    if decay == "wsd":
        return (floor + (peak - floor) * _wsd_factor(step, total_steps, decay_steps, decay_shape)) * lr_scale
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if decay == "constant":
        factor = 1.0
    elif decay == "linear":
        factor = 1.0 - progress
    elif decay == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown decay {decay!r}")
    return (floor + (peak - floor) * factor) * lr_scale


def _wsd_factor(step: int, total_steps: int, decay_steps: int, shape: str) -> float:
    """1 in the stable phase, falling to 0 at the last step of the run through the decay window."""
    if decay_steps < 1:
        raise ValueError(f"decay_steps must be >= 1, got {decay_steps}")
    progress = min(1.0, max(0.0, (step - (total_steps - decay_steps) + 1) / decay_steps))
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(progress)
    raise ValueError(f"unknown decay_shape {shape!r}")
