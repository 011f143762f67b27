"""Training stages and the learning rate: pure functions of the global optimizer step.

A schedule file (YAML or JSON) lists stages in order, each {name, max_seq_len, global_batch_size, steps}
plus optional micro_batch_size (a number, or `auto`: sized from the memory plan, launcher/config/stages.py),
lr_scale and the recipe fields rope_theta, mask_prob, mixture, attention and positions (what each does: docs/training.md, "Stages" and "Recipes"). Steps are counted from 0 over the whole run; stage i
covers [first_step_i, first_step_i + steps_i).

A stage may give `tokens` (2.5e9, "2.5B", "800M") instead of `steps`, and a batch ramp
`global_batch_size: {start, end, over | over_steps, increment}` instead of a number. Both are resolved
here, once, at load: a token count becomes whole steps (rounded) and a ramp becomes consecutive
constant-batch pieces (`Piece`), so everything downstream counts steps and resumes exactly. "Tokens"
in a schedule are token slots, global_batch_size x max_seq_len per step (padding included), which depend on
the schedule alone, never on the data.
"""
from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from data_pipeline.config import MIN_SEQ_LEN
from data_pipeline.documents import DOCUMENT_VIEWS
from launcher.common.io import read_mapping
from launcher.common.errors import UserError
from roformer.config import MAX_SIZE

STAGE_KEYS = ("name", "max_seq_len", "global_batch_size", "steps", "tokens", "micro_batch_size", "lr_scale",
              "rope_theta", "mask_prob", "mixture", "attention", "positions")
AUTO_MICRO = "auto"
"""`micro_batch_size: auto`: the largest micro-batch whose planned memory fits the target device (stages.py)."""
RAMP_KEYS = ("start", "end", "over", "over_steps", "increment")
BATCH_SCALINGS = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}
"""optimizer.batch_scaling: the LR curve's value is multiplied by (batch / reference_batch) ** p."""
TOKEN_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_TOKEN_COUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
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
    micro_batch_size: int | str | None = None
    """Sequences per rank per forward pass; None = derived from schedule.max_tokens_per_micro_batch; AUTO_MICRO
    ('auto') = the largest that the memory plan fits in the target device (launcher/config/stages.py)."""
    lr_scale: float = 1.0
    """Multiplies the run's learning-rate curve while this stage runs."""
    rope_theta: float | None = None
    """RoPE base while this stage runs; None = the model config's rope_theta."""
    mask_prob: float | None = None
    """Share of tokens chosen for MLM while this stage runs; None = the run config's data.masking.mask_prob."""
    mixture: Mixture | None = None
    """Share of each named data source in this stage's sequences; None = the sources in proportion to size."""
    attention: str | None = None
    """'document' | 'sequence' while this stage runs; None = the run config's data.attention."""
    positions: str | None = None
    """'document' | 'sequence' while this stage runs; None = the run config's data.positions."""
    tokens: int | None = None
    """The token count the file asked for (None: the stage was given in steps); `steps` is its rounding."""
    ramp: BatchRamp | None = None
    """The batch ramp of this stage (None: every step at global_batch_size, which is the ramp's end batch)."""
    pieces: tuple[tuple[int, int], ...] = ()
    """(global batch, steps) of each constant-batch piece, in order; one piece without a ramp."""


