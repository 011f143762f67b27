"""Read a finished DeepSpeed checkpoint of a run as one fp32 state dict (for export).

A run directory holds `checkpoints/<tag>/` (DeepSpeed files + `sidecar.json`, written last by the
trainer, so its presence marks a complete save) and `checkpoints/latest` (the newest tag). The
weights are consolidated with DeepSpeed's own `deepspeed.utils.zero_to_fp32` for ZeRO 1/2/3 at any
world size; universal checkpoints (`ds_to_universal` output: `zero/<param>/fp32.pt`) and plain
(ZeRO-0) checkpoints are read directly.

Checkpoints are the run's own files: DeepSpeed's reader unpickles its `*_states.pt` files with
`weights_only=False` (they hold DeepSpeed objects), and so does the ZeRO-0 path here for the same
files. Universal `fp32.pt` files are plain tensors and are read with `weights_only=True`.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import torch

from launcher.errors import UserError
from launcher.run_dir.checkpoint_catalogue import CheckpointCatalogue, DamagedCheckpoint
from launcher.run_dir.layout import RunDir
from launcher.run_dir.sidecar import CheckpointSidecar


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
        state[name] = torch.load(fp32_file, map_location="cpu", weights_only=True)["param"]
    if not state:
        raise UserError(f"{zero_dir}: universal checkpoint without any */fp32.pt parameter file")
    return state


def _read_unpartitioned(tag_dir: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_model_state_file

    path = get_model_state_file(str(tag_dir), zero_stage=0)
    # A ZeRO-0 model state file also holds DeepSpeed objects (hence weights_only=False), and its
    # weights are in the training dtype: fp32 master weights exist only with ZeRO >= 1.
    return torch.load(path, map_location="cpu", weights_only=False)["module"]
