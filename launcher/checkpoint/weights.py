"""Read-only views of a run's checkpoints for export, averaging and evaluation.

`resolve_checkpoint` finds and verifies one; `consolidate_fp32` gives its weights as one fp32 state dict
(DeepSpeed's zero_to_fp32 for ZeRO 1/2/3; universal and ZeRO-0 checkpoints are read directly);
`snapshot_checkpoint` links one for a stage-end eval job while retention goes on. Averaging (`--average-last
N` / `--average TAG,...`) sums checkpoints one at a time in float64, after refusing any of another
architecture, tokenizer or RoPE base (docs/training.md, "Averaging checkpoints").
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.checkpoint.catalogue import (CheckpointCatalogue, CheckpointSidecar, DamagedCheckpoint,
                                           effective_rope_theta, read_sidecar, saved_model_config)
from launcher.checkpoint.deepspeed_files import load_deepspeed_file
from launcher.common.errors import UserError
from launcher.common.io import file_sha256
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.run_dir.records import files_in_effect
from roformer.config import ConfigError

if TYPE_CHECKING:  # torch is imported where weights are read: `roformer export --help` answers without it
    import torch


@dataclass
class CheckpointRef:
    """One complete checkpoint of a run."""

    run_dir: RunDir  # the run directory given on the command line
    tag: str  # sub-directory name under checkpoints/
    sidecar: CheckpointSidecar

    @property
    def path(self) -> Path:
        return self.run_dir.checkpoint(self.tag)


def resolve_checkpoint(run_dir: Path, tag: str | None) -> CheckpointRef:
    """Find the checkpoint (`tag`, or the one `checkpoints/latest` names) and check it is complete and
    its files are the ones its save recorded (sizes, sha256), before anything is loaded."""
    layout = RunDir(Path(run_dir))
    if not layout.root.is_dir():
        raise UserError(f"{layout.root}: run directory not found")
    ckpt_dir = layout.checkpoints
    if not ckpt_dir.is_dir():
        raise UserError(f"{ckpt_dir}: no checkpoints directory (has this run saved a checkpoint yet?)")
    catalogue = CheckpointCatalogue.scan(layout)
    available = [e.tag for e in catalogue.entries]
    if tag is None:
        latest = layout.latest
        if not latest.is_file():
            raise UserError(f"{latest}: missing, so there is no latest checkpoint; pass --tag "
                            f"(available: {', '.join(available) or 'none'})")
        tag = latest.read_text(encoding="utf-8").strip()
        if not tag:
            raise UserError(f"{latest}: empty")
    if "/" in tag or tag in ("", ".", ".."):
        raise UserError(f"--tag {tag!r}: not a checkpoint tag")
    entry = catalogue.entry(tag)
    if entry is None:
        raise UserError(f"{ckpt_dir}: unknown checkpoint tag {tag!r} (available: {', '.join(available) or 'none'})")
    entry = catalogue.verify(entry)
    if not entry.verified:
        raise (DamagedCheckpoint if entry.sidecar is not None else UserError)(entry.problem)
    return CheckpointRef(run_dir=layout, tag=tag, sidecar=entry.sidecar)


def consolidate_fp32(ref: CheckpointRef) -> dict[str, torch.Tensor]:
    """All parameters of the checkpoint in fp32 on CPU, keyed like the trained module's state dict."""
    import torch

    tag_dir = ref.path
    chatter = io.StringIO()  # zero_to_fp32's prints and shard-loading bar: shown only if it fails
    try:
        if any(tag_dir.glob("*_optim_states.pt")):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
                state = get_fp32_state_dict_from_zero_checkpoint(str(ref.run_dir.checkpoints), tag=ref.tag)
        elif (tag_dir / "zero").is_dir():
            state = _read_universal(tag_dir / "zero")
        else:
            state = _read_unpartitioned(tag_dir)
    except UserError:
        raise
    except (OSError, RuntimeError, ValueError, KeyError, EOFError) as err:
        # Truncated or mismatched shards surface here from DeepSpeed / torch.load.
        said = chatter.getvalue().strip().splitlines()[-3:]
        raise UserError(f"{tag_dir}: cannot consolidate checkpoint: {type(err).__name__}: {err}"
                        + (f" (DeepSpeed's zero_to_fp32 said: {' | '.join(said)})" if said else "")) from None
    return {name: tensor.detach().to(torch.float32).contiguous() if tensor.is_floating_point() else tensor
            for name, tensor in state.items()}