@dataclass(frozen=True)
class BatchRamp:
    """`global_batch_size: {start, end, over | over_steps, increment}`: the batch grows linearly in the tokens
    (or steps) trained within the stage, in whole increments, from `start` to `end`, reached after `over`."""

    start: int
    end: int
    increment: int
    """Batches are start + k x increment (capped at end); the file's default is `start`."""
    over: int
    """Length of the ramp, in `unit`."""
    unit: str
    """'tokens' (over:) or 'steps' (over_steps:)."""

    def batch(self, progress: int) -> int:
        """The batch after `progress` tokens (or steps) of the stage: start + inc x floor((end - start) x
        progress / (over x inc)), capped at end; end from `over` on."""
        if progress >= self.over:
            return self.end
        return min(self.end, self.start + self.increment * ((self.end - self.start) * progress
                                                             // (self.over * self.increment)))

    def describe(self) -> str:
        return f"{self.start} -> {self.end} over {format_tokens(self.over) if self.unit == 'tokens' else self.over} " \
               f"{self.unit} in steps of {self.increment}"


@dataclass(frozen=True)
class Piece:
    """A run of consecutive steps at one batch inside one stage (the whole stage when it has no ramp)."""

    stage: int
    """0-based index of the stage in the schedule."""
    piece: int
    """0-based position inside the stage."""
    pieces: int
    """How many pieces the stage has."""
    first_step: int
    steps: int
    global_batch_size: int
    max_seq_len: int

    @property
    def end_step(self) -> int:
        return self.first_step + self.steps

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.max_seq_len


def parse_token_count(value: object, where: str, allow_zero: bool = False) -> int:
    """A positive token count: an int, a float (2.5e9) or a string with an optional K/M/B/T suffix (powers of 1000:
    "2.5B", "800M", "1.7T"), rounded to a whole token. `where` names the field in the one-line UserError.
    allow_zero: an exact 0 is 0 (warmup_tokens / every_tokens, as their steps twins)."""
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    elif isinstance(value, str) and (match := _TOKEN_COUNT.match(value)):
        number = Decimal(match.group(1)) * TOKEN_SUFFIXES[match.group(2).upper()]
    if allow_zero and number == 0:
        return 0
    if number is None or number <= 0 or number > Decimal(MAX_SIZE) ** 2:
        raise UserError(f"{where} must be a positive token count (a number, or a string such as \"2.5B\" or "
                        f"\"800M\" with a suffix K, M, B or T), got {value!r}")
    tokens = int(number.to_integral_value(rounding=ROUND_HALF_UP))
    if tokens < 1:
        raise UserError(f"{where} must be a positive token count, got {value!r} (less than one token)")
    return tokens


def format_tokens(tokens: int | float) -> str:
    """2_500_000_000 -> '2.5B', 800_000 -> '800K' (3 significant digits), 512 -> '512'."""
    for suffix in ("T", "B", "M", "K"):
        if abs(tokens) >= TOKEN_SUFFIXES[suffix]:
            return f"{tokens / TOKEN_SUFFIXES[suffix]:.3g}{suffix}"
    return f"{tokens:g}"


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
    for key in ("max_seq_len", "global_batch_size"):
        if key not in entry:
            raise UserError(f"{where}: {key} is required")
    if "steps" not in entry and "tokens" not in entry:
        raise UserError(f"{where}: steps is required (or tokens: the stage's length in tokens, e.g. \"2.5B\")")
    if "steps" in entry and "tokens" in entry:
        raise UserError(f"{where}: give steps or tokens (the stage's length), not both")
    ramp = _parse_ramp(entry["global_batch_size"], where) if isinstance(entry["global_batch_size"], dict) else None
    for key in ("max_seq_len", "global_batch_size", "steps", "micro_batch_size"):
        value = entry.get(key)
        if (value is None and key in ("micro_batch_size", "steps")) or (key == "global_batch_size" and ramp) or \
                (key == "micro_batch_size" and value == AUTO_MICRO):
            continue
        if key == "micro_batch_size" and isinstance(value, str):
            raise UserError(f"{where}: micro_batch_size must be a positive integer or {AUTO_MICRO!r}, got {value!r}")
        _check_size(value, f"{where}: {key}")
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
    for key in ("attention", "positions"):
        if entry.get(key) is not None and entry[key] not in DOCUMENT_VIEWS:
            raise UserError(f"{where}: {key} must be one of {', '.join(DOCUMENT_VIEWS)} (the run's data.{key} for "
                            f"this stage), got {entry[key]!r}")
    tokens = parse_token_count(entry["tokens"], f"{where}: tokens") if "tokens" in entry else None
    if ramp is not None and ramp.unit == ("tokens" if tokens is not None else "steps") and \
            ramp.over > (tokens if tokens is not None else entry["steps"]):
        length = format_tokens(tokens) + " tokens" if tokens is not None else f"{entry['steps']} steps"
        raise UserError(f"{where}: global_batch_size: the ramp's {'over' if ramp.unit == 'tokens' else 'over_steps'} "
                        f"{format_tokens(ramp.over) if ramp.unit == 'tokens' else ramp.over} is longer than the "
                        f"stage ({length})")
    batch = entry["global_batch_size"] if ramp is None else None
    pieces = stage_pieces(entry["max_seq_len"], batch, ramp, steps=entry.get("steps"), tokens=tokens)
    if not pieces:
        per_step = (batch or ramp.start) * entry["max_seq_len"]
        raise UserError(f"{where}: tokens {entry['tokens']!r} is less than half a step ({per_step:,} tokens per "
                        f"step: global_batch_size x max_seq_len)")
    if tokens is not None and sum(n for _, n in pieces) > MAX_SIZE:  # the limit `steps` has, for the same count
        raise UserError(f"{where}: tokens {entry['tokens']!r} is {sum(n for _, n in pieces):,} steps, more than any "
                        f"run (at most {MAX_SIZE:,} steps of global_batch_size x max_seq_len tokens)")
    return Stage(name=str(name), max_seq_len=entry["max_seq_len"],
                 global_batch_size=max(b for b, _ in pieces), steps=sum(n for _, n in pieces),
                 micro_batch_size=entry.get("micro_batch_size"), lr_scale=float(lr_scale),
                 rope_theta=None if rope_theta is None else float(rope_theta),
                 mask_prob=None if mask_prob is None else float(mask_prob),
                 mixture=None if entry.get("mixture") is None else _parse_mixture(entry["mixture"], where),
                 attention=entry.get("attention"), positions=entry.get("positions"), tokens=tokens, ramp=ramp, pieces=tuple(pieces))


def _check_size(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where} must be a positive integer, got {value!r}")
    if value > MAX_SIZE:  # a typo whose estimates and step counters overflow
        raise UserError(f"{where} {value:,} is larger than any run (at most {MAX_SIZE:,})")
    return value


MAX_RAMP_PIECES = 4096
"""More batch sizes than this in one ramp is a typo'd increment (each piece is a line in stages.json)."""


def _parse_ramp(raw: dict, where: str) -> BatchRamp:
    where = f"{where}: global_batch_size"
    unknown = sorted(map(str, set(raw) - set(RAMP_KEYS)))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)} in the ramp (known: {', '.join(RAMP_KEYS)})")
    for key in ("start", "end"):
        if key not in raw:
            raise UserError(f"{where}: the ramp needs {key} (a ramp is {{start, end, over | over_steps, increment}})")
        _check_size(raw[key], f"{where}: {key}")
    start, end = raw["start"], raw["end"]
    if end <= start:
        raise UserError(f"{where}: end {end} must be larger than start {start} (a constant batch is written as a "
                        f"number)")
    if ("over" in raw) == ("over_steps" in raw):
        raise UserError(f"{where}: give exactly one of over (tokens) and over_steps (steps), got "
                        + ("both" if "over" in raw else "neither"))
    over = parse_token_count(raw["over"], f"{where}: over") if "over" in raw else \
        _check_size(raw["over_steps"], f"{where}: over_steps")
    increment = _check_size(raw.get("increment", start), f"{where}: increment")
    if (end - start) / increment > MAX_RAMP_PIECES:
        raise UserError(f"{where}: increment {increment} makes more than {MAX_RAMP_PIECES} batch sizes from {start} "
                        f"to {end}")
    return BatchRamp(start=start, end=end, increment=increment, over=over,
                     unit="tokens" if "over" in raw else "steps")


