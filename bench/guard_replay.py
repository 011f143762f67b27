"""The numerics guard's false alarms on healthy runs: its defaults replayed over the steps of finished runs
(RUN_DIR/metrics.jsonl, read as a resume reads them: launcher/train/guard_history.py), for several
`guard.min_window` values. A trigger on a healthy run is a false alarm.

    DS_ACCELERATOR=cpu .venv/bin/python bench/guard_replay.py RUN_DIR [RUN_DIR ...] [--out bench/results/guard_false_alarms.json]

Per run and min_window: triggers (rule, step), flagged steps, and the margin: the highest share of its
threshold a judged step reached (1.0 = flagged), for one step and for `patience` steps in a row, for the
loss and the gradient norm, over the whole run and over the first `window` steps after warmup (where a
short window judges and a full one would not).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.config.guard_section import GuardSection  # noqa: E402
from launcher.config.run_config import load_run_config  # noqa: E402
from launcher.run_dir.layout import RunDir  # noqa: E402
from launcher.train.guard_history import read_history  # noqa: E402
from launcher.train.numerics_guard import NumericsGuard  # noqa: E402

MIN_WINDOWS = (3, 5, 8, 10, 15, 20, 30, 50)


def replay(run_dir: Path, min_window: int, warmup_steps: int | None) -> dict:
    """warmup_steps None: the run's own (with warmup >= min_window the window is that long when judging starts);
    0: judged from the min_window-th step of the run, the early curve a run without warmup would be judged on."""
    cfg_run = load_run_config(run_dir / "config.yaml")
    cfg = GuardSection(**{**cfg_run.guard.__dict__, "action": "warn", "min_window": min_window})
    steps = read_history(RunDir(run_dir), 10 ** 12).steps
    warmup = cfg_run.optimizer.warmup_steps if warmup_steps is None else warmup_steps
    guard = NumericsGuard(cfg, warmup, None)
    shares: dict[str, list[tuple[int, float]]] = {"loss": [], "grad_norm": []}
    triggers, flagged = [], 0
    for f in steps:
        switched_at = f.step if guard.stage is not None and f.stage != guard.stage else guard.stage_switched_at
        widen = cfg.stage_switch_factor if switched_at and f.step - switched_at < cfg.window else 1.0  # as observe()
        for figure, rule in (("loss", guard.loss), ("grad_norm", guard.grad_norm)):
            value = getattr(f, figure)
            if f.step > guard.warmup_steps and len(rule.history) >= rule.min_window and value is not None:
                shares[figure].append((f.step, value / (rule.factor * widen * statistics.median(rule.history))))
        trigger = guard.observe(f)
        flagged += guard.flagged
        if trigger is not None:
            triggers.append((trigger.rule, trigger.step))
            guard.acknowledged()
    early = warmup + cfg.window
    return {"steps": len(steps), "warmup_steps": warmup, "triggers": triggers, "flagged_steps": flagged,
            **{f"{figure}_any_{min_window}": _any_window(steps, figure, min_window, cfg, warmup)
               for figure in ("loss", "grad_norm")},
            **{f"{figure}_{where}": _margins([s for s in series if s[0] <= early] if where == "early" else series,
                                             cfg.patience)
               for figure, series in shares.items() for where in ("all", "early")}}


def _any_window(steps, figure: str, size: int, cfg: GuardSection, warmup: int) -> dict:
    """A window of only `size` values anywhere after warmup (as after a warning's new baseline): the highest
    share of the threshold the next step, and the next `patience` steps in a row, reach."""
    factor = cfg.spike_factor if figure == "loss" else cfg.grad_norm_factor
    values = [getattr(f, figure) for f in steps]
    switches = [f.step for prev, f in zip(steps, steps[1:]) if f.stage != prev.stage]
    series = []
    for i in range(max(size, warmup), len(steps)):
        widen = cfg.stage_switch_factor if any(0 <= steps[i].step - s < cfg.window for s in switches) else 1.0
        series.append((steps[i].step, values[i] / (factor * widen * statistics.median(values[i - size:i]))))
    return _margins(series, cfg.patience)


def _margins(series: list[tuple[int, float]], patience: int) -> dict:
    shares = [s for _, s in series]
    in_a_row = [min(shares[i:i + patience]) for i in range(len(shares) - patience + 1)]
    return {"judged": len(shares), "max_share": round(max(shares, default=0.0), 4),
            "max_share_patience_in_a_row": round(max(in_a_row, default=0.0), 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = {f"{run} warmup {'own' if w is None else w}": {str(m): replay(run, m, w) for m in MIN_WINDOWS}
               for run in args.run_dirs for w in (None, 0)}
    for run, by_m in results.items():
        for m, r in by_m.items():
            print(f"{run} ({r['warmup_steps']}) min_window {m:>2}: {r['steps']} steps, triggers {r['triggers'] or 'none'}, flagged "
                  f"{r['flagged_steps']}; loss max {r['loss_all']['max_share']:.3f} of threshold "
                  f"({r['loss_all']['max_share_patience_in_a_row']:.3f} in a row; first window "
                  f"{r['loss_early']['max_share']:.3f}), grad norm max {r['grad_norm_all']['max_share']:.3f} "
                  f"({r['grad_norm_all']['max_share_patience_in_a_row']:.3f} in a row; first window "
                  f"{r['grad_norm_early']['max_share']:.3f}); any window of {m}: loss "
                  f"{r[f'loss_any_{m}']['max_share']:.3f} ({r[f'loss_any_{m}']['max_share_patience_in_a_row']:.3f} in a "
                  f"row), grad norm {r[f'grad_norm_any_{m}']['max_share']:.3f} "
                  f"({r[f'grad_norm_any_{m}']['max_share_patience_in_a_row']:.3f} in a row)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
