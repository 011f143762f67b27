"""The reproduction's `schedules` part (issue 61): does the stage schedule pay against flat training?

The RoPE ablation model and corpus at equal token slots, the same data order (data.seed) and pretraining seeds,
under four schedules: `flat-512` (one stage at 512), `staged` (the ablation schedule: the encodings part's
`rope-s<seed>` run, the same run), `short-then-long` (90% of the tokens at 128, then 10% at 512) and
`staged-ramp` (staged, its first stage's batch ramped, LR scaled by sqrt(batch / 32)). Compared on the last
checkpoint's masked-LM loss with each document scored alone at several lengths, training wall time and token
slots per second from each run's records, validation loss against wall time, inews at one label budget, and
each stage's measured critical batch (grad_noise_scale) beside the batch it ran. Its runs here; its table,
verdict and report section: schedules_results.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VARIANTS = {"flat-512": "flat: one stage at the longest length",
            "staged": "staged: the ablation schedule (today's)",
            "short-then-long": "short then long: 90% of the tokens short, 10% long",
            "staged-ramp": "staged with a batch ramp and sqrt LR scaling"}
BASELINE = "flat-512"
"""The variant every other is measured against."""


@dataclass(frozen=True)
class SchedulesPart:
    """The schedules part's sizes."""

    schedules: dict
    """variant -> its schedule: a schedule file (Path), stages the harness writes (tuple of schedule-file
    entries), or None (the preset's ablation schedule: the encodings part's RoPE run)."""
    seeds: tuple[int, ...]
    """Pretraining seeds of every variant."""
    eval_lens: tuple[int, ...]
    """Masked-LM evaluation lengths of the last checkpoint (each document scored alone)."""
    budget: int
    """inews labelled training examples of the fine-tunes (each export, every fine-tuning seed)."""
    compared_len: int
    """The length at which "reached flat's loss" is judged (the flat run's length)."""
    overrides: dict
    """variant -> further `--set` items (staged-ramp's batch scaling and warmup in tokens)."""
    eval_tokens: int = 32768
    task: str = "inews"

    def run_name(self, variant: str, seed: int) -> str:
        return f"rope-s{seed}" if self.schedules[variant] is None else f"schedule-{variant}-s{seed}"


def pretrain_runs(preset, run_type, planned: set[str]) -> list:
    """Per seed and variant one RoPE ablation run; `staged` is rope-s<seed> (skipped when another part plans it)."""
    part = preset.schedules
    rope = (*preset.overrides, "model.position_encoding=rope", "model.attention=softmax")
    runs = []
    for seed in part.seeds:
        for variant, schedule in part.schedules.items():
            name = part.run_name(variant, seed)
            if schedule is None and name in planned:
                continue
            file = (f"schedule.file={schedule.resolve()}",) if isinstance(schedule, Path) else ()
            runs.append(run_type(name=name, config=preset.ablation_config,
                                 group="rope" if schedule is None else f"schedules-{variant}", seed=seed,
                                 schedule=schedule if isinstance(schedule, tuple) else None,
                                 overrides=(*rope, *file, *part.overrides.get(variant, ()), f"seed={seed}")))
    return runs


def exported_runs(preset) -> set[str]:
    part = preset.schedules
    return set() if part is None else {part.run_name(v, s) for v in part.schedules for s in part.seeds}


def eval_runs(preset, run_type) -> list:
    """Each variant's last checkpoint, every document scored alone, at the part's lengths."""
    part = preset.schedules
    return [run_type(part.run_name(variant, seed), variant, seed, None, part.eval_lens, part.eval_tokens,
                     part="schedules", attention="document")
            for variant in part.schedules for seed in part.seeds]


def finetune_runs(preset, run_type) -> list:
    """inews at the part's budget with the downstream part's protocol: each export, each fine-tuning seed."""
    part = preset.schedules
    protocol = preset.tasks[part.task]
    return [run_type(part.run_name(variant, pre), part.task, "pretrained", part.budget, protocol.max_length, seed,
                     "schedules", protocol.args_for(part.budget))
            for variant in part.schedules for pre in part.seeds for seed in preset.finetune_seeds]


NOISE_EVERY_20 = ("logging.noise_every=20",)


def full_sizes(configs: Path) -> SchedulesPart:
    """Equal token slots (the ablation schedule's 1,515,520), 4096 per step except the ramp's first half."""
    return SchedulesPart(
        schedules={"flat-512": configs / "schedule_flat_512.yaml", "staged": None,
                   "short-then-long": configs / "schedule_short_then_long.yaml",
                   "staged-ramp": configs / "schedule_staged_ramp.yaml"},
        seeds=(0, 1, 2), eval_lens=(128, 512, 1024), budget=1000, compared_len=512,
        # A noise estimate every 20 steps: >= 3 in the 60-step stages, ~4% of each run's time alike
        # (bench/results/noise_scale.json: one estimate costs 0.87 step); the default 100 gives ~1 per stage.
        overrides={**{variant: NOISE_EVERY_20 for variant in VARIANTS},
                   "staged-ramp": (*NOISE_EVERY_20, "optimizer.batch_scaling=sqrt", "optimizer.reference_batch=32",
                                   "optimizer.warmup_steps=null", "optimizer.warmup_tokens=245760")})


def quick_sizes() -> SchedulesPart:
    """quick_schedule.yaml's 768 token slots as the four variants in miniature (a harness check only)."""
    return SchedulesPart(
        schedules={"flat-512": ({"name": "flat", "max_seq_len": 64, "global_batch_size": 2, "tokens": 768},),
                   "staged": None,
                   "short-then-long": ({"name": "short", "max_seq_len": 32, "global_batch_size": 4, "tokens": 640},
                                       {"name": "long", "max_seq_len": 64, "global_batch_size": 2, "tokens": 128}),
                   "staged-ramp": ({"name": "short", "max_seq_len": 32, "tokens": 512,
                                    "global_batch_size": {"start": 2, "end": 4, "over": 128}},
                                   {"name": "long", "max_seq_len": 64, "global_batch_size": 2, "tokens": 256})},
        seeds=(0,), eval_lens=(32, 64, 128), budget=32, compared_len=64, eval_tokens=512,
        overrides={"staged-ramp": ("optimizer.batch_scaling=sqrt", "optimizer.reference_batch=4")})
