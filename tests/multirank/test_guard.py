"""The numerics guard in real 2-rank runs (launcher/train/guard_actions.py), one run per scenario:

(a) ZeRO-1: a stage whose lr_scale is 1000 blows the loss up: `rewind` goes back to the stage-end checkpoint,
    skips, meets the same spike again and stops in one line (not retried by --max-restarts); the
    resume point and its export are from before the spike (finite weights, the pre-spike MLM loss);
(b) ZeRO-2: a poisoned stretch of the data stream (tests/support/rank_wrapper.py): `rewind` skips it and the
    run finishes with the weights of an uninterrupted run whose data position skipped the same batches (the run
    is shared with test_trackers.py, which reads its MLflow run: tests/multirank/conftest.py poisoned_rewind_run);
(c) ZeRO-3, fp16 with the loss scale pinned at its minimum (every step overflows): `stop` ends the run,
    recorded, with no checkpoint from the flagged steps;
(d) the default guard (window 50, judged from guard.min_window values), `stop`, a 1000x stage right after a
    first stage shorter than the window: stopped within `patience` steps of the spike, keep_last kept the
    newest good checkpoint, the resume point and its export are from before the spike (one run, shared);
(e) the same run stopped by SIGTERM before the spike and resumed: its guard is rebuilt from the run's records,
    so the spike in the first steps after the resume is caught the same way, and the guard's state and
    decisions after every step equal the uninterrupted run's (d).

The exports of (a) and (d) run in this process (export_checkpoint, what `roformer export` runs; the command itself
is checked in tests/unit/test_export_length.py).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import load_file

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.export.exporter import export_checkpoint
from launcher.train.metrics import read_metrics
from tests.support.fp16_cpu import fp16_rank_env
from tests.support.helpers import (
    NO_DROPOUT,
    newest_checkpoint,
    TEST_RANK_ENTRY,
    events,
    free_port,
    roformer,
    roformer_env,
    run_to_end,
    start_run,
    tiny_run_config,
    write_yaml,
)
from tests.support.tiny_models import one_thread

# Small windows for runs of a dozen steps (the defaults need 50 steps of history).
TINY_GUARD = {"window": 3, "patience": 2, "spike_factor": 1.5}
HOT_STAGES = [{"name": "base", "max_seq_len": 32, "global_batch_size": 8, "steps": 6},
              {"name": "hot", "max_seq_len": 32, "global_batch_size": 8, "steps": 6, "lr_scale": 1000.0}]
FLAT_STAGES = [{"name": "flat", "max_seq_len": 32, "global_batch_size": 8, "steps": 12}]


# A first stage shorter than the default window (50), then a learning rate 1000x: the loss blows up at the
# second step of `boom` (step 14); checkpoints every 2 steps, 2 kept.
SHORT_THEN_BOOM = [{"name": "a", "max_seq_len": 32, "global_batch_size": 8, "steps": 12},
                   {"name": "boom", "max_seq_len": 32, "global_batch_size": 8, "steps": 8, "lr_scale": 1000.0}]
PATIENCE = 3  # guard.patience's default


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """This module's in-process torch work (the exports and their MLM loss) on one thread: tiny
    matrices gain nothing from a second, and on the CI's shared cores a second thread spins waiting for one."""
    with one_thread():
        yield


def _short_then_boom(root, data):
    return tiny_run_config(root, data, stages=SHORT_THEN_BOOM, model=NO_DROPOUT, guard={"action": "stop"},
                           checkpoint={"every_steps": 2, "keep_last": 2}, logging={"valid_every": 0})


@pytest.fixture(scope="module")
def boom_run(tiny_data, tmp_path_factory):
    """The uninterrupted run of SHORT_THEN_BOOM, stopped by the guard; RUN_DIR/guard-trace.jsonl has the
    guard's state after every step."""
    root = tmp_path_factory.mktemp("boom")
    run_dir = root / "run"
    proc = start_run(2, _short_then_boom(root, tiny_data), run_dir, module=TEST_RANK_ENTRY,
                     ROFORMER_TEST_GUARD_TRACE="1")
    assert proc.wait(timeout=600) == 3, (root / "run.log").read_text()[-4000:]
    return run_dir