def stage_pieces(max_seq_len: int, batch: int | None, ramp: BatchRamp | None, steps: int | None = None,
                 tokens: int | None = None) -> list[tuple[int, int]]:
    """(global batch, steps) of each constant-batch piece of a stage of `steps` steps or of `tokens` tokens
    (rounded half up to whole steps; [] when that is 0), at `batch` or along `ramp`. The batch of each step
    is ramp.batch(tokens or steps trained in the stage before it), so a piece ends at the first step whose
    count reaches the next threshold."""
    pieces: list[tuple[int, int]] = []
    done_steps = done_tokens = 0
    while True:
        unit_done = done_tokens if ramp is not None and ramp.unit == "tokens" else done_steps
        b = batch if ramp is None else ramp.batch(unit_done)
        per_step = b * max_seq_len
        until_change = None  # steps until the ramp's next batch
        if ramp is not None and b < ramp.end:
            k = (b - ramp.start) // ramp.increment
            threshold = min(ramp.over, -(-ramp.over * ramp.increment * (k + 1) // (ramp.end - ramp.start)))
            until_change = threshold - unit_done if ramp.unit == "steps" else -(-(threshold - unit_done) // per_step)
        if steps is not None:
            n = steps - done_steps if until_change is None else min(until_change, steps - done_steps)
            last = done_steps + n == steps
        else:
            remaining = tokens - done_tokens
            last = until_change is None or until_change * per_step >= remaining
            n = (2 * remaining + per_step) // (2 * per_step) if last else until_change
        if n > 0:
            if pieces and pieces[-1][0] == b:
                pieces[-1] = (b, pieces[-1][1] + n)
            else:
                pieces.append((b, n))
        if last:
            return pieces
        done_steps, done_tokens = done_steps + n, done_tokens + n * per_step


def schedule_pieces(stages: Sequence[Stage]) -> list[Piece]:
    """The constant-batch pieces of the whole run, in step order."""
    out, first = [], 0
    for index, stage in enumerate(stages):
        for k, (batch, steps) in enumerate(stage.pieces or ((stage.global_batch_size, stage.steps),)):
            out.append(Piece(index, k, len(stage.pieces or (0,)), first, steps, batch, stage.max_seq_len))
            first += steps
    return out


def piece_at(pieces: Sequence[Piece], step: int) -> Piece:
    """The piece that trains global step `step` (0-based); the last one at or past the end of the run."""
    return pieces[max(0, bisect.bisect_right([p.first_step for p in pieces], step) - 1)]


def tokens_before(pieces: Sequence[Piece], step: int) -> int:
    """Token slots trained by the first `step` steps of the run."""
    return sum(p.tokens_per_step * min(p.steps, max(0, step - p.first_step)) for p in pieces)


def steps_to_reach(pieces: Sequence[Piece], tokens: int) -> int:
    """The fewest steps from the start of the run whose token slots reach `tokens` (len of the run + 1 when the
    whole run holds fewer)."""
    done = 0
    for p in pieces:
        if done + p.steps * p.tokens_per_step >= tokens:
            return p.first_step + max(0, -(-(tokens - done) // p.tokens_per_step))
        done += p.steps * p.tokens_per_step
    return (pieces[-1].end_step if pieces else 0) + 1


def batch_scale(batch: int, scaling: str, reference: int) -> float:
    """(batch / reference) ** p for optimizer.batch_scaling (none: 1)."""
    power = BATCH_SCALINGS[scaling or "none"]
    return 1.0 if not power else (batch / reference) ** power


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


def run_learning_rate(step: int, optimizer, stage_steps: Sequence[int], lr_scale: float = 1.0,
                      batch: int | None = None) -> float:
    """LR of optimizer step `step` of a run: `optimizer` is its optimizer section (sections.OptimizerSection,
    or the mapping a recorded config.yaml holds: lr, warmup_steps, decay, min_lr_ratio, and for 'wsd'
    decay_steps / decay_shape, absent = defaults), `stage_steps` the steps of each stage. With `batch` (the
    step's global batch) and optimizer.batch_scaling on, the curve's value times (batch / reference_batch) ** p."""
    get = optimizer.get if isinstance(optimizer, Mapping) else (lambda key, default=None: getattr(optimizer, key, default))
    curve = learning_rate(step, sum(stage_steps), get("lr"), get("warmup_steps"), get("decay"), get("min_lr_ratio"),
                          lr_scale, decay_steps=wsd_decay_steps(get("decay_steps", 0), stage_steps),
                          decay_shape=get("decay_shape", "") or "1-sqrt")
    if batch is None or (get("batch_scaling", "none") or "none") == "none":
        return curve
    return curve * batch_scale(batch, get("batch_scaling"), get("reference_batch"))


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


def schedule_warnings(stages: Sequence[Stage], batch_scaling: str = "none", reference_batch: int = 0) -> list[str]:
    """What looks like a wasted run without being an error, one line each (printed by `roformer plan` and at
    launch): tokens per step falling at a stage boundary where the length is cut without the batch growing
    (DeepSpeed's curriculum docs warn against that), a ramp that ends the stage below its end batch, and a
    batch scaling whose reference lies outside the batches the schedule trains at."""
    notes = []
    for before, after in zip(stages, stages[1:]):
        last_batch, first_batch = (before.pieces or ((before.global_batch_size, 0),))[-1][0], \
            (after.pieces or ((after.global_batch_size, 0),))[0][0]
        was, now = last_batch * before.max_seq_len, first_batch * after.max_seq_len
        if after.max_seq_len < before.max_seq_len and now < was:
            notes.append(f"stage '{after.name}': tokens per step fall from {was:,} to {now:,} at its start (max_seq_len "
                         f"{before.max_seq_len} -> {after.max_seq_len} with the batch {last_batch} -> {first_batch}); "
                         f"a batch of {-(-was // after.max_seq_len)} keeps them")
    for stage in stages:
        if stage.ramp is not None and stage.pieces[-1][0] < stage.ramp.end:
            notes.append(f"stage '{stage.name}': the batch ramp ({stage.ramp.describe()}) ends the stage at batch "
                         f"{stage.pieces[-1][0]}, below its end {stage.ramp.end}")
    if batch_scaling != "none":
        batches = [b for stage in stages for b, _ in (stage.pieces or ((stage.global_batch_size, 0),))]
        low, high = min(batches), max(batches)
        if not low <= reference_batch <= high:
            notes.append(f"optimizer.reference_batch {reference_batch} is outside the schedule's batches ({low} to "
                         f"{high}): the LR is {batch_scale(low, batch_scaling, reference_batch):.3g} to "
                         f"{batch_scale(high, batch_scaling, reference_batch):.3g} x the curve's at every step")
        if low == high:
            notes.append(f"optimizer.batch_scaling {batch_scaling!r} with one batch ({low}) throughout only scales the "
                         f"LR by {batch_scale(low, batch_scaling, reference_batch):.3g}")
    elif reference_batch:
        notes.append(f"optimizer.reference_batch {reference_batch} is not used: optimizer.batch_scaling is 'none'")
    return notes
