"""A recipe run (per-stage mask rate, warmup-stable-decay) in a real 2-rank run: applied at each stage
switch, recorded, and exact across a stop inside stage 2.

The tiny three-stage run (tests.support.helpers.TINY_STAGES) with the first stage at mask_prob 0.3, the
second at 0.25 and the last at the run config's 0.15, under `optimizer.decay: wsd` (1-sqrt over the
last stage). One uninterrupted run and one copy stopped (SIGTERM) inside stage 2 and resumed: equal
losses (<= 1e-6) and equal final weights. Against the session's `trainer_run` (the same data stream at
0.15 throughout) the masked-token counts show the rate each stage trained at. RECIPE_STAGES is the one
place to extend the recipe (e.g. with a mixture per stage).
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from launcher.config.run_config import load_run_config
from launcher.run_dir.layout import RunDir
from launcher.run_dir.sidecar import read_sidecar
from launcher.train.checkpointer import find_resume_point
from launcher.train.metrics import read_metrics
from tests.support.helpers import (
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_STAGES,
    TINY_TOTAL_STEPS,
    events,
    run_to_end,
    start_run,
    tiny_run_config,
    train_losses,
)

RECIPE_STAGES = [{**TINY_STAGES[0], "mask_prob": 0.3}, {**TINY_STAGES[1], "mask_prob": 0.25}, TINY_STAGES[2]]
MASK_PROBS = [0.3, 0.25, 0.15]  # the last stage: data.masking's default
WSD = {"decay": "wsd", "decay_shape": "1-sqrt"}  # decay_steps: the last stage's 6 steps
SWITCH = TINY_STAGES[0]["steps"]  # steps completed when stage 2 starts
TIMEOUT = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """(config, uninterrupted run dir, stopped-and-resumed run dir, (stopped attempt's return code, its resume point))."""
    root = tmp_path_factory.mktemp("recipe_resume")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, stages=RECIPE_STAGES, optimizer=WSD)
    straight = root / "straight"
    run_to_end(2, config, straight, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    resumed = root / "resumed"
    stopped = start_run(2, config, resumed, module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT=str(SWITCH + 1))
    code = stopped.wait(timeout=TIMEOUT)
    point = find_resume_point(RunDir(resumed))  # read now: keep_last prunes it once the run goes on
    run_to_end(2, config, resumed, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    return config, straight, resumed, (code, point)


def test_resume_inside_stage_2_ends_with_the_uninterrupted_weights(runs):
    _, straight, resumed, (code, point) = runs
    assert code != 0  # stopped by the SIGTERM
    assert [e["tag"] for e in events(resumed, "resume")] == [point.tag]
    assert point.sidecar.stage_name == "long" and point.sidecar.step > SWITCH and point.sidecar.mask_prob == 0.25
    expected, got = train_losses(straight), train_losses(resumed)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    before, after = load_file(str(straight / "reference.safetensors")), load_file(str(resumed / "reference.safetensors"))
    assert before.keys() == after.keys()
    worst = max(float((before[k] - after[k]).abs().max()) for k in before)
    assert worst <= 1e-6, worst


def test_each_stage_trains_at_its_mask_rate_and_records_it(runs, trainer_run):
    _, straight, _, _ = runs
    ours = {r["step"]: r for r in read_metrics(straight, "train")}
    plain = {r["step"]: r for r in read_metrics(trainer_run, "train")}  # the same stream at 0.15 throughout
    first = 1
    for stage, rate in zip(RECIPE_STAGES, MASK_PROBS):
        steps = range(first, first + stage["steps"])
        masked = sum(ours[s]["masked_tokens"] for s in steps) / sum(plain[s]["masked_tokens"] for s in steps)
        assert masked == pytest.approx(rate / 0.15, rel=0.05), (stage["name"], masked)
        first += stage["steps"]
    # The last stage is back at the run config's rate: the very masks of the plain run.
    assert all(ours[s]["masked_tokens"] == plain[s]["masked_tokens"] for s in range(first - TINY_STAGES[2]["steps"], first))
    assert [e["mask_prob"] for e in events(straight, "stage_start")] == MASK_PROBS
    assert read_sidecar(straight / "checkpoints" / f"global_step{TINY_TOTAL_STEPS}").mask_prob == 0.15


def test_the_learning_rate_is_warmup_stable_decay_to_the_floor(runs):
    config, straight, _, _ = runs
    cfg = load_run_config(config)
    records = {r["step"]: r["lr"] for r in read_metrics(straight, "train")}
    assert [records[s] for s in sorted(records)] == pytest.approx([cfg.learning_rate(s - 1) for s in sorted(records)])
    window_start = TINY_TOTAL_STEPS - TINY_STAGES[2]["steps"]  # steps completed when the decay window opens
    assert all(records[s] == cfg.optimizer.lr for s in range(cfg.optimizer.warmup_steps + 1, window_start + 1))
    assert records[TINY_TOTAL_STEPS] == pytest.approx(cfg.optimizer.lr * cfg.optimizer.min_lr_ratio)
    assert torch.tensor([records[s] for s in range(window_start, TINY_TOTAL_STEPS + 1)]).diff().lt(0).all()
