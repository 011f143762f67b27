"""The report and the console of a schedule written in tokens with a batch ramp (issue 51): batch and LR against
tokens, the stage table one row per stage, tokens as the x axis; a schedule in steps keeps its step axis. Stand-in
run directories (tests/support/stand_in_runs.py): nothing trains."""
from __future__ import annotations

import json
import re

import pytest

from launcher.commands.report import make_report
from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.report.curves import load_curves
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import Metrics, MetricsOptions
from tests.support.helpers import check_png, run_config_dict, write_schedule, write_yaml
from tests.support.stand_in_runs import stand_in_run, stand_in_schedule_run

TRAIN_BLUE, LR_GREEN = (31, 119, 180), (44, 160, 44)  # tab:blue (the batch), tab:green (the LR)
RAMP = [{"name": "warmup", "max_seq_len": 16, "global_batch_size": {"start": 4, "end": 16, "over": "2K"},
         "tokens": "4K"},
        {"name": "long", "max_seq_len": 32, "global_batch_size": 16, "tokens": "4K"}]


def ramp_config(tmp_path, stages=RAMP, optimizer=None):
    schedule = write_schedule(tmp_path / "schedule.yaml", stages)
    optimizer = optimizer or {"warmup_steps": 3, "decay": "wsd", "batch_scaling": "sqrt", "reference_batch": 16}
    return load_run_config(write_yaml(tmp_path / "run.yaml", run_config_dict(schedule_file=schedule,
                                                                             optimizer=optimizer)))


def stage_rows(report: str) -> list[str]:
    table = report.split("## Stages and throughput", 1)[1].split("##", 1)[0]
    return [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]


def test_the_report_of_a_ramp_has_batch_and_lr_against_tokens_and_a_row_per_stage(tmp_path):
    cfg = ramp_config(tmp_path / "config")
    stages = resolve_stages(cfg, 2)
    assert len(stages) > 3  # the ramp is several pieces of one stage in stages.json
    run = stand_in_schedule_run(tmp_path / "run", cfg)
    assert json.loads(run.stages.read_text())["schedule_unit"] == "tokens"

    written = make_report(run.root, tmp_path / "out")
    names = [p.name for p in written.plots]
    assert "batch_lr_tokens.png" in names
    check_png(tmp_path / "out" / "plots" / "batch_lr_tokens.png", colours=(TRAIN_BLUE, LR_GREEN))
    report = written.report.read_text()
    assert "![global batch and learning rate against tokens](plots/batch_lr_tokens.png)" in report
    rows = stage_rows(report)
    assert len(rows) == 2, rows  # one per stage, not one per ramp piece
    steps = [sum(s.steps for s in stages if s.index == i) for i in (0, 1)]
    assert rows[0].startswith(f"| 1 | `warmup` | 16 x 4-16 | 2-8 x 1 x 2 | {steps[0]} / {steps[0]} |"), rows[0]
    assert rows[1].startswith(f"| 2 | `long` | 32 x 16 | 8 x 1 x 2 | {steps[1]} / {steps[1]} |"), rows[1]
    total = cfg.schedule.tokens_before(cfg.schedule.total_steps)
    assert f"of {total / 1e3:.3g} k tokens (token slots, the schedule's unit) trained" in report
    assert "LR x (batch / 16) ** 1/2 (batch_scaling sqrt)" in report

    curves = load_curves(run.root)
    assert curves.unit == "tokens" and curves.x_axis == "tokens"
    assert [b.tokens for b in curves.boundaries()] == [0.0, float(cfg.schedule.tokens_before(steps[0]))]
    assert [s.label for s in curves.stages] == ["warmup: 16 x 4-16", "long: 32 x 16"]


def test_a_schedule_in_steps_keeps_its_step_axis_and_draws_no_batch_plot(tmp_path):
    run = stand_in_run(tmp_path / "run")
    written = make_report(run.root, tmp_path / "out")
    assert "batch_lr_tokens.png" not in [p.name for p in written.plots]
    assert load_curves(run.root).x_axis == "step"
    assert len(stage_rows(written.report.read_text())) == 1


def test_a_ramp_in_steps_draws_the_batch_plot_against_steps_axes_elsewhere(tmp_path):
    stages = [{"name": "a", "max_seq_len": 16, "global_batch_size": {"start": 4, "end": 8, "over_steps": 6},
               "steps": 10}]
    run = stand_in_schedule_run(tmp_path / "run", ramp_config(tmp_path / "config", stages, {"warmup_steps": 2}))
    assert "schedule_unit" not in json.loads(run.stages.read_text())
    written = make_report(run.root, tmp_path / "out")
    assert "batch_lr_tokens.png" in [p.name for p in written.plots]  # a ramp, though in steps
    assert load_curves(run.root).x_axis == "step"


