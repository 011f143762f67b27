"""The numerics guard without a run: its rules on synthetic step sequences (launcher/train/numerics_guard.py),
every bad `guard.*` value and `--guard ACTION` refused before any rank starts, its state rebuilt from a run's records, a guard stop not retried by
`--max-restarts`, and the skip in the data position (data_pipeline/batches.py)."""
from __future__ import annotations

import math

import pytest

from launcher.config.guard_section import GuardSection
from launcher.config.run_config import load_run_config
from launcher.common.errors import UserError
from launcher.launch.restart_loop import Fault, RestartPolicy
from launcher.train.numerics_guard import NumericsGuard, StepFigures
from tests.support.helpers import REPO, roformer, run_config_dict, write_yaml

CFG = GuardSection(window=5, patience=2, spike_factor=1.5, grad_norm_factor=4.0, stage_switch_factor=2.0,
                   min_loss_scale_steps=3, max_skipped_share=0.5)


def feed(guard: NumericsGuard, losses, grad_norms=None, stages=None, scales=None, skipped=None, first_step=1):
    """observe() each step; returns [(step, trigger or None, flagged)]."""
    out = []
    for i, loss in enumerate(losses):
        f = StepFigures(step=first_step + i, stage=stages[i] if stages else 0, loss=loss,
                        grad_norm=grad_norms[i] if grad_norms else 1.0,
                        loss_scale=scales[i] if scales else None, skipped=bool(skipped and skipped[i]))
        out.append((f.step, guard.observe(f), guard.flagged))
    return out


def fired(results):
    return [(step, t.rule) for step, t, _ in results if t is not None]


def test_a_loss_spike_fires_after_patience_steps_in_a_row_naming_median_and_threshold():
    guard = NumericsGuard(CFG, warmup_steps=0, min_loss_scale=None)
    results = feed(guard, [4.0, 4.1, 3.9, 4.0, 4.2, 7.0, 4.0, 7.0, 7.5])
    assert fired(results) == [(9, "loss_spike")]  # step 6 alone is noise; 8 and 9 are two in a row
    assert [flagged for _, _, flagged in results] == [False] * 5 + [True, False, True, True]
    trigger = results[-1][1]
    assert (trigger.began, trigger.median, trigger.threshold) == (8, 4.0, 6.0)
    assert trigger.describe() == ("loss spike at step 9: loss 7.5 vs threshold 6 (window median 4), "
                                  "flagged since step 8")
    assert guard.began == 8


def test_flagged_steps_stay_out_of_the_window_so_a_spike_never_raises_its_own_baseline():
    guard = NumericsGuard(GuardSection(window=3, patience=4, spike_factor=1.5), 0, None)
    results = feed(guard, [2.0, 2.0, 2.0, 5.0, 5.0, 5.0, 5.0])
    assert fired(results) == [(7, "loss_spike")] and results[-1][1].median == 2.0


def test_warmup_and_an_unfilled_window_arm_nothing_and_a_falling_loss_never_fires():
    guard = NumericsGuard(CFG, warmup_steps=6, min_loss_scale=None)
    assert fired(feed(guard, [9.0, 20.0, 20.0, 20.0, 20.0, 20.0])) == []  # warmup
    guard = NumericsGuard(CFG, warmup_steps=0, min_loss_scale=None)
    assert fired(feed(guard, [1.0, 9.0, 9.0, 9.0])) == []  # window (5) not full yet
    assert fired(feed(NumericsGuard(CFG, 0, None), [9.0 - 0.3 * i for i in range(30)])) == []


def test_a_stage_switch_widens_the_factor_for_one_window():
    losses, stages = [4.0] * 5 + [7.0, 7.0, 7.0], [0] * 5 + [1] * 3  # x1.75: under 1.5 x 2.0 after the switch
    assert fired(feed(NumericsGuard(CFG, 0, None), losses, stages=stages)) == []
    assert fired(feed(NumericsGuard(CFG, 0, None), losses)) == [(7, "loss_spike")]  # the same without a switch
    guard = NumericsGuard(CFG, 0, None)  # a blow-up at the switch is still caught
    assert fired(feed(guard, [4.0] * 5 + [40.0, 50.0], stages=[0] * 5 + [1, 1])) == [(7, "loss_spike")]


