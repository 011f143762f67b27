"""Resume on another shape (issue 20, part 2): ZeRO stage, precision and world size change between
starts of one run directory, through DeepSpeed's universal checkpoint, instead of being refused.

Every chain starts from a copy of one interrupted run (2 ranks, ZeRO-2, fp32, no dropout, killed
before step 7: its newest checkpoint is global_step6), is resumed on another shape and killed again
before step 11 (newest checkpoint global_step10), then resumed on a third shape to the end (16):
  ZeRO 2 -> 3 -> 1 and 2 ranks -> 1 -> 2, together   (fp32)
  fp32 -> bf16 -> fp32     (ZeRO-2, 2 ranks)
  fp32 -> fp16 -> bf16     (ZeRO 2 -> 2 -> 3, 2 ranks): the fp16 loss scaler starts fresh, then is dropped
At every load (the rank wrapper's ROFORMER_TEST_SAVE_LOADED_WEIGHTS) the engine's fp32 master weights
equal the checkpoint's exactly (as DeepSpeed's zero_to_fp32 reads them from the checkpoint files),
and its module weights are those, cast to the training precision. Losses stay finite to the end;
where the precision does not change they equal the uninterrupted run's (trainer_run) within 1e-6
(measured: 4.5e-7 on the ZeRO / world-size chain, from summation order only).

The bf16 leg of the precision chain uses DeepSpeed's older spelling `bfloat16` (a copy of
ds_configs/cpu_bf16_zero2.json): the resume reads it as bf16 (launcher/config/precision.py).
bf16 here does not depend on the CPU: DeepSpeed 0.19's CPU accelerator reports bf16 as supported
on every CPU (`is_bf16_supported` returns True; no patch as for fp16, tests/support/fp16_cpu.py), and
torch computes bf16 on any x86 CPU (natively with AVX512-BF16 / AMX, emulated otherwise). fp16 ranks
get fp16_rank_env() (the real path where the CPU has fp16, the reported support elsewhere).
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from launcher.checkpoint.weights import consolidate_fp32, resolve_checkpoint
from launcher.checkpoint.catalogue import read_sidecar
from tests.support.fp16_cpu import fp16_rank_env
from tests.support.helpers import (
    NO_DROPOUT,
    REPO,
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    bfloat16_copy,
    events,
    start_run,
    tiny_run_config,
    train_losses,
)

TIMEOUT = 420
STAGE_3 = {"overrides": {"zero_optimization": {"stage": 3}}}
STAGE_1 = {"overrides": {"zero_optimization": {"stage": 1}}}
# Checkpoints at the stage ends only (steps 6, 10, 16: the resume points; none at 4, 8 or 12 to write), every one
# kept, to be compared with what a later start loaded from it.
KEEP_ALL = {"every_steps": 0, "keep_last": 20}


def run(num_ranks: int, config: Path, run_dir: Path, kill_before: int | None = None, **env: str) -> int:
    """One start of the run directory; killed (rank 0, SIGKILL) before step `kill_before` if given."""
    faults = {"ROFORMER_TEST_SIGKILL_AT": f"0:{kill_before}"} if kill_before else {}
    proc = start_run(num_ranks, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LOADED_WEIGHTS="1",
                     **faults, **env)
    return proc.wait(timeout=TIMEOUT)


def log_tail(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")[-5000:]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny_data) -> tuple[Path, Path]:
    """(root with the run configs, a run killed before step 7: newest checkpoint global_step6)."""
    root = tmp_path_factory.mktemp("shapes")
    run_dir = root / "first"
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, checkpoint=KEEP_ALL)
    assert run(2, config, run_dir, kill_before=7) != 0
    assert (run_dir / "checkpoints" / "global_step6" / "sidecar.json").is_file(), log_tail(run_dir)
    return root, run_dir


def chain(interrupted, tiny_data, name: str, second: tuple[int, dict], third: tuple[int, dict],
          env: dict | None = None) -> Path:
    """A copy of the interrupted run resumed on shape `second` (killed before step 11), then on `third`
    to the end; each shape is (ranks, run config sections)."""
    root, first = interrupted
    run_dir = root / name
    shutil.copytree(first, run_dir)
    for index, ((ranks, sections), kill_before) in enumerate(((second, 11), (third, None))):
        config = tiny_run_config(root, tiny_data, name=f"{name}-{index}.yaml", model=NO_DROPOUT, checkpoint=KEEP_ALL,
                                 **sections)
        code = run(ranks, config, run_dir, kill_before=kill_before, **(env or {}))
        assert (code != 0) if kill_before else (code == 0), log_tail(run_dir)
    return run_dir


def check_loaded_weights(run_dir: Path, tag: str, dtype: torch.dtype) -> None:
    """The weights the engine held right after loading `tag` are the checkpoint's, exactly."""
    from safetensors.torch import load_file

    saved = consolidate_fp32(resolve_checkpoint(run_dir, tag))
    loaded = load_file(str(run_dir / f"loaded-{tag}.safetensors"))
    names = sorted(key.removeprefix("master/") for key in loaded if key.startswith("master/"))
    assert names and set(names) <= set(saved), sorted(set(names) - set(saved))
    for name in names:
        master, module = loaded[f"master/{name}"], loaded[f"module/{name}"]
        assert torch.equal(master, saved[name]), (tag, name, (master - saved[name]).abs().max())
        assert module.dtype == dtype and torch.equal(module, saved[name].to(dtype)), (tag, name)


