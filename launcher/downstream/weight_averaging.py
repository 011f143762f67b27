"""`roformer export RUN_DIR --average-last N` / `--average TAG,TAG,...`: the element-wise mean of several
checkpoints' fp32 weights (a merge of the end of a decay, as the mmBERT / Ettin recipes do).

Which checkpoints: the N newest complete ones (by step: launcher/run_dir/checkpoint_catalogue.py), or the
tags named. Every one is verified as a
single export's checkpoint is (sidecar complete, files' sizes and sha256 as recorded at save time,
launcher/downstream/checkpoint_weights.py) and consolidated the same way (zero_to_fp32 / universal /
ZeRO-0), one at a time, into a float64 running sum (the mean is exact to fp32 rounding whatever N).
They must be checkpoints of one model: same architecture (roformer.config.RoFormerConfig.diff), same
tokenizer sha256 and the same RoPE base at save time. Every refusal comes before anything is loaded.

The export's model card and export_info.json (`averaged`) list each checkpoint averaged: tag, step,
stage and the sha256 of its sidecar.json (which itself records every file's sha256).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError
from launcher.io import file_sha256
from launcher.run_dir.checkpoint_catalogue import CheckpointCatalogue
from launcher.run_dir.layout import RunDir, sidecar_path

if TYPE_CHECKING:
    import torch

    from launcher.downstream.checkpoint_weights import CheckpointRef


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
    from launcher.downstream.checkpoint_weights import resolve_checkpoint

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
    from launcher.run_dir.sidecar import effective_rope_theta, saved_model_config
    from roformer.config import ConfigError

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

    from launcher.downstream.checkpoint_weights import consolidate_fp32

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