def test_non_finite_loss_fires_at_once_even_in_warmup_and_a_skipped_steps_infinite_norm_does_not():
    guard = NumericsGuard(CFG, warmup_steps=100, min_loss_scale=1.0)
    results = feed(guard, [5.0, 5.0, float("nan"), float("nan"), 5.0])
    assert fired(results) == [(3, "non_finite_loss")] and results[2][1].began == 3  # once per run of NaNs
    assert [flagged for _, _, flagged in results] == [False, False, True, True, False]
    guard = NumericsGuard(CFG, warmup_steps=100, min_loss_scale=1.0)
    assert fired(feed(guard, [5.0, 5.0], grad_norms=[math.inf, 1.0], scales=[8.0, 8.0], skipped=[True, False])) == []
    guard = NumericsGuard(CFG, warmup_steps=100, min_loss_scale=None)
    assert fired(feed(guard, [5.0, 5.0], grad_norms=[1.0, math.inf])) == [(2, "non_finite_grad_norm")]


def test_a_grad_norm_spike_uses_its_own_factor():
    guard = NumericsGuard(CFG, 0, None)
    norms = [1.0] * 5 + [3.9, 3.9, 4.5, 4.5]  # 3.9 < 4 x 1.0; 4.5 twice fires
    assert fired(feed(guard, [3.0] * 9, grad_norms=norms)) == [(9, "grad_norm_spike")]


def test_fp16_loss_scale_at_its_minimum_and_a_high_skipped_share():
    guard = NumericsGuard(CFG, 0, min_loss_scale=4.0)
    results = feed(guard, [3.0] * 6, scales=[16.0, 8.0, 4.0, 4.0, 4.0, 4.0], skipped=[0, 1, 1, 0, 0, 0])
    assert fired(results) == [(5, "loss_scale_at_minimum")]  # once per episode
    assert results[4][1].began == 3 and [f for _, _, f in results][2:] == [True] * 4
    guard = NumericsGuard(CFG, 0, min_loss_scale=1.0)
    skipped = [1, 0, 1, 0, 0, 1, 0, 1, 1]  # a window of 5 with 3 skipped (> 0.5) from step 9 on
    results = feed(guard, [3.0] * 9, scales=[2.0 ** 10] * 9, skipped=skipped)
    assert fired(results) == [(9, "skipped_steps")] and results[-1][1].value == 0.6
    assert fired(feed(NumericsGuard(CFG, 0, None), [3.0] * 9, scales=[1.0] * 9, skipped=skipped)) == []  # no fp16


def test_after_a_rewind_the_guard_is_the_runs_at_the_checkpoint_and_the_same_spike_is_recognised_again():
    losses = [4.0] * 6 + [40.0, 40.0]
    live = NumericsGuard(CFG, 0, None)
    assert fired(feed(live, losses)) == [(8, "loss_spike")]
    rewound = NumericsGuard(CFG, 0, None).replay(figures(losses[:6]))  # back to the checkpoint of step 6
    assert not rewound.flagged and rewound.began is None
    results = feed(rewound, [4.0, 40.0, 40.0], first_step=7)
    assert fired(results) == [(9, "loss_spike")] and results[-1][1].median == 4.0


def test_a_rule_judges_from_min_window_values_against_their_median_and_never_takes_a_flagged_one():
    # A first stage shorter than the window, then a blow-up: judged at once, not after `window` steps.
    cfg = GuardSection(window=50, min_window=4, patience=3, spike_factor=1.5)
    guard = NumericsGuard(cfg, warmup_steps=2, min_loss_scale=None)
    results = feed(guard, [9.0, 8.0, 6.5, 6.4, 6.3, 6.3, 100.0, 150.0, 120.0])
    assert fired(results) == [(9, "loss_spike")] and results[-1][1].began == 7
    assert results[-1][1].median == 6.45 and list(guard.loss.history) == [9.0, 8.0, 6.5, 6.4, 6.3, 6.3]
    guard = NumericsGuard(cfg, warmup_steps=0, min_loss_scale=None)  # fewer than min_window: history only
    assert fired(feed(guard, [6.0, 6.0, 6.0, 60.0, 60.0])) == []
    assert NumericsGuard(GuardSection(window=3, min_window=10), 0, None).loss.min_window == 3  # at most window


