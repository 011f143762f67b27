"""A real 2-rank DeepSpeed ZeRO-2 run over three stages, then what it left in the run directory.

The session's uninterrupted run (`trainer_run`, tests/conftest.py; shared with test_resume and the
export tests) is checked for: the schedule it followed (length, batch, grad-accum switching inside
one engine), the loss normalisation, checkpoints and sidecars, TensorBoard scalars, and the
consolidation path the exporter uses. Bad input to the rank entry: tests/unit/test_rank_entry_errors.py.
"""
from __future__ import annotations

import json
import math
import re

import pytest

from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.train.metrics import read_metrics
from tests.support.helpers import TINY_STAGES, TINY_TOTAL_STEPS, newest_checkpoint


@pytest.fixture(scope="module")
def run(trainer_run):
    return trainer_run


def events(run_dir, name):
    return [r for r in read_metrics(run_dir, "event") if r["event"] == name]


def test_the_schedule_is_followed_step_by_step_in_one_engine(run):
    cfg = load_run_config(run / "config.yaml")
    stages = resolve_stages(cfg, 2)
    train = read_metrics(run, "train")
    assert [r["step"] for r in train] == list(range(1, TINY_TOTAL_STEPS + 1))  # steps completed
    for record in train:
        stage = stages[cfg.schedule.stage_for_step(record["step"] - 1)[0]]  # takes the 0-based step index
        assert (record["stage"], record["max_seq_len"], record["global_batch_size"]) == \
            (stage.index, stage.max_seq_len, stage.global_batch_size)
    switches = events(run, "stage_start")
    assert [(e["step"], e["micro_batch_size"], e["grad_accum_steps"]) for e in switches] == \
        [(s.first_step, s.micro_batch_size, s.grad_accum_steps) for s in stages]
    assert any(s.grad_accum_steps > 1 for s in stages)
    assert len(events(run, "startup")) == 1 and events(run, "finished")  # one engine for all stages


def test_loss_is_per_masked_token_over_all_ranks_and_micro_batches(run):
    train = read_metrics(run, "train")
    vocab = load_run_config(run / "config.yaml").model.vocab_size
    # Untrained model: mean token CE ~ ln(vocab). A missing 1/world or 1/grad-accum would be off 2x.
    assert abs(train[0]["loss"] - math.log(vocab)) < 0.5
    # It learns: the last steps' mean loss is clearly below the first steps' (globally mixed batches
    # differ more from step to step than the old shard-ordered ones, so single steps are noisy).
    assert sum(r["loss"] for r in train[-3:]) / 3 < sum(r["loss"] for r in train[:3]) / 3 - 0.05
    assert all(r["masked_tokens"] > 0 and 0 <= r["mlm_accuracy"] <= 1 for r in train)
    assert all(r["tokens_per_s"] > 0 and r["samples_per_s"] > 0 and r["grad_norm"] > 0 for r in train)


def test_every_train_record_carries_model_tflops_and_mfu_against_the_measured_peak(run):
    from roformer.flops import training_flops

    cfg = load_run_config(run / "config.yaml")
    (peak,) = events(run, "peak_flops")  # measured once, on rank 0, at start-up
    assert peak["source"] == "measured" and peak["precision"] == "fp32" and peak["peak_tflops"] > 0
    for record in read_metrics(run, "train"):
        # Every micro-batch is padded to the stage's length, so the step's FLOPs are linear in its
        # sequences and masked tokens; each of the 2 ranks is credited with half.
        flops = training_flops(cfg.model, record["global_batch_size"], record["max_seq_len"],
                               record["masked_tokens"]) / 2
        assert record["tflops"] * 1e12 * record["step_time_s"] == pytest.approx(flops, rel=1e-6)
        assert record["mfu"] == pytest.approx(record["tflops"] / peak["peak_tflops"], rel=1e-9)
    assert "TFLOP/s MFU" in (run.parent / "run.log").read_text(errors="replace")


def test_learning_rate_applied_each_step_follows_the_schedule(run):
    from launcher.config.schedule import learning_rate

    cfg = load_run_config(run / "config.yaml")
    opt = cfg.optimizer
    for record in read_metrics(run, "train"):
        index = record["step"] - 1  # the schedule is a function of the 0-based step index
        assert record["lr"] == pytest.approx(learning_rate(index, TINY_TOTAL_STEPS, opt.lr, opt.warmup_steps,
                                                           opt.decay, opt.min_lr_ratio), rel=1e-12)


def test_rank0_progress_lines_show_stage_and_etas(run):
    log = (run.parent / "run.log").read_text(errors="replace")
    assert re.search(r"^step 16/16 \(100%\) \| loss [\d.]+ acc [\d.]+ \| ETA run 00:00, stage 00:00 \| wide 3/3: "
                     r"len 16 x batch 16 \| [\d,]+ tok/s ", log, flags=re.M)


def test_run_directory_files(run):
    cfg = load_run_config(run / "config.yaml")  # the resolved config loads back
    ds = json.loads((run / "ds_config.resolved.json").read_text())
    first = resolve_stages(cfg, 2)[0]
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == \
        (first.global_batch_size, first.micro_batch_size, first.grad_accum_steps)
    assert json.loads((run / "stages.json").read_text())["world_size"] == 2