def _read_universal(zero_dir: Path) -> dict[str, torch.Tensor]:
    state = {}
    for fp32_file in sorted(zero_dir.rglob("fp32.pt")):
        name = fp32_file.parent.relative_to(zero_dir).as_posix()
        # ds_to_universal saves {"param": tensor} (a missing key is reported by consolidate_fp32).
        state[name] = load_deepspeed_file(fp32_file)["param"]
    if not state:
        raise UserError(f"{zero_dir}: universal checkpoint without any */fp32.pt parameter file")
    return state


def _read_unpartitioned(tag_dir: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_model_state_file

    path = get_model_state_file(str(tag_dir), zero_stage=0)
    # A ZeRO-0 model state file also holds the optimizer's state (in fp16, DeepSpeed's loss scaler too), and its weights
    # are in the training dtype: fp32 master weights exist only with ZeRO >= 1.
    return load_deepspeed_file(Path(path))["module"]


def snapshot_checkpoint(run_dir: RunDir, tag: str) -> Path:
    """Hard links to the checkpoint's files (instant, no copy) in a run-dir-shaped folder under
    RUN_DIR/evals/: the eval job reads those, so the trainer's retention may delete the original
    while the job is queued or running. Returns the snapshot's run directory."""
    snapshot = RunDir(run_dir.evals / f".snapshot-{tag}" / run_dir.root.name)
    shutil.rmtree(snapshot.root.parent, ignore_errors=True)
    snapshot.checkpoint(tag).mkdir(parents=True)
    for path in run_dir.checkpoint(tag).iterdir():
        if path.is_file():
            _link_or_copy(path, snapshot.checkpoint(tag) / path.name)
    in_effect = files_in_effect(run_dir, read_sidecar(run_dir.checkpoint(tag)).step)  # the run's config versions
    for source, dest in ((in_effect["config"], snapshot.config), (in_effect["stages"], snapshot.stages)):
        if source.is_file():
            shutil.copy2(source, dest)
    return snapshot.root


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, dest)


# --------------------------------------------------------------------------- averaging


@dataclass(frozen=True)
class AverageRequest:
    """Which checkpoints an export averages: exactly one of the two fields is set."""

    last: int | None = None
    """--average-last N: the N newest complete checkpoints."""
    tags: tuple[str, ...] = ()
    """--average TAG,TAG,...: these checkpoints (any order; each once)."""

    @classmethod
    def from_flags(cls, average_last: int | None, average: str | None, tag: str | None) -> "AverageRequest | None":
        """None when neither flag is given; UserError for a combination that means nothing."""
        if average_last is None and average is None:
            return None
        flag = "--average-last" if average_last is not None else "--average"
        if tag is not None:
            raise UserError(f"--tag {tag} with {flag}: an averaged export is of several checkpoints; name them "
                            f"with --average TAG,TAG,... (or drop --tag)")
        if average_last is not None and average is not None:
            raise UserError("--average-last and --average: give one of them")
        if average_last is not None:
            if average_last < 1:
                raise UserError(f"--average-last {average_last}: must be >= 1")
            return cls(last=average_last)
        tags = tuple(t.strip() for t in average.split(","))
        if not tags or any(not t for t in tags):
            raise UserError(f"--average {average!r}: expected TAG,TAG,... (no empty names)")
        repeated = sorted({t for t in tags if tags.count(t) > 1})
        if repeated:
            raise UserError(f"--average {average}: {', '.join(repeated)} named twice (each checkpoint counts once)")
        return cls(tags=tags)