def test_replaying_a_prefix_gives_the_live_guards_decisions_from_there_on():
    """What a resume does (launcher/train/guard_history.py): the same triggers as the uninterrupted run."""
    losses = [6.0 - 0.01 * i for i in range(40)] + [9.5, 9.6, 9.4, 9.0] + [5.5] * 10 + [30.0, 31.0, 32.0, 33.0]
    stages = [0] * 20 + [1] * 38
    cfg = GuardSection(window=8, min_window=3, patience=3, action="warn")

    def decisions(guard, start):
        out = []
        for f in figures(losses, stages)[start:]:
            trigger = guard.observe(f)
            if trigger is not None:
                guard.acknowledged()  # warn
            out.append((f.step, guard.flagged, trigger and (trigger.rule, trigger.began, round(trigger.median, 6))))
        return out

    live = decisions(NumericsGuard(cfg, 5, None), 0)
    assert [d for d in live if d[2]] == [(43, False, ("loss_spike", 41, 5.645)), (57, False, ("loss_spike", 55, 5.5))]
    assert [step for step, flagged, _ in live if flagged] == [41, 42, 55, 56]
    for start in (1, 7, 20, 41, 44, 50):
        resumed = NumericsGuard(cfg, 5, None).replay(figures(losses[:start], stages))
        assert decisions(resumed, start) == live[start:], start


def figures(losses, stages=None):
    return [StepFigures(step=i + 1, stage=stages[i] if stages else 0, loss=loss, grad_norm=1.0, loss_scale=None,
                        skipped=False) for i, loss in enumerate(losses)]


def test_a_warning_makes_the_new_level_the_baseline_so_checkpoints_resume():
    guard = NumericsGuard(CFG, 0, None)
    assert fired(feed(guard, [4.0] * 5 + [9.0, 9.0])) == [(7, "loss_spike")]
    guard.acknowledged()
    assert not guard.flagged
    results = feed(guard, [9.0] * 8, first_step=8)
    assert fired(results) == [] and not any(flagged for _, _, flagged in results)
    assert fired(feed(guard, [20.0, 20.0], first_step=16)) == [(17, "loss_spike")]  # armed again at the new level