def test_checkpoints_sidecars_latest_and_retention(run):
    root = run / "checkpoints"
    complete = [entry.tag for entry in CheckpointCatalogue.scan(run).complete()]
    assert complete == ["global_step10", "global_step12", "global_step16"]  # keep_last 3 of 4,6,8,10,12,16
    assert (root / "latest").read_text() == "global_step16"
    sidecar = newest_checkpoint(run).sidecar
    samples = sum(s["steps"] * s["global_batch_size"] for s in TINY_STAGES)
    assert (sidecar.step, sidecar.stage_index, sidecar.step_in_stage, sidecar.stage_complete) == \
        (16, 2, 6, True)
    assert sidecar.consumed_samples == samples == sidecar.data_state["sequences_consumed"]
    assert sidecar.world_size == 2 and sidecar.precision == "fp32" and sidecar.zero_stage == 2
    assert sidecar.model_config["hidden_size"] == 32 and sidecar.last_validation["step"] == 16
    assert {"rng_rank0.pt", "rng_rank1.pt", "mp_rank_00_model_states.pt"} <= {p.name for p in (root / "global_step16").iterdir()}


def test_tokens_by_source_are_every_rank_s_tokens_counted_on_the_host(run):
    """Each train record's tokens_by_source (counted on the host from the global draw, no all-reduce)
    equals the non-padding tokens all ranks trained on (all-reduced): their sum is consumed_tokens."""
    train = read_metrics(run, "train")
    assert all(list(r["tokens_by_source"]) == ["default"] for r in train)  # plain --input data: one source
    assert all(r["tokens_by_source"]["default"] == r["max_seq_len"] * r["global_batch_size"] for r in train)
    sidecar = CheckpointCatalogue.scan(run).complete()[-1].sidecar
    assert sum(r["tokens_by_source"]["default"] for r in train) == sidecar.consumed_tokens


def test_validation_runs_periodically_and_at_stage_ends(run):
    valid = read_metrics(run, "valid")
    # valid_every 5 (after steps 5, 10, 15) and stage ends (after 6, 10, 16)
    assert [v["step"] for v in valid] == [5, 6, 10, 15, 16]
    assert all(v["loss"] > 0 and 0 <= v["mlm_accuracy"] <= 1 for v in valid)


def test_tensorboard_event_files_hold_the_scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {"train/loss", "train/mlm_accuracy", "train/lr", "train/loss_scale", "train/grad_norm",
                "train/skipped_steps", "schedule/stage", "schedule/max_seq_len", "schedule/global_batch_size",
                "speed/tokens_per_s", "speed/samples_per_s", "speed/tflops_per_rank", "speed/mfu", "valid/loss",
                "valid/mlm_accuracy"}
    assert expected <= tags
    losses = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert losses == pytest.approx(dict((r["step"], r["loss"]) for r in read_metrics(run, "train")), rel=1e-6)
    # The gradient noise scale (logging.noise_every 3): on every step that measured it, whatever log_every.
    noise = {r["step"]: r["grad_noise_scale"] for r in read_metrics(run, "train") if "grad_noise_scale" in r}
    assert noise and {e.step: e.value for e in acc.Scalars("noise/critical_batch")} == pytest.approx(noise, rel=1e-6)
    assert [e.value for e in acc.Scalars("schedule/max_seq_len")] == \
        [s["max_seq_len"] for s in TINY_STAGES for _ in range(s["steps"])]


def test_checkpoint_consolidates_to_roformer_keys(run):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from roformer import RoFormerConfig, RoFormerForMaskedLM

    state = get_fp32_state_dict_from_zero_checkpoint(str(run / "checkpoints"))  # follows `latest`
    model = RoFormerForMaskedLM(RoFormerConfig.from_dict(newest_checkpoint(run).sidecar.model_config))
    assert set(state) == set(model.state_dict())
    model.load_state_dict(state)


def test_one_step_number_everywhere_steps_completed(run):
    """Console, metrics.jsonl, TensorBoard, checkpoint tags, sidecars and stage starts all count
    optimizer steps completed (launcher/run_dir/metrics_format.py)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    valid = [v["step"] for v in read_metrics(run, "valid")]
    assert [e.step for e in acc.Scalars("valid/loss")] == valid == [5, 6, 10, 15, 16]
    saved = [e["step"] for e in events(run, "checkpoint")]
    assert [e.step for e in acc.Scalars("timing/checkpoint_s")] == saved == [4, 6, 8, 10, 12, 16]
    assert [e["tag"] for e in events(run, "checkpoint")] == [f"global_step{s}" for s in saved]
    assert newest_checkpoint(run).sidecar.step == read_metrics(run, "train")[-1]["step"] == 16
    first_records = {}
    for record in read_metrics(run, "train"):
        first_records.setdefault(record["stage"], record["step"])
    assert [e["step"] + 1 for e in events(run, "stage_start")] == list(first_records.values()) == [1, 7, 11]
    log = (run.parent / "run.log").read_text(errors="replace")
    assert [int(s) for s in re.findall(r"validation at step (\d+): loss", log)] == valid
    assert re.findall(r"stage \d/3 '\w+' after step (\d+)", log) == ["0", "6", "10"]


def test_no_shared_memory_buffer_outlives_the_run(run):
    """DeepSpeed's CPU all-reduce maps a ~66 MB /dev/shm buffer per rank and never unlinks it; before
    the ranks removed the names at start-up, every run left world-size such files in RAM."""
    import os
    from pathlib import Path

    port = (run.parent / "master_port").read_text()
    left = sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"))
    assert left == [], left