def check_losses(run_dir: Path, reference: Path | None, tolerance: float | None = None) -> dict[int, float]:
    """Every step logged once the run ended, all finite; within `tolerance` of `reference`'s if given."""
    got = train_losses(run_dir)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    assert all(math.isfinite(loss) for loss in got.values()), got
    if reference is not None:
        expected = train_losses(reference)
        worst = max(abs(got[step] - expected[step]) for step in got)
        assert worst <= tolerance, (worst, {s: (got[s], expected[s]) for s in got if got[s] != expected[s]})
    return got


def resumes(run_dir: Path) -> list[tuple]:
    return [(e["tag"], e["from_world_size"], e["world_size"], e["universal"]) for e in events(run_dir, "resume")]


def notes(run_dir: Path) -> list[str]:
    return [e["message"] for e in events(run_dir, "resume_note")]


def test_zero_stage_and_world_size_2x2_to_3x1_to_1x2(interrupted, tiny_data, trainer_run):
    run_dir = chain(interrupted, tiny_data, "zero", (1, {"deepspeed": STAGE_3}), (2, {"deepspeed": STAGE_1}))
    assert resumes(run_dir) == [("global_step6", 2, 1, True), ("global_step10", 1, 2, True)]
    check_loaded_weights(run_dir, "global_step6", torch.float32)
    check_loaded_weights(run_dir, "global_step10", torch.float32)
    said = notes(run_dir)
    assert "checkpoint global_step6 was saved with ZeRO-2, fp32, 2 ranks; this run is ZeRO-3, fp32, 1 rank: " \
           "loaded through the universal checkpoint universal/global_step6" in said, said
    assert not any("loss scaler" in line for line in said)  # fp32 throughout: nothing to say about it
    # One rank takes 2 micro-batches where two ranks took one each: the gradient is summed in another
    # order, so the losses agree to float rounding, not bit for bit.
    check_losses(run_dir, trainer_run, tolerance=1e-6)


def test_precision_fp32_to_bf16_to_fp32(interrupted, tiny_data, tmp_path):
    bf16 = str(bfloat16_copy(tmp_path))
    run_dir = chain(interrupted, tiny_data, "precision", (2, {"deepspeed": {"config": bf16}}), (2, {}))
    assert resumes(run_dir) == [("global_step6", 2, 2, True), ("global_step10", 2, 2, True)]
    check_loaded_weights(run_dir, "global_step6", torch.bfloat16)
    check_loaded_weights(run_dir, "global_step10", torch.float32)
    assert read_sidecar(run_dir / "checkpoints" / "global_step10").precision == "bf16"  # saved by the bfloat16 leg
    said = notes(run_dir)
    assert any("ZeRO-2, fp32, 2 ranks; this run is ZeRO-2, bf16, 2 ranks" in line for line in said), said
    assert any("ZeRO-2, bf16, 2 ranks; this run is ZeRO-2, fp32, 2 ranks" in line for line in said), said
    assert not any("loss scaler" in line for line in said)  # neither side is fp16
    check_losses(run_dir, None)


def test_fp16_loss_scaler_starts_fresh_and_is_dropped(interrupted, tiny_data):
    """fp32 -> fp16: the scale is this run's initial one (DeepSpeed alone would install the fp32
    checkpoint's static scale of 1); fp16 -> bf16 on ZeRO-3: no scale (DeepSpeed alone would keep
    scaling bf16 gradients by the fp16 checkpoint's dynamic scale)."""
    fp16 = {"config": str(REPO / "ds_configs" / "v100_fp16_zero2.json"),
            "overrides": {"optimizer": {"params": {"torch_adam": True}}, "fp16": {"initial_scale_power": 8}}}
    bf16 = {"config": str(REPO / "ds_configs" / "cpu_bf16_zero2.json"), **STAGE_3}
    run_dir = chain(interrupted, tiny_data, "fp16", (2, {"deepspeed": fp16}), (2, {"deepspeed": bf16}),
                    env=fp16_rank_env())
    loaded = [(e["tag"], e["universal"], e["loss_scale"]) for e in events(run_dir, "resume")]
    assert loaded == [("global_step6", True, 256.0), ("global_step10", True, 1.0)]
    saved_scale = read_sidecar(run_dir / "checkpoints" / "global_step10").loss_scale
    check_loaded_weights(run_dir, "global_step6", torch.float16)
    check_loaded_weights(run_dir, "global_step10", torch.bfloat16)
    said = notes(run_dir)
    assert "fp16 loss scaler: starts fresh (the checkpoint trained in fp32, without loss scaling)" in said, said
    assert f"fp16 loss scaler: the checkpoint's (scale {saved_scale:g}) is dropped: bf16 trains without loss " \
           f"scaling" in said, said
    check_losses(run_dir, None)