def _trace(run_dir):
    return [json.loads(line) for line in (run_dir / "guard-trace.jsonl").read_text().splitlines()]


def _pretrain(config, run_dir, *flags, **env):
    return roformer("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                    "--run-dir", str(run_dir), "--entry-module", TEST_RANK_ENTRY, *flags,
                    env=roformer_env(**env), timeout=600)


def _guard_events(run_dir):
    return [(e["action"], e["rule"], e["step"]) for e in events(run_dir, "guard")]


def test_a_blown_up_stage_is_rewound_once_then_stopped_before_the_spike(tiny_data, tmp_path):
    config = tiny_run_config(tmp_path / "config", tiny_data, stages=HOT_STAGES, model=NO_DROPOUT,
                             checkpoint={"every_steps": 3, "keep_last": 1}, guard=TINY_GUARD,
                             deepspeed={"overrides": {"zero_optimization": {"stage": 1}}})
    run_dir = tmp_path / "run"
    result = _pretrain(config, run_dir, "--guard", "rewind", "--max-restarts", "2",
                       "--set", "restarts.backoff_seconds=0")
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-4000:]
    guard = events(run_dir, "guard")
    assert [e["action"] for e in guard] == ["rewind", "stop"], output[-4000:]
    rewind, stop = guard
    assert rewind["to_step"] == 6 and rewind["tag"] == "global_step6" and rewind["began"] > 6
    assert rewind["skipped_batches"] == rewind["step"] - 6  # auto: every batch from the checkpoint to the trigger
    assert stop["rule"] == rewind["rule"] and "the same trigger came back" in stop["message"]
    rank_line = "pretrain (rank 0): error: "
    stop_lines = [line for line in output.splitlines() if line.startswith(rank_line + "numerics guard: stopped:")]
    assert len(stop_lines) == 1, output[-4000:]
    assert f"at step {stop['step']}" in stop_lines[0] and "resume point global_step6 (step 6)" in stop_lines[0]
    # The job's last line names the cause as rank 0 gave it.
    assert "restart 1/2" not in output and output.strip().splitlines()[-1] == (
        "roformer pretrain: stopped by the numerics guard, not a fault, so not restarted: rank 0: "
        + stop_lines[0].removeprefix(rank_line))
    assert not (run_dir / "restarts.json").exists()
    # No checkpoint from a flagged step; keep_last 1 kept the one before the spike.
    catalogue = CheckpointCatalogue.scan(run_dir)
    assert [e.step for e in catalogue.complete()] == [6]
    # The export of the resume point: finite, and its MLM loss the pre-spike validation's.
    export = export_checkpoint(run_dir, tmp_path / "export")  # `roformer export`'s export, in this process
    weights = load_file(str(export / "model.safetensors"))
    assert all(np.isfinite(w).all() for w in weights.values())
    pre_spike = catalogue.newest_intact().sidecar.last_validation
    assert pre_spike["step"] == 6 and math.isclose(_mlm_loss(export, tiny_data), pre_spike["loss"], rel_tol=1e-4)
    train = read_metrics(run_dir, "train")
    assert [r["step"] for r in train] == list(range(1, stop["step"] + 1))  # one consistent run: the rewound past dropped
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tensorboard = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    tensorboard.Reload()
    assert {"guard/rewind", "guard/stop", "guard/rewinds", "train/loss_scale", "train/skipped_steps",
            "train/grad_norm"} <= set(tensorboard.Tags()["scalars"])
    assert [e.value for e in tensorboard.Scalars("train/loss")] == pytest.approx([r["loss"] for r in train])
    print(f"\n(a) losses {[round(r['loss'], 2) for r in train]}; rewind {rewind['seconds']} s: {rewind['message']}")