@dataclass(frozen=True)
class AveragedCheckpoint:
    """One checkpoint of an averaged export, as the model card and export_info.json list it."""

    tag: str
    step: int
    stage: str
    sidecar_sha256: str
    """sha256 of its sidecar.json, which records the size and sha256 of every file of the checkpoint."""

    @classmethod
    def of(cls, ref: CheckpointRef) -> "AveragedCheckpoint":
        return cls(ref.tag, ref.sidecar.step, ref.sidecar.stage_name, file_sha256(sidecar_path(ref.path)))

    def to_dict(self) -> dict:
        return {"tag": self.tag, "step": self.step, "stage": self.stage, "sidecar_sha256": self.sidecar_sha256}


def select_checkpoints(run_dir: Path, request: AverageRequest) -> list[CheckpointRef]:
    """The checkpoints to average, oldest first, each verified (resolve_checkpoint) and checked to be of
    one model (`check_same_model`); UserError naming the flag, tag or field otherwise."""
    layout = RunDir(Path(run_dir))
    tags = list(request.tags)
    if request.last is not None:
        tags = _newest_complete(layout, request.last)
    refs = sorted((resolve_checkpoint(layout.root, tag) for tag in tags), key=lambda ref: ref.sidecar.step)
    check_same_model(refs)
    return refs


def _newest_complete(layout: RunDir, count: int) -> list[str]:
    if not layout.root.is_dir():
        raise UserError(f"{layout.root}: run directory not found")
    complete = CheckpointCatalogue.scan(layout).complete()  # oldest first; resolve_checkpoint verifies each
    if count > len(complete):
        have = ", ".join(s.tag for s in complete) or "none"
        raise UserError(f"--average-last {count}: {layout.checkpoints} holds only {len(complete)} complete "
                        f"checkpoint{'s' if len(complete) != 1 else ''} ({have})")
    return [s.tag for s in complete[-count:]]


def check_same_model(refs: list[CheckpointRef]) -> None:
    """Averaging mixes weights element by element: only checkpoints of one architecture, trained with one
    tokenizer (the same token ids) and at one RoPE base, mean something together."""
    first = refs[0]
    try:
        base = saved_model_config(first.path, first.sidecar)
        for ref in refs[1:]:
            other = saved_model_config(ref.path, ref.sidecar)
            differing = base.diff(other)
            if differing:
                name = differing[0]
                raise UserError(f"{sidecar_path(ref.path)}: model_config.{name} {getattr(other, name)!r} differs from "
                                f"{getattr(base, name)!r} of {first.tag}: checkpoints of different models cannot be "
                                f"averaged")
    except ConfigError as err:
        raise UserError(str(err)) from None
    for ref in refs[1:]:
        for field, mine, theirs in (("tokenizer_sha256", ref.sidecar.tokenizer_sha256, first.sidecar.tokenizer_sha256),
                                    ("rope_theta", effective_rope_theta(ref.sidecar), effective_rope_theta(first.sidecar))):
            if mine != theirs:
                raise UserError(f"{sidecar_path(ref.path)}: {field} {mine} differs from {theirs} of {first.tag}: "
                                f"checkpoints trained with another {field.split('_')[0]} cannot be averaged")


def averaged_fp32(refs: list[CheckpointRef]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' consolidated fp32 weights (float64 sums, one checkpoint in
    memory at a time besides the sums). Non-float tensors (buffers) must be equal in all of them."""
    import torch

    sums: dict[str, torch.Tensor] = {}
    for index, ref in enumerate(refs):
        state = consolidate_fp32(ref)
        if index and set(state) != set(sums):
            odd = sorted(set(state) ^ set(sums))
            raise UserError(f"{ref.path}: weights {odd[:3]} are not in every averaged checkpoint")
        for name, tensor in state.items():
            if not tensor.is_floating_point():
                if index and not torch.equal(sums[name], tensor):
                    raise UserError(f"{ref.path}: buffer {name} differs from {refs[0].tag}'s; cannot average")
                sums.setdefault(name, tensor)
            elif index == 0:
                sums[name] = tensor.to(torch.float64)
            elif tensor.shape != sums[name].shape:
                raise UserError(f"{ref.path}: weight {name} has shape {tuple(tensor.shape)}, "
                                f"{tuple(sums[name].shape)} in {refs[0].tag}")
            else:
                sums[name] += tensor
        del state
    return {name: (total / len(refs)).to(torch.float32) if total.is_floating_point() else total
            for name, total in sums.items()}
