"""A recipe run (per-stage mask rate, data mixture, RoPE base, warmup-stable-decay) in a real 2-rank run:
applied at each stage switch, recorded, and exact across a stop inside stage 2.

The tiny three-stage run (tests.support.helpers.TINY_STAGES) on two named sources (`en`, `zh`:
tests.support.corpus_files.named_sources_dir) with the first stage at mask_prob 0.3 and both sources
equally, the second at 0.25, the sources by size and rope_theta 100 (test_stage_rope_theta.py checks
what the base alone changes), the last at the run config's 0.15 on `en` alone and the model's base,
under `optimizer.decay: wsd` (1-sqrt over the last stage). One uninterrupted run, and a copy of it as a stop
inside stage 2 leaves it (trimmed to its checkpoint at step STOPPED_AT; a stop by SIGTERM itself:
test_resume.py) resumed: equal losses (<= 1e-6), equal tokens drawn per source and equal final weights.
RECIPE_STAGES is the one place to extend the recipe.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.run_dir.layout import RunDir
from launcher.checkpoint.catalogue import read_sidecar
from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.train.metrics import read_metrics
from launcher.inputs.run_checks import open_streams
from tests.support.corpus_files import named_sources_dir
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, TINY_STAGES, TINY_TOTAL_STEPS, events, run_to_end, \
    tiny_run_config, train_losses, trimmed_copy

RECIPE_STAGES = [{**TINY_STAGES[0], "mask_prob": 0.3, "mixture": {"en": 1, "zh": 1}},
                 {**TINY_STAGES[1], "mask_prob": 0.25, "rope_theta": 100.0},
                 {**TINY_STAGES[2], "mixture": {"en": 1, "zh": 0}}]
MASK_PROBS = [0.3, 0.25, 0.15]  # the last stage: data.masking's default
WSD = {"decay": "wsd", "decay_shape": "1-sqrt"}  # decay_steps: the last stage's 6 steps
SWITCH = TINY_STAGES[0]["steps"]  # steps completed when stage 2 starts
STOPPED_AT = 8  # a checkpoint inside stage 2 (steps 7-10; one every 4 steps), which keep_last 6 keeps to the end


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(config, uninterrupted run dir, stopped-and-resumed run dir, its resume point)."""
    root = tmp_path_factory.mktemp("recipe_resume")
    config = tiny_run_config(root, named_sources_dir(tmp_path_factory), model=NO_DROPOUT, stages=RECIPE_STAGES,
                             optimizer=WSD, checkpoint={"keep_last": 6})
    straight = root / "straight"
    run_to_end(2, config, straight, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    resumed = trimmed_copy(straight, root / "resumed", STOPPED_AT)
    point = CheckpointCatalogue.scan(RunDir(resumed)).complete()[-1]  # read now: keep_last prunes it once the run goes on
    run_to_end(2, config, resumed, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1")
    return config, straight, resumed, point


def test_resume_inside_stage_2_ends_with_the_uninterrupted_weights(runs):
    _, straight, resumed, point = runs
    assert [e["tag"] for e in events(resumed, "resume")] == [point.tag]
    assert point.sidecar.stage_name == "long" and point.sidecar.step > SWITCH and point.sidecar.mask_prob == 0.25
    assert point.sidecar.rope_theta == 100.0
    expected, got = train_losses(straight), train_losses(resumed)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    before, after = load_file(str(straight / "reference.safetensors")), load_file(str(resumed / "reference.safetensors"))
    assert before.keys() == after.keys()
    worst = max(float((before[k] - after[k]).abs().max()) for k in before)
    assert worst <= 1e-6, worst


def replayed_steps(config) -> list[tuple[int, dict[str, int]]]:
    """(masked tokens, tokens per source) of every step of the recipe, replayed from the data pipeline
    alone: both ranks' readers, each stage's mask rate and mixture set as the trainer sets them."""
    cfg = load_run_config(config)
    stages = resolve_stages(cfg, 2)
    readers = [open_streams(cfg, rank, 2)[0] for rank in range(2)]
    steps = []
    for stage in stages:
        for reader in readers:
            reader.set_mask_prob(stage.mask_prob)
            reader.set_mixture(stage.mixture)
        for _ in range(stage.steps):
            per_rank = [reader.next_batches(stage.max_seq_len, stage.micro_batch_size, stage.grad_accum_steps)
                        for reader in readers]
            masked = sum(int((b["labels"] != -100).sum()) for batches, _ in per_rank for b in batches)
            steps.append((masked, per_rank[0][1]))
    return steps


def test_each_stage_trains_at_its_mask_rate_and_mixture_and_records_them(runs):
    config, straight, resumed, _ = runs
    ours = {r["step"]: r for r in read_metrics(straight, "train")}
    again = {r["step"]: r for r in read_metrics(resumed, "train")}
    # Every step trained on exactly what the data pipeline gives at that stage's rate and mixture.
    replay = replayed_steps(config)
    assert [(ours[s]["masked_tokens"], ours[s]["tokens_by_source"]) for s in sorted(ours)] == replay
    assert all(ours[s]["tokens_by_source"] == again[s]["tokens_by_source"] for s in ours)
    first = 0
    for stage, rate in zip(RECIPE_STAGES, MASK_PROBS):
        steps = replay[first:first + stage["steps"]]
        drawn = {name: sum(tokens[name] for _, tokens in steps) for name in ("en", "zh")}
        share = sum(masked for masked, _ in steps) / sum(drawn.values())
        assert 0.7 * rate <= share <= 1.05 * rate, (stage["name"], share, rate)  # [CLS]/[SEP] never selected
        assert drawn["en"] > 0 and (drawn["zh"] == 0) == (stage.get("mixture", {}).get("zh") == 0), (stage["name"], drawn)
        first += stage["steps"]
    starts = events(straight, "stage_start")
    assert [e["mask_prob"] for e in starts] == MASK_PROBS
    assert [e["rope_theta"] for e in starts] == [10000.0, 100.0, 10000.0]
    assert starts[0]["mixture"] == {"en": 0.5, "zh": 0.5} and starts[2]["mixture"] == {"en": 1.0, "zh": 0.0}
    final = read_sidecar(straight / "checkpoints" / f"global_step{TINY_TOTAL_STEPS}")
    assert final.mask_prob == 0.15 and final.mixture == {"en": 1.0, "zh": 0.0}


def test_the_learning_rate_is_warmup_stable_decay_to_the_floor(runs):
    config, straight, _, _ = runs
    cfg = load_run_config(config)
    records = {r["step"]: r["lr"] for r in read_metrics(straight, "train")}
    assert [records[s] for s in sorted(records)] == pytest.approx([cfg.learning_rate(s - 1) for s in sorted(records)])
    window_start = TINY_TOTAL_STEPS - TINY_STAGES[2]["steps"]  # steps completed when the decay window opens
    assert all(records[s] == cfg.optimizer.lr for s in range(cfg.optimizer.warmup_steps + 1, window_start + 1))
    assert records[TINY_TOTAL_STEPS] == pytest.approx(cfg.optimizer.lr * cfg.optimizer.min_lr_ratio)
    assert torch.tensor([records[s] for s in range(window_start, TINY_TOTAL_STEPS + 1)]).diff().lt(0).all()
