"""Exact resume after every kind of stop, checked against the uninterrupted run of test_training.

One run directory is stopped twice, differently, and resumed by re-running the same command; its
per-step losses and gradient noise scales must equal the uninterrupted run's (|diff| <= 1e-6, fp32, no dropout):
  1. SIGTERM to DeepSpeed's launcher after the first stage boundary: ranks agree on a step, save, exit 143.
  2. SIGKILL of rank 1 while it writes a checkpoint (after DeepSpeed's files, before the sidecar):
     rank 0 fails in the next collective, the half-written checkpoint is never used, and the run
     replays from the previous complete one.
A copy of the uninterrupted run at global_step10 resumed with ONE rank (universal checkpoint: the session's
one_rank_resume, tests/multirank/conftest.py, whose export test_export.py checks) must continue the schedule and
the loss curve.
"""
from __future__ import annotations

import pytest

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.train.metrics import read_metrics
from tests.support.helpers import (
    newest_checkpoint,
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    start_run,
    tiny_run_config,
    train_losses,
)

TIMEOUT = 240
NOISE_FIELDS = ("grad_noise_scale", "grad_sq_norm", "grad_noise_trace")


def resumes(run_dir):
    return [r for r in read_metrics(run_dir, "event") if r["event"] == "resume"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory, trainer_run, tiny_data):
    """Run the interrupted chain once; returns (reference run dir, chain run dir, snapshots, return codes)."""
    reference = trainer_run
    root = tmp_path_factory.mktemp("chain")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, logging={"noise_every": 3})  # as trainer_run
    run_dir = root / "run"
    snapshots, codes = {}, []

    def attempt(label, **faults):
        proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, **faults)
        codes.append(proc.wait(timeout=TIMEOUT))
        snapshots[label] = (newest_checkpoint(run_dir), sorted(p.name for p in (run_dir / "checkpoints").iterdir()))

    attempt("sigterm", ROFORMER_TEST_SIGTERM_LAUNCHER_AT="7")
    attempt("kill_in_save", ROFORMER_TEST_SIGKILL_IN_SAVE_AT="1:12")
    attempt("final")
    return reference, run_dir, snapshots, codes


def test_each_stop_left_the_expected_checkpoints(chain):
    _, run_dir, snapshots, codes = chain
    assert codes[0] != 0 and codes[1] != 0 and codes[2] == 0
    point, _ = snapshots["sigterm"]
    # SIGTERM arrived before step 7 (0-based): the ranks agreed to stop at step 8 or 9 and saved there.
    assert point.sidecar.step in (8, 9) and point.sidecar.stage_index == 1
    point, names = snapshots["kill_in_save"]
    assert "global_step12" in names  # DeepSpeed's files were written ...
    assert point.tag == "global_step10"  # ... but without a sidecar it is never picked up
    assert CheckpointCatalogue.scan(run_dir).entry("global_step12").state == "complete"  # rewritten by the resumed run


def test_resumed_losses_equal_the_uninterrupted_run(chain):
    reference, run_dir = chain[0], chain[1]
    expected, got = train_losses(reference), train_losses(run_dir)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    # The gradient noise scale's EMA resumes from the sidecar: the same values at the same steps (3, 6, ... 15;
    # none where the smoothed |G|^2 is not yet positive), though both resumes land between two measurements.
    noise = [{r["step"]: tuple(r.get(k) for k in NOISE_FIELDS) for r in read_metrics(d) if NOISE_FIELDS[0] in r}
             for d in (reference, run_dir)]
    assert sorted(noise[1]) == sorted(noise[0]) and set(noise[0]) <= {3, 6, 9, 12, 15} and len(noise[0]) >= 2
    for step, values in noise[0].items():
        assert noise[1][step] == pytest.approx(values, rel=1e-6, abs=1e-6), step
    tags = [r["tag"] for r in resumes(run_dir)]
    assert tags[1:] == ["global_step10"] and tags[0] in ("global_step8", "global_step9")
    assert all(r["seconds"] > 0 and not r["universal"] for r in resumes(run_dir))


def test_resume_with_one_rank_continues_schedule_and_loss_curve(one_rank_resume, trainer_run):
    reference, (_, one_rank) = trainer_run, one_rank_resume
    event = resumes(one_rank)[-1]
    assert (event["tag"], event["from_world_size"], event["world_size"], event["universal"]) == \
        ("global_step10", 2, 1, True)
    assert (one_rank / "universal" / "global_step10" / "zero").is_dir()
    expected, got = train_losses(reference), train_losses(one_rank)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(11, TINY_TOTAL_STEPS + 1):  # other micro-batch split -> other summation order only
        assert got[step] == pytest.approx(expected[step], rel=1e-4, abs=1e-4), step
    # One rank measures the noise scale on two halves of its micro-batch, its EMA carried over from 2 ranks.
    assert [r["step"] for r in read_metrics(one_rank) if r["step"] > 10 and NOISE_FIELDS[0] in r] == [12, 15]
    stages = [r for r in read_metrics(one_rank, "event") if r["event"] == "stage_start"]
    assert stages[-1]["step"] == 10 and stages[-1]["stage"] == 2
    assert (stages[-1]["micro_batch_size"], stages[-1]["grad_accum_steps"]) == (8, 2)  # 16 = 8 x 2 x 1 rank
    sidecar = newest_checkpoint(one_rank).sidecar
    assert (sidecar.step, sidecar.world_size) == (TINY_TOTAL_STEPS, 1)
    assert sidecar.consumed_samples == newest_checkpoint(reference).sidecar.consumed_samples


def test_rng_states_round_trip(tmp_path):
    import random

    import numpy as np
    import torch

    from launcher.checkpoint.checkpointer import load_rng, save_rng
    from launcher.deepspeed_env.engine_state import seed_everything

    seed_everything(3)
    save_rng(tmp_path, rank=1)
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    seed_everything(99)
    assert load_rng(tmp_path, rank=1) and not load_rng(tmp_path, rank=0)
    assert (random.random(), float(np.random.rand())) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