# --- configuration ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("action", "explode", "guard.action: must be one of off, warn, stop, rewind, got 'explode'"),
    ("window", -5, "guard.window: must be >= 1, got -5"),
    ("window", 0, "guard.window: must be >= 1"),
    ("patience", 0, "guard.patience: must be >= 1"),
    ("min_loss_scale_steps", 0, "guard.min_loss_scale_steps: must be >= 1"),
    ("spike_factor", 1.0, "guard.spike_factor: must be > 1"),
    ("grad_norm_factor", 0.5, "guard.grad_norm_factor: must be > 1"),
    ("stage_switch_factor", 0.9, "guard.stage_switch_factor: must be >= 1"),
    ("max_skipped_share", 0.0, "guard.max_skipped_share: must be in (0, 1]"),
    ("max_skipped_share", 1.5, "guard.max_skipped_share: must be in (0, 1]"),
    ("skip_batches", -1, "guard.skip_batches: must be >= 0"),
    ("max_rewinds", -1, "guard.max_rewinds: must be >= 0"),
    ("window", "ten", "guard.window: expected int"),
    ("patiense", 3, "guard.patiense"),
])
def test_every_bad_guard_value_is_named(tmp_path, key, value, message):
    path = write_yaml(tmp_path / "run.yaml", run_config_dict(guard={key: value}))
    with pytest.raises(UserError) as info:
        load_run_config(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_defaults_load_and_the_shipped_configs_have_a_guard():
    cfg = load_run_config(REPO / "configs" / "demo_cpu.yaml")
    assert cfg.guard == GuardSection() and cfg.guard.action == "rewind"
    assert "guard" in cfg.to_dict()


def test_pretrain_refuses_a_bad_guard_before_any_rank_starts(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", run_config_dict(guard={"spike_factor": 0.8}))
    run_dir = tmp_path / "run"
    proc = roformer("pretrain", "--num_gpus", "2", "--config", str(path), "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "guard.spike_factor: must be > 1" in lines[0]
    assert not run_dir.exists()
    proc = roformer("pretrain", "--num_gpus", "2", "--config", str(path), "--run-dir", str(run_dir),
                    "--guard", "explode")
    assert proc.returncode == 2 and "--guard: invalid choice: 'explode'" in proc.stderr
    assert not run_dir.exists()


def test_guard_flag_is_the_config_override():
    from launcher.commands.pretrain import configure
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--config", "c.yaml", "--run-dir", "r", "--set", "guard.window=9", "--guard", "stop"])
    assert args.overrides == ["guard.window=9", "guard.action=stop"]


def test_a_guard_stop_is_not_retried():
    fault = Fault("rank", "rank 0 on node1: exit code 3", "exit code 3", "node1", 0, 12, 3)
    decision = RestartPolicy(max_restarts=3).decide(fault, [], 0)
    assert not decision.restart and decision.reason.startswith("the numerics guard stopped the run")


# --- the skip in the data position ------------------------------------------------------------------

def test_a_skip_moves_the_position_as_handing_out_those_batches_would(tiny_data):
    from data_pipeline.batches import PretrainBatches
    from data_pipeline.shards import open_corpus

    corpus = open_corpus(tiny_data, "train")
    readers = {rank: PretrainBatches(corpus, rank, 2, seed=3) for rank in (0, 1)}
    skipping = PretrainBatches(corpus, 0, 2, seed=3)
    for reader in (*readers.values(), skipping):
        reader.next_batch(16, 2)  # another stage's length before the skip
    for reader in readers.values():
        for _ in range(3):
            reader.next_batch(32, 4)
    skipping.skip(32, 3 * 2 * 4)  # three global batches of 2 ranks x 4 sequences
    assert skipping.state_dict() == readers[0].state_dict()
    assert skipping.next_batch(32, 4)["input_ids"].equal(readers[0].next_batch(32, 4)["input_ids"])
    resumed = PretrainBatches(corpus, 1, 2, seed=3)  # the skip is in the state: a resume continues after it
    resumed.load_state_dict(skipping.state_dict())
    readers[1].next_batch(32, 4)
    assert resumed.next_batch(32, 4)["input_ids"].equal(readers[1].next_batch(32, 4)["input_ids"])


# --- the report ---------------------------------------------------------------------------------------

def test_report_has_a_guard_table_and_marks_each_trigger_on_the_loss_plot(tmp_path):
    from launcher.commands.report import make_report
    from tests.support.helpers import check_png
    from tests.support.stand_in_runs import stand_in_run

    rewind = {"kind": "event", "event": "guard", "action": "rewind", "rule": "loss_spike", "step": 12, "began": 11,
              "figure": "loss", "value": 14.5, "median": 7.0, "threshold": 10.5, "to_step": 9,
              "tag": "global_step9", "skipped_batches": 3, "seconds": 0.25, "message": "..."}
    stop = {**rewind, "action": "stop", "step": 16, "began": 15, "value": 15.0, "message": "..."}
    for key in ("to_step", "tag", "skipped_batches", "seconds"):
        stop.pop(key)
    run_dir = stand_in_run(tmp_path / "run", rewind, stop, {"kind": "event", "event": "guard_stopped", "step": 16})
    text = make_report(run_dir.root).report.read_text()
    assert "**Status:** stopped by the numerics guard at step 16" in text
    assert "## Numerics guard" in text
    assert ("| 12 | rewind | loss spike | loss 14.5 | 7 | 10.5 | 11 | `global_step9` (step 9), 3 batches skipped "
            "| 0.25 |") in text
    assert "| 16 | stop | loss spike | loss 15 | 7 | 10.5 | 15 | - | - |" in text and "1 rewind." in text
    check_png(run_dir.plots / "curves_steps.png", colours=((148, 103, 189),), min_pixels=100)  # the rewind's line


def test_pruning_keeps_the_checkpoint_before_an_open_spike_and_the_rewind_target_within_reach(tmp_path):
    """GuardActions.protect_steps (what Checkpointer.save passes to CheckpointCatalogue.to_prune)."""
    from launcher.checkpoint.catalogue import CheckpointCatalogue
    from launcher.run_dir.layout import RunDir
    from launcher.config.run_shape import RunShape
    from launcher.train.guard_actions import GuardActions, Rewound
    from tests.support.helpers import write_complete_checkpoint

    run_dir = RunDir(tmp_path / "run")
    for step in (3, 6, 9):
        write_complete_checkpoint(run_dir, step)
    detector = NumericsGuard(CFG, 0, None)
    actions = GuardActions(CFG, detector, run_dir, metrics=None, rank=0, shape=RunShape(zero_stage=2, precision="fp32", world_size=2))
    assert actions.protect_steps(12) == ()
    feed(detector, [4.0] * 5 + [9.0], first_step=3)  # step 8 flagged: a spike open since step 8
    assert detector.began == 8 and actions.protect_steps(12) == (6,)
    assert [e.step for e in CheckpointCatalogue.scan(run_dir).to_prune(1, actions.protect_steps(12))] == [3]
    feed(detector, [4.0], first_step=9)
    actions.rewinds.append(Rewound("loss_spike", trigger_step=8, to_step=3, skipped_batches=5))  # reach: step 13
    assert actions.protect_steps(12) == (3,)
    assert actions.protect_steps(14) == ()


# --- the guard's history: the run's own records -------------------------------------------------------

def _write_metrics(run_dir, records):
    import json

    from launcher.run_dir.metrics_format import format_event

    run_dir.root.mkdir(parents=True, exist_ok=True)
    run_dir.metrics.write_text("".join(json.dumps(r) + "\n" for r in [format_event(), *records]))


def _train(step, loss, skipped=0, stage=0):
    return {"kind": "train", "step": step, "stage": stage, "loss": loss, "grad_norm": 1.0, "loss_scale": None,
            "skipped_steps": skipped}


def _event(name, **fields):
    return {"kind": "event", "event": name, **fields}


def test_the_history_is_the_run_as_it_stands_and_its_rewinds_those_before_the_resumed_checkpoint(tmp_path):
    from launcher.run_dir.layout import RunDir
    from launcher.train.guard_history import Rewound, read_history

    run_dir = RunDir(tmp_path / "run")
    rewind = _event("guard", action="rewind", rule="loss_spike", step=9, began=8, to_step=4, skipped_batches=5)
    _write_metrics(run_dir, [
        *[_train(s, 5.0) for s in range(1, 10)], _event("checkpoint", step=4), rewind,  # 5..9 abandoned
        *[_train(s, 4.0, skipped=1 if s > 6 else 0) for s in range(5, 12)], _event("checkpoint", step=8),
        _train(12, 99.0),  # the future a crash abandoned: the restart resumes from step 8
        _event("resume", step=8), *[_train(s, 3.0, skipped=1) for s in range(9, 11)], _event("checkpoint", step=10),
        _train(11, 77.0)])  # written in a file not yet truncated
    history = read_history(run_dir, 10)
    assert [(f.step, f.loss, f.skipped) for f in history.steps] == [
        (1, 5.0, False), (2, 5.0, False), (3, 5.0, False), (4, 5.0, False), (5, 4.0, False), (6, 4.0, False),
        (7, 4.0, True), (8, 4.0, False), (9, 3.0, False), (10, 3.0, False)]
    assert history.rewinds == [Rewound("loss_spike", 9, 4, 5)]
    assert read_history(run_dir, 4).rewinds == []  # checkpoint 4 was saved before the rewind
    assert [f.step for f in read_history(run_dir, 6).steps] == [1, 2, 3, 4, 5, 6]


def test_a_branch_continues_its_sources_history_up_to_the_branch_step(tmp_path):
    from launcher.run_dir.layout import RunDir
    from launcher.run_dir.records import write_branch_record
    from launcher.train.guard_history import read_history

    source, branch = RunDir(tmp_path / "source"), RunDir(tmp_path / "branch")
    _write_metrics(source, [_train(s, 10.0 - s) for s in range(1, 9)] + [_event("checkpoint", step=6)])
    _write_metrics(branch, [_event("resume", step=6), _train(7, 1.5, stage=1), _train(8, 1.25, stage=1)])
    write_branch_record(branch, {"source_run_dir": str(source.root), "tag": "global_step6", "step": 6})
    history = read_history(branch, 8)
    assert [(f.step, f.loss, f.stage) for f in history.steps] == [
        (1, 9.0, 0), (2, 8.0, 0), (3, 7.0, 0), (4, 6.0, 0), (5, 5.0, 0), (6, 4.0, 0), (7, 1.5, 1), (8, 1.25, 1)]
    assert history.rewinds == []
    assert [f.step for f in read_history(branch, 6).steps] == [1, 2, 3, 4, 5, 6]


def test_guard_off_written_as_yaml_or_as_an_override_turns_the_guard_off(tmp_path):
    """YAML 1.1 reads a bare `off` as False: `action: off` and `guard.action=off` (what `--guard off` adds) mean off."""
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_config_dict()) + "guard:\n  action: off\n")
    assert load_run_config(path).guard.action == "off"
    plain = write_yaml(tmp_path / "plain.yaml", run_config_dict())
    assert load_run_config(plain, ["guard.action=off"]).guard.action == "off"
    with pytest.raises(UserError, match="guard.action: expected str, got True"):
        load_run_config(plain, ["guard.action=on"])