def test_a_run_recorded_without_schedule_unit_reads_its_schedule_file(tmp_path):
    cfg = ramp_config(tmp_path / "config")
    run = stand_in_schedule_run(tmp_path / "run", cfg)
    recorded = json.loads(run.stages.read_text())
    recorded.pop("schedule_unit")
    run.stages.write_text(json.dumps(recorded))
    assert load_curves(run.root).unit == "tokens"
    (tmp_path / "config" / "schedule.yaml").unlink()  # gone: nothing says tokens
    assert load_curves(run.root).unit == "steps"


@pytest.mark.parametrize("in_tokens", [True, False])
def test_the_progress_line_says_tokens_done_of_all_for_a_schedule_in_tokens(tmp_path, in_tokens):
    stages = RAMP if in_tokens else [{"name": "a", "max_seq_len": 16, "global_batch_size": 4, "steps": 10}]
    cfg = ramp_config(tmp_path / "config", stages, {"warmup_steps": 2})
    options = MetricsOptions.of_run_config(cfg)
    total = cfg.schedule.tokens_before(cfg.schedule.total_steps)
    assert options.total_tokens == (total if in_tokens else 0)
    metrics = Metrics(RunDir(tmp_path / "run"), 1, resolve_stages(cfg, 2), 0, options)  # rank 1: writes nothing
    step = 30
    line = metrics.progress_text({"step": step, "loss": 7.0, "mlm_accuracy": 0.1,
                                  "schedule_tokens": cfg.schedule.tokens_before(step)})
    assert "\n" not in line
    head = f"step {step}/{cfg.schedule.total_steps} ({100 * step // cfg.schedule.total_steps}%)"
    if in_tokens:
        assert (cfg.schedule.tokens_before(step), total) == (5_440, 8_000)
        assert line.startswith(f"{head} 5.44K/8K tok | loss 7.000"), line
    else:
        assert line.startswith(f"{head} | loss 7.000") and " tok |" not in line, line


def test_the_plans_source_table_has_one_row_per_stage_with_a_ramps_pieces_summed(tmp_path):
    """`roformer plan`'s tokens per stage and source (launcher/config/source_plan.py) on a ramp: its pieces are one
    stage (they were a row each, and the later stages' rows were labelled with the ramp stage's name)."""
    from launcher.config.source_plan import source_plan

    cfg = ramp_config(tmp_path / "config")
    stages = resolve_stages(cfg, 2)
    sources = [{"name": "en", "train": {"tokens": 3_000, "documents": 10}},
               {"name": "zh", "train": {"tokens": 1_000, "documents": 10}}]
    table = source_plan(stages, sources).table().splitlines()
    assert [line.split()[1] for line in table[2:4]] == ["warmup", "long"] and table[4].split()[0] == "passes"
    first = cfg.schedule.tokens_before(sum(s.steps for s in stages if s.index == 0))
    assert table[2].split()[2:] == [f"{0.75 * first:,.0f}", "(75%)", f"{0.25 * first:,.0f}", "(25%)"]


def test_tensorboard_draws_a_token_schedules_curves_against_tokens_and_a_resume_replaces_what_followed(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from launcher.tracking.tensorboard import TensorBoardSink

    def tokens_before(step: int) -> int:  # batch 4 then 8 (a ramp) at length 16
        return sum(4 * 16 if s < 2 else 8 * 16 for s in range(step))

    def train(sink, steps, loss_offset):
        for step in steps:
            sink.record({"kind": "train", "step": step, "loss": 5.0 - step + loss_offset, "lr": 1e-3 * step,
                         "global_batch_size": 4 if step <= 2 else 8, "schedule_tokens": tokens_before(step)})

    sink = TensorBoardSink(tmp_path / "tb", start_step=0, log_every=1, total_steps=4, tokens_before=tokens_before)
    train(sink, range(1, 5), 0.0)
    sink.close()
    resumed = TensorBoardSink(tmp_path / "tb", start_step=2, log_every=1, total_steps=4, tokens_before=tokens_before)
    train(resumed, range(3, 5), 0.5)  # steps 3-4 trained again after a resume from step 2
    resumed.close()
    by_tokens = EventAccumulator(str(tmp_path / "tb" / "by_tokens"), size_guidance={"scalars": 0})
    by_tokens.Reload()
    loss = [(e.step, e.value) for e in by_tokens.Scalars("by_tokens/loss")]
    assert loss == [(64, 4.0), (128, 3.0), (256, 2.5), (384, 1.5)]  # x: token slots; the resumed run's values
    assert [(e.step, e.value) for e in by_tokens.Scalars("by_tokens/global_batch_size")] == \
        [(64, 4), (128, 4), (256, 8), (384, 8)]
    by_steps = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    by_steps.Reload()
    assert [e.step for e in by_steps.Scalars("train/loss")] == [1, 2, 3, 4]  # the step axis as it always was
    TensorBoardSink(tmp_path / "steps_only", 0, 1, 4).close()  # a schedule in steps: no tokens axis
    assert not (tmp_path / "steps_only" / "by_tokens").exists()