def test_a_poisoned_stretch_is_skipped_and_the_run_ends_as_one_that_skipped_it(poisoned_rewind_run, tmp_path):
    # Steps 7 and 8 (global sequences 48-63) carry the poison; the newest checkpoint before them is step 6. The run
    # (tests/multirank/conftest.py poisoned_rewind_run) is shared with test_trackers.py, which reads its MLflow run.
    tracked_config, run_dir = poisoned_rewind_run
    raw = yaml.safe_load(tracked_config.read_text())
    raw["logging"]["report_to"] = ["tensorboard"]  # the same run otherwise: the reference reports to no server
    config = write_yaml(tmp_path / "reference.yaml", raw)
    poison = {"ROFORMER_TEST_POISON_SEQUENCES": "48:16", "ROFORMER_TEST_SAVE_LIVE_WEIGHTS": "1"}
    [rewind] = events(run_dir, "guard")
    assert (rewind["action"], rewind["began"], rewind["step"]) == ("rewind", 7, 8)
    assert rewind["rule"] in ("loss_spike", "grad_norm_spike")  # the poison spikes both
    assert (rewind["to_step"], rewind["skipped_batches"]) == (6, 2)
    assert [r["step"] for r in read_metrics(run_dir, "train")] == list(range(1, 13))
    assert [e["step"] for e in events(run_dir, "checkpoint")] == [3, 6, 9, 12]  # step 9 only after the rewind

    reference = tmp_path / "reference"  # never poisoned: its data position skips the same two batches at step 6
    run_to_end(2, config, reference, module=TEST_RANK_ENTRY, ROFORMER_TEST_SKIP_AT="6:2", **poison)
    assert events(reference, "guard") == []
    ours, theirs = load_file(str(run_dir / "reference.safetensors")), load_file(str(reference / "reference.safetensors"))
    worst = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours)
    assert worst <= 1e-6, worst
    sidecars = [json.loads((run_dir / "checkpoints" / f"global_step{s}" / "sidecar.json").read_text()) for s in (9, 12)]
    refs = [json.loads((reference / "checkpoints" / f"global_step{s}" / "sidecar.json").read_text()) for s in (9, 12)]
    assert [s["data_state"] for s in sidecars] == [r["data_state"] for r in refs]  # the skip is in the position
    print(f"\n(b) rewind {rewind['seconds']} s in-process; weights vs the run that skipped: max |diff| {worst:.2e}")


def test_fp16_loss_scale_stuck_at_its_minimum_stops_the_run(tiny_data, tmp_path):
    # The scale starts at its floor, far too high for fp16: every step overflows and is skipped.
    overrides = {"optimizer": {"params": {"torch_adam": True}},
                 "fp16": {"initial_scale_power": 40, "min_loss_scale": 2.0 ** 40, "hysteresis": 1}}
    config = tiny_run_config(tmp_path / "config", tiny_data, stages=FLAT_STAGES, ds_config="v100_fp16_zero3.json",
                             deepspeed={"overrides": overrides}, checkpoint={"every_steps": 2, "keep_last": 2},
                             guard={"action": "stop", "min_loss_scale_steps": 3, "window": 4})
    run_dir = tmp_path / "run"
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, **fp16_rank_env())
    assert proc.wait(timeout=300) == 3, (tmp_path / "run.log").read_text()[-4000:]
    assert _guard_events(run_dir) == [("stop", "loss_scale_at_minimum", 3)]
    train = read_metrics(run_dir, "train")
    assert [r["skipped_steps"] for r in train] == [1, 2, 3] and {r["loss_scale"] for r in train} == {2.0 ** 40}
    assert CheckpointCatalogue.scan(run_dir).complete() == []  # step 2's save was due while flagged
    assert events(run_dir, "checkpoint_skipped")[0]["step"] == 2
    last = (tmp_path / "run.log").read_text().strip().splitlines()
    assert any(line.startswith("pretrain (rank 0): error: numerics guard: stopped: loss scale at minimum at step 3: "
                               "loss_scale")
               for line in last[-5:]), last[-5:]


