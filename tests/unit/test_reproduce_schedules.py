"""`roformer reproduce --parts schedules` without training: the part's plan (four schedules at equal token slots,
three seeds, the staged run shared with the encodings part) and its report from real run directories (the stored
release run's records, copied per variant, step times and noise estimates written in the real format), with the
verdict against flat-512 computed from the numbers. The quick end to end stays tests/multirank/test_reproduce_multirank.py's
(without this part: its default parts leave it out)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.config.run_config import load_run_config
from launcher.reproduce.reproduction_plan import PARTS, PRESETS
from launcher.run_dir.metrics_format import read_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_schedules_part_trains_four_schedules_at_equal_token_slots():
    preset = PRESETS["full"]()
    part = preset.schedules
    runs = {r.name: r for r in preset.pretrain_runs(("encodings", "schedules"))}
    assert len(runs) == len(preset.pretrain_runs(("encodings", "schedules")))  # rope-s<seed> planned once
    slots, seeds = {}, {}
    for variant in part.schedules:
        for seed in (0, 1, 2):
            run = runs[part.run_name(variant, seed)]
            cfg = load_run_config(run.config, [*run.overrides, "data.data_dir=/nonexistent"])
            assert cfg.data.seed == load_run_config(preset.ablation_config).data.seed  # same data order
            assert cfg.seed == seed and cfg.model.position_encoding == "rope"
            slots.setdefault(variant, set()).add(cfg.schedule.tokens_before(cfg.schedule.total_steps))
            seeds.setdefault(variant, set()).add(seed)
            lengths = [s.max_seq_len for s in cfg.schedule.stages]
        if variant == "flat-512":
            assert lengths == [512]
        if variant == "short-then-long":
            short, long = (cfg.schedule.tokens_before(s) for s in (333, cfg.schedule.total_steps))
            assert lengths == [128, 512] and short == pytest.approx(0.9 * long, rel=1e-3)
        if variant == "staged-ramp":
            assert cfg.optimizer.batch_scaling == "sqrt" and cfg.schedule.stages[0].ramp is not None
    assert set(slots) == {"flat-512", "staged", "short-then-long", "staged-ramp"}
    assert len({s for v in slots.values() for s in v}) == 1  # equal token slots, every variant and seed
    assert part.run_name("staged", 0) == "rope-s0"  # the encodings part's run, not trained twice
    evals = preset.eval_runs(("schedules",))
    assert {e.seq_lens for e in evals} == {(128, 512, 1024)} and {e.attention for e in evals} == {"document"}
    finetunes = [f for f in preset.finetune_runs(("schedules",)) if f.part == "schedules"]
    assert len(finetunes) == 4 * 3 * 3 and {(f.task, f.budget) for f in finetunes} == {("inews", 1000)}
    assert {f.pretrain for f in finetunes} <= preset.exported(("schedules",))
    # --quick stays as fast: the part is not among its default parts (its stand-in runs only when asked for).
    assert "schedules" in PARTS and "schedules" not in PRESETS["quick"]().default_parts
    quick = PRESETS["quick"]()
    for run in quick.pretrain_runs(("schedules",)):
        load_run_config(run.config, [*run.overrides, "data.data_dir=/nonexistent"]
                        + ([] if run.schedule is None else ["schedule.file=" + _written(run)]))


def _written(run) -> str:
    import tempfile

    import yaml

    path = Path(tempfile.mkdtemp()) / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump({"stages": [dict(s) for s in run.schedule]}), encoding="utf-8")
    return str(path)


def _copy_run(release_run: Path, to: Path, step_seconds: float, noise: dict[int, float] | None) -> None:
    """release_run's directory at `to`, each step taking `step_seconds`, and (noise: stage -> B_simple) an
    estimate at every step of those stages, written back as metrics.jsonl lines."""
    shutil.copytree(release_run, to, symlinks=True)
    lines = []
    for record in read_records(to / "metrics.jsonl"):
        if record.get("kind") == "train":
            record["step_time_s"] = step_seconds
            if noise and record["stage"] in noise:
                record.update(grad_noise_scale=noise[record["stage"]] + record["step"], grad_sq_norm=1.0,
                              grad_noise_trace=noise[record["stage"]])
        lines.append(json.dumps(record))
    (to / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_reports(preset, layout, loss_at_512: dict[str, float]) -> None:
    for run in preset.eval_runs(("schedules",)):
        path = layout.eval_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        value = loss_at_512[run.variant] + 0.01 * run.seed
        path.write_text(json.dumps({"results": [{"seq_len": n, "loss": value + (n - 512) / 1e4, "accuracy": 0.1}
                                                for n in run.seq_lens]}), encoding="utf-8")
    for run in preset.finetune_runs(("schedules",)):
        path = layout.finetune_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        accuracy = 0.5 + 0.01 * run.seed
        path.write_text(json.dumps({"test": {"accuracy": accuracy, "macro_f1": accuracy}, "dev": {"accuracy": 0.5},
                                    "majority_baseline": {"test": {"accuracy": 0.4}}, "train_examples": 1000,
                                    "truncated_share": {}, "seconds": 1.0}), encoding="utf-8")


def test_the_schedules_report_names_the_schedule_that_reached_flat_loss_first(tmp_path, release_run):
    """Real run directories (release_run's records; step times per variant), written evaluations: the table,
    the critical batch per stage ("not measured" without estimates), the plot and a verdict from the numbers."""
    from launcher.reproduce.claims_report import write_report
    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset, layout = PRESETS["full"](), Layout(tmp_path)
    part = preset.schedules
    seconds = {"flat-512": 2.0, "staged": 1.5, "short-then-long": 1.0, "staged-ramp": 0.5}
    for variant in part.schedules:
        for seed in part.seeds:
            noise = {0: 10.0, 1: 30.0} if variant == "staged-ramp" else None
            _copy_run(release_run, layout.run_dir(part.run_name(variant, seed)), seconds[variant] + 0.01 * seed, noise)
    # staged-ramp is fastest but ends worse beyond the spread; short-then-long reaches flat's loss, faster; staged
    # ends below it beyond the spread, slower than short-then-long.
    _write_reports(preset, layout, {"flat-512": 5.0, "staged": 4.5, "short-then-long": 4.99, "staged-ramp": 5.5})
    results = collect(preset, layout, ("schedules",))
    table = results["schedules"]
    flat = table["variants"]["flat-512"]
    assert flat["train_seconds"] == pytest.approx({"mean": 10.05, "min": 10.0, "max": 10.1, "n": 3})  # 5 steps each
    assert flat["tokens_per_s"]["max"] == pytest.approx((3 * 8 * 32 + 2 * 4 * 64) / 10.0)  # slots / seconds
    assert table["verdict"]["winner"] == "short-then-long"
    ramp_stages = table["variants"]["staged-ramp"]["stages"]
    assert [s["critical_batch"]["mean"] for s in ramp_stages] == [12.0, 34.5]  # medians of steps 1-3, 4-5
    assert table["variants"]["staged"]["stages"][0]["critical_batch"] == {"n": 0}
    report = write_report(results, tmp_path / "report", ["header"]).read_text(encoding="utf-8")
    assert "- Verdict: short-then-long reached flat-512's loss at 512 first, saving 5 s of training (50% of " \
           "flat-512's 10 s)." in report
    assert "| staged-ramp | short | 32 | 8 | ~12 (12-12, n=3) |" in report
    assert "| staged | long | 64 | 4 | not measured |" in report
    assert "staged-ramp: loss at 512 5.510 vs flat-512 5.010 (did NOT reach it within the seed spread)" in report
    assert "short-then-long: loss at 512 5.000 vs flat-512 5.010 (reached it within the seed spread)" in report
    assert "staged: loss at 512 4.510 vs flat-512 5.010 (below it beyond the seed spread)" in report
    assert (tmp_path / "report" / "schedules.png").read_bytes()[:8] == PNG_MAGIC
    curve = flat["runs"]["schedule-flat-512-s0"]["wall_curve"]  # (step, training seconds so far, loss)
    assert [point[:2] for point in curve] == [[3, 6.0], [5, 10.0]]

    # Within the seed spread: every variant as slow as flat on some seed -> no winner, said so.
    for variant in part.schedules:
        for seed in part.seeds:
            shutil.rmtree(layout.run_dir(part.run_name(variant, seed)))
            _copy_run(release_run, layout.run_dir(part.run_name(variant, seed)), 1.0 + 0.5 * seed, None)
    results = collect(preset, layout, ("schedules",))
    assert results["schedules"]["verdict"]["winner"] is None
    report = write_report(results, tmp_path / "report2", ["header"]).read_text(encoding="utf-8")
    assert "- Verdict: no schedule reached flat-512's loss at 512 in less training time beyond the seed spread." \
        in report
