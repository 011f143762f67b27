"""A DeepSpeed universal checkpoint folder (RUN_DIR/universal/<tag>) made loadable by every ZeRO stage.

DeepSpeed's `ds_to_universal` writes one folder per parameter (fp32 master weights and Adam moments,
whole, in any precision's terms) and that carries a checkpoint to another world size and precision.
Between ZeRO {1,2} and 3 DeepSpeed 0.19 stops at three details of the folder's layout, which depend
on the stage that SAVED it while the loader expects the stage that LOADS it (measured here):
  1. the model-states file DeepSpeed looks for is `mp_rank_00_model_states.pt` under ZeRO 1/2 and
     `zero_pp_rank_0_mp_rank_00_model_states.pt` under ZeRO-3 (a bare AssertionError in
     state_dict_factory otherwise). Only its metadata is read on a universal load (step counters,
     client state), the weights come from zero/: the same file serves under both names;
  2. zero/optimizer_state.pt: ZeRO-3's loader reads the step from `optimizer_state_dict`, ZeRO 1/2's
     asserts a `ds_version`; each conversion writes only its own stage's keys;
  3. per parameter: ZeRO 1/2's loader wants `{"param": tensor of the parameter's shape}` and a
     `step.pt`; a ZeRO-3 conversion writes flat tensors and no step. ZeRO-3's loader reads both forms.
`convert_to_universal` runs ds_to_universal and `complete_for_every_stage` adds what is missing, never
changing a value, so one folder serves any later resume. Loss-scaler state is not touched here
(launcher/checkpoint/checkpointer.py keeps the engine's own scaler when the precision changes).
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from launcher.common.io import fsync_dir, fsync_tree
from launcher.checkpoint.catalogue import CheckpointEntry
from launcher.checkpoint.deepspeed_files import load_deepspeed_file
from launcher.run_dir.layout import RunDir

MODEL_STATES_NAMES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
"""The one model-states file under the name ZeRO 1/2 and the name ZeRO-3 look for."""
MOMENTS = ("fp32", "exp_avg", "exp_avg_sq")
"""The per-parameter state files of DeepSpeed's Adam(W) in a universal folder."""


def convert_to_universal(source: CheckpointEntry, run_dir: RunDir) -> Path:
    """Rank 0 only: DeepSpeed's ds_to_universal of checkpoint `source` into RUN_DIR/universal/<tag> (atomic
    rename; reused), completed for every stage. `source` may belong to another run: it is only read, the
    conversion is always written into `run_dir`, the run that loads it."""
    final = run_dir.universal / source.tag
    if (final / "zero").is_dir():
        complete_for_every_stage(final)  # a folder converted before the stages were completed: now
        return final
    partial = run_dir.universal / f".{source.tag}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(source.path),
           "--output_folder", str(partial), "--inject_missing_state", "--num_extract_workers", "1",
           "--num_merge_workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"ds_to_universal failed for {source.path}:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    complete_for_every_stage(partial)  # loadable under every ZeRO stage, not only the one that saved it
    fsync_tree(partial)  # reused by later resumes: it must not come back half-written after a power loss
    os.replace(partial, final)
    fsync_dir(final.parent)
    return final


def complete_for_every_stage(folder: Path) -> None:
    """Add to the universal folder what the other ZeRO stages' loaders need (idempotent)."""
    _model_states_under_both_names(folder)
    zero = folder / "zero"
    state = load_deepspeed_file(zero / "optimizer_state.pt")
    step = _optimizer_step(state, zero)
    changed = False
    if "ds_version" not in state:
        import deepspeed

        state["ds_version"], changed = deepspeed.__version__, True
    if "optimizer_state_dict" not in state:
        state["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": state["param_groups"]}
        changed = True
    if changed:
        _save(state, zero / "optimizer_state.pt")
    for name, shape in _param_shapes(folder).items():
        _complete_parameter(zero / name, shape, step)


def _model_states_under_both_names(folder: Path) -> None:
    present = [folder / name for name in MODEL_STATES_NAMES if (folder / name).is_file()]
    if not present:
        raise RuntimeError(f"{folder}: no model-states file ({' or '.join(MODEL_STATES_NAMES)})")
    for name in MODEL_STATES_NAMES:
        target = folder / name
        if not target.exists():
            tmp = folder / f".{name}.tmp"
            tmp.unlink(missing_ok=True)
            try:
                os.link(present[0], tmp)  # the same bytes under the other stage's name (no copy)
            except OSError:  # a file system without hard links
                shutil.copyfile(present[0], tmp)
            os.replace(tmp, target)


def _optimizer_step(state: dict, zero: Path) -> object:
    """The optimizer's step count (the same for every parameter), from either stage's layout."""
    inner = state.get("optimizer_state_dict", {}).get("state") or {}
    if inner:
        return next(iter(inner.values()))["step"]
    for parameter in sorted(p for p in zero.iterdir() if p.is_dir()):
        if (parameter / "step.pt").is_file():
            return load_deepspeed_file(parameter / "step.pt")
    raise RuntimeError(f"{zero}: the universal checkpoint records no optimizer step")


def _param_shapes(folder: Path) -> dict[str, torch.Size]:
    """Every trained parameter's shape, as the checkpoint's model-states file records it."""
    states = load_deepspeed_file(folder / MODEL_STATES_NAMES[0])
    shapes = {}
    for group in states["param_shapes"]:  # one mapping per optimizer parameter group
        shapes.update(group)
    return shapes


def _complete_parameter(directory: Path, shape: torch.Size, step: object) -> None:
    numel = math.prod(shape)
    for key in MOMENTS:
        path = directory / f"{key}.pt"
        value = load_deepspeed_file(path)
        if torch.is_tensor(value):  # ZeRO-3's flat form (possibly with the partition padding at the end)
            _save({"param": value.reshape(-1)[:numel].reshape(shape).clone()}, path)
    if not (directory / "step.pt").is_file():
        _save(step, directory / "step.pt")


def _save(value, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(value, tmp)
    os.replace(tmp, path)  # never a half-written state file under the real name
