"""Checkpoints of a run directory: atomic save, choice of the resume point, world-size conversion.

Layout under RUN_DIR/checkpoints/:
    <tag>/                 DeepSpeed's files (engine.save_checkpoint), rng_rank<r>.pt per rank, and
    <tag>/sidecar.json     written LAST by rank 0 after every rank finished: the completion marker
    latest                 the newest complete tag (DeepSpeed's format), moved by os.replace
A checkpoint without a complete sidecar is never resumed from; the newest complete one is.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from launcher.errors import UserError

SIDECAR = "sidecar.json"
SIDECAR_FORMAT = 1


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def tag_for_step(step: int) -> str:
    return f"global_step{step}"


@dataclass
class ResumePoint:
    tag: str
    directory: Path
    sidecar: dict


def read_sidecar(directory: Path) -> dict | None:
    """The sidecar of a complete checkpoint, or None (missing, half-written, or not marked complete)."""
    try:
        sidecar = json.loads((directory / SIDECAR).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(sidecar, dict) or sidecar.get("complete") is not True or "step" not in sidecar:
        return None
    return sidecar


def find_resume_point(run_dir: Path) -> ResumePoint | None:
    """The newest complete checkpoint of the run directory (None: start from scratch)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    complete = []
    for directory in root.iterdir():
        if directory.is_dir() and not directory.name.startswith("."):
            sidecar = read_sidecar(directory)
            if sidecar is not None and sidecar.get("tag") == directory.name:
                complete.append(ResumePoint(directory.name, directory, sidecar))
    return max(complete, key=lambda p: p.sidecar["step"], default=None)


def check_foreign_checkpoints(run_dir: Path) -> None:
    """Refuse a run directory whose checkpoints/ holds DeepSpeed checkpoints we did not write.

    Every checkpoint of ours comes after RUN_DIR/config.yaml (written before the first step), so
    model-state files without it belong to something else; training there would mix two runs."""
    if (Path(run_dir) / "config.yaml").is_file():
        return
    foreign = sorted(d.name for d in checkpoints_dir(run_dir).glob("*") if d.is_dir() and any(d.glob("*model_states.pt")))
    if foreign:
        raise UserError(f"--run-dir {run_dir}: checkpoints/ holds DeepSpeed checkpoints not written by "
                        f"`roformer pretrain` ({', '.join(foreign[:3])}; no config.yaml); use a new run directory")


def check_compatible(point: ResumePoint, model_config) -> None:
    """Refuse to resume a checkpoint of another model (names the differing fields)."""
    from roformer.config import ConfigError, RoFormerConfig

    try:
        saved = RoFormerConfig.from_dict(point.sidecar.get("model_config") or {},
                                         source=str(point.directory / SIDECAR))
    except ConfigError as err:
        raise UserError(f"{point.directory}: not a checkpoint of this project's model: {err}") from None
    differing = saved.diff(model_config)
    if differing:
        details = ", ".join(f"{name}: checkpoint {getattr(saved, name)!r} vs config {getattr(model_config, name)!r}"
                            for name in differing)
        raise UserError(f"{point.directory}: the checkpoint was trained with a different model; differing "
                        f"field(s): {details}. Use a new run directory or the checkpoint's model config.")


def needs_universal(point: ResumePoint, world_size: int) -> bool:
    return int(point.sidecar["world_size"]) != world_size


def universal_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "universal"


def convert_to_universal(point: ResumePoint, run_dir: Path) -> Path:
    """Rank 0 only: DeepSpeed's ds_to_universal into RUN_DIR/universal/<tag> (atomic rename; reused)."""
    final = universal_dir(run_dir) / point.tag
    if (final / "zero").is_dir():
        return final
    partial = universal_dir(run_dir) / f".{point.tag}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(point.directory),
           "--output_folder", str(partial), "--inject_missing_state", "--num_extract_workers", "1",
           "--num_merge_workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ds_to_universal failed for {point.directory}:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    os.replace(partial, final)
    return final


# --- per-rank RNG state (python, numpy, torch CPU, accelerator) ---------------------------------


def rng_state() -> dict:
    from deepspeed.accelerator import get_accelerator

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch_cpu": torch.get_rng_state(),
            "accelerator": get_accelerator().get_rng_state()}


def save_rng(directory: Path, rank: int) -> None:
    state = rng_state()
    # Plain types only, so it loads back with weights_only=True.
    portable = {"python": [state["python"][0], list(state["python"][1]), state["python"][2]],
                "numpy": [state["numpy"][0], torch.from_numpy(state["numpy"][1].astype(np.int64)),
                          *state["numpy"][2:]],
                "torch_cpu": state["torch_cpu"], "accelerator": state["accelerator"]}
    _atomic_torch_save(portable, directory / f"rng_rank{rank}.pt")


def load_rng(directory: Path, rank: int) -> bool:
    """Restore this rank's RNGs; False when the checkpoint has none for this rank (other world size)."""
    from deepspeed.accelerator import get_accelerator

    path = directory / f"rng_rank{rank}.pt"
    if not path.is_file():
        return False
    state = torch.load(path, weights_only=True)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    get_accelerator().set_rng_state(state["accelerator"])
    return True


def seed_everything(seed: int) -> None:
    from deepspeed.accelerator import get_accelerator

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    get_accelerator().manual_seed_all(seed)


# --- atomic writes ------------------------------------------------------------------------------


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _atomic_torch_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_sidecar(directory: Path, sidecar: dict) -> None:
    """The completion marker: written after every rank finished its files."""
    sidecar = dict(sidecar, complete=True, format=SIDECAR_FORMAT, saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_text(directory / SIDECAR, json.dumps(sidecar, indent=2, sort_keys=False) + "\n")


def publish_latest(run_dir: Path, tag: str) -> None:
    atomic_write_text(checkpoints_dir(run_dir) / "latest", tag)


def prune(run_dir: Path, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints, and incomplete ones older than
    the newest complete one (leftovers of killed writes). Returns the deleted tags."""
    root = checkpoints_dir(run_dir)
    complete, incomplete = [], []
    for directory in root.iterdir():
        if not directory.is_dir():
            continue
        sidecar = read_sidecar(directory)
        (complete if sidecar else incomplete).append((sidecar["step"] if sidecar else None, directory))
    complete.sort(key=lambda item: item[0])
    doomed = [d for _, d in complete[:-keep_last]]
    newest = complete[-1][0] if complete else None
    for _, directory in incomplete:
        step = _step_of_tag(directory.name)
        if newest is not None and step is not None and step < newest:
            doomed.append(directory)
    for directory in doomed:
        remove_checkpoint(directory)
    return [d.name for d in doomed]


def remove_checkpoint(directory: Path) -> None:
    # Drop the marker first: a crash during rmtree leaves an incomplete (ignored) directory.
    (directory / SIDECAR).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _step_of_tag(tag: str) -> int | None:
    prefix = "global_step"
    return int(tag[len(prefix):]) if tag.startswith(prefix) and tag[len(prefix):].isdigit() else None