def test_a_blow_up_right_after_a_short_first_stage_stops_within_patience_from_before_it(boom_run, tiny_data, tmp_path):
    train = {r["step"]: r["loss"] for r in read_metrics(boom_run, "train")}
    spike = min(step for step, loss in train.items() if loss > 2 * train[12])  # the first blown-up step
    assert spike > 12 and max(train[s] for s in range(4, 13)) < 1.5 * min(train[s] for s in range(4, 13))
    [stop] = events(boom_run, "guard")
    assert stop["action"] == "stop" and stop["began"] == spike and stop["step"] <= spike + PATIENCE - 1, stop
    assert stop["median"] < train[4]  # the window holds the first stage's values only
    log = (boom_run.parent / "run.log").read_text()
    assert f"flagged since step {spike} (guard.action is stop); resume point global_step12 (step 12)" in log
    # No checkpoint from a flagged step, and keep_last 2 kept the newest good one.
    assert [e.step for e in CheckpointCatalogue.scan(boom_run).complete()] == [10, 12]
    assert [e["step"] for e in events(boom_run, "checkpoint_skipped")] == [s for s in range(spike, stop["step"])
                                                                         if s % 2 == 0]  # the stop's step saves nothing
    export = export_checkpoint(boom_run, tmp_path / "export")  # `roformer export`'s export, in this process
    assert all(np.isfinite(w).all() for w in load_file(str(export / "model.safetensors")).values())
    pre_spike = CheckpointCatalogue.scan(boom_run).newest_intact().sidecar.last_validation
    assert pre_spike["step"] == 12 and math.isclose(_mlm_loss(export, tiny_data), pre_spike["loss"], rel_tol=1e-4)
    print(f"\n(d) losses {[round(train[s], 2) for s in sorted(train)]}; {stop['message']}")


def test_a_resumed_run_is_guarded_from_its_first_step_as_the_uninterrupted_run(boom_run, tiny_data, tmp_path):
    config = _short_then_boom(tmp_path / "config", tiny_data)
    run_dir = tmp_path / "run"
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT="10",
                     ROFORMER_TEST_GUARD_TRACE="1")
    assert proc.wait(timeout=600) != 0  # stopped by the SIGTERM, with a checkpoint
    resumed_at = newest_checkpoint(run_dir).step
    spike = events(boom_run, "guard")[0]["began"]
    assert 10 < resumed_at < spike, resumed_at
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_GUARD_TRACE="1")
    assert proc.wait(timeout=600) == 3, (tmp_path / "run.log").read_text()[-4000:]
    # (b) the spike right after the resume is caught as in the uninterrupted run: same step, values, verdict.
    fields = ("action", "rule", "step", "began", "figure", "value", "median", "threshold")
    assert [[e[k] for k in fields] for e in events(run_dir, "guard")] == \
        [[e[k] for k in fields] for e in events(boom_run, "guard")]
    assert [e.step for e in CheckpointCatalogue.scan(run_dir).complete()] == sorted({10, resumed_at, 12})[-2:]
    # (c) the guard restored at the resume is the uninterrupted run's after that step, and so is every step after.
    trace = _trace(run_dir)
    restored = max(i for i, line in enumerate(trace) if line["decision"] == "restore")  # the second start's
    ours = [{**line, "decision": None} for line in trace[restored:]]
    theirs = [{**line, "decision": None} for line in _trace(boom_run) if line["step"] >= resumed_at]
    assert len(ours) == len(theirs) > PATIENCE and ours == theirs, (ours, theirs)
    assert [line["decision"] for line in trace[restored + 1:]] == \
        [line["decision"] for line in _trace(boom_run) if line["step"] > resumed_at]
    assert len(ours[0]["loss_window"]) == resumed_at  # more values than the resumed run itself trained before the spike
    print(f"\n(e) resumed at step {resumed_at}; stopped at step {ours[-1]['step']} as the uninterrupted run")


def _mlm_loss(export, data_dir) -> float:
    """MLM loss of an export on the trainer's first validation batch (32 tokens, 2 ranks x 4 sequences =
    the same 8 sequences and masks at any rank layout: data_pipeline/batches.py)."""
    from data_pipeline.batches import PretrainBatches
    from data_pipeline.shards import open_corpus
    from roformer.hf_interop import load_pretrained

    model = load_pretrained(export).eval()
    batch = next(PretrainBatches(open_corpus(data_dir, "valid"), seed=11).iter_eval_batches(32, 8, max_batches=1))
    with torch.no_grad():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    return float(out.loss_sum / out.num_masked)
