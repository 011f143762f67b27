"""Saving and loading a run's checkpoints, all ranks together: DeepSpeed's files, this rank's random
generators, the sidecar written last by rank 0; retention; and what a save that cannot be written says.
Which checkpoint a start comes from is decided before (launcher/checkpoint/resume.py).

Durability: every file of a save is fsynced (each rank its share, while hashing it), then the directory,
before the sidecar marks it complete and `latest` moves: a power loss leaves at worst an incomplete
checkpoint, never a "complete" one with missing bytes.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import deepspeed.comm as dist
import numpy as np
import torch
from deepspeed.accelerator import get_accelerator

from launcher.checkpoint.catalogue import (FOREIGN, PARTIAL, CheckpointCatalogue, CheckpointEntry, CheckpointSidecar,
                                           entry_of, file_shares, move_aside, owned_files, record_files,
                                           write_save_record, write_sidecar)
from launcher.config.stages import ResolvedStage
from launcher.config.run_shape import RunShape
from launcher.deepspeed_env.engine_state import loss_scale, seed_everything
from launcher.common.errors import UserError
from launcher.common.io import atomic_torch_save, atomic_write_text, fsync_dir, write_line
from launcher.run_dir.layout import RunDir, rng_path, tag_for_step
from roformer.config import RoFormerConfig


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (full disk, quota, I/O error): its partial directory was
    removed, the previous checkpoint and `latest` are as they were; the message says so in one line."""


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class CheckpointedRun:
    """What every checkpoint of a run records besides the saved states, and where the run's checkpoints go."""

    run_dir: RunDir
    rank: int
    shape: RunShape
    """The engine's ZeRO stage, precision and world size (recorded in every sidecar)."""
    model_config: RoFormerConfig
    total_steps: int
    """The schedule's end (recorded: a resume at it has nothing to do)."""
    keep_last: int
    """checkpoint.keep_last: how many checkpoints retention keeps."""
    tokenizer_sha256: str | None = None
    """The data's tokenizer (recorded in every sidecar: export packs this tokenizer only)."""


class Checkpointer:
    """Saves and loads the named states of a run (torchtitan-style), all ranks together:

    "model"  the DeepSpeed engine (weights, optimizer, loss scaler), one file set per rank;
    "train"  the loop's counters and "data" the data position: the same on every rank, in the sidecar;
    "rng"    this rank's random generators (rng_rank<r>.pt);
    "noise"  the gradient noise scale's running state (the same on every rank, in the sidecar), when measured.
    """

    def __init__(self, run: CheckpointedRun, engine, train: Stateful, data: Stateful, noise: Stateful | None = None):
        """run: what every save records and where it goes; train, data: the loop's counters and the data position;
        noise: the gradient noise probe (launcher/train/noise_probe.py), None when the run measures none."""
        self.run, self.engine, self.train, self.data, self.noise = run, engine, train, data, noise
        self.run_dir, self.rank, self.world_size = run.run_dir, run.rank, run.shape.world_size
        self.named: set[str] = set()
        """Folders of checkpoints/ that are not ours, named in the log already (once each)."""

    def save(self, stage: ResolvedStage, protect_steps: Iterable[int] = ()) -> str:
        """All ranks write, barrier, then rank 0 marks the checkpoint complete, moves `latest` and prunes
        to keep_last, never the checkpoints of `protect_steps` (CheckpointCatalogue.to_prune)."""
        train = self.train.state_dict()
        step, tag = train["step"], tag_for_step(train["step"])
        directory = self.run_dir.checkpoint(tag)
        blocked = clear_for_save(self.run_dir, directory, tag) if self.rank == 0 else None
        data_state = self.data.state_dict()
        gathered = [None] * self.world_size
        # Also the sync point after rank 0's clearing above: no rank writes into the directory before it.
        dist.all_gather_object(gathered, (data_state, blocked))  # the data position is global: all ranks agree
        if gathered[0][1] is not None:
            raise CheckpointWriteError(f"checkpoint {tag} not written: {gathered[0][1]}")
        states = [state for state, _ in gathered]
        if any(s != data_state for s in states):
            raise RuntimeError(f"data pipeline states differ between ranks at step {step}: {states}")
        sidecar = CheckpointSidecar(
            tag=tag, stage_index=stage.index, stage_name=stage.name, step_in_stage=step - stage.stage_first_step,
            stage_complete=step == stage.stage_end_step, **train, data_state=data_state,
            model_config=self.run.model_config.to_dict(), world_size=self.world_size, loss_scale=loss_scale(self.engine),
            skipped_steps=int(self.engine.skipped_steps), zero_stage=self.run.shape.zero_stage,
            precision=self.run.shape.precision, total_steps=self.run.total_steps,
            tokenizer_sha256=self.run.tokenizer_sha256,
            rope_theta=stage.rope_theta, mask_prob=stage.mask_prob, mixture=stage.mixture_dict,
            noise_scale=None if self.noise is None else self.noise.state_dict())
        failure = self._agree(self._write_files(directory, tag, sidecar))  # also the barrier after the writes
        if failure is None:
            sidecar.files = self._record_files(directory)
            failure = self._agree(self._mark_complete(directory, tag, sidecar) if self.rank == 0 else None)
        if failure is not None:
            self._abandon(directory, tag, failure)  # raises CheckpointWriteError on every rank
        if self.rank == 0:
            prune(self.run_dir, self.run.keep_last, protect_steps, named=self.named)
        dist.barrier()
        return tag

    # A save that cannot be written (a full disk, a quota, an I/O error) must not kill the ranks one by
    # one inside DeepSpeed, leave a partial directory or move `latest`: every rank reports how its own
    # writes went, all agree (_agree), and on any failure the partial checkpoint is removed and the job
    # ends with one line; the previous checkpoint and `latest` are never touched by a save.

    def _write_files(self, directory: Path, tag: str, sidecar: CheckpointSidecar) -> str | None:
        """This rank's DeepSpeed files and RNG state; None, or what failed (one line)."""
        try:
            self.engine.save_checkpoint(str(self.run_dir.checkpoints), tag=tag,
                                        client_state={"roformer_ds": sidecar.to_dict()}, save_latest=False)
        except (OSError, RuntimeError) as err:  # torch.save reports ENOSPC as a RuntimeError of its zip writer
            # DeepSpeed's save ends with a barrier the ranks whose writes succeeded are waiting in; its other
            # collectives all come before the first write.
            dist.barrier()
            return write_failure(self.rank, err, directory)
        try:
            save_rng(directory, self.rank)
        except (OSError, RuntimeError) as err:
            return write_failure(self.rank, err, directory)
        return None

    def _mark_complete(self, directory: Path, tag: str, sidecar: CheckpointSidecar) -> str | None:
        """Rank 0: fsync, the sidecar (the completion marker, only now), then `latest`; None, or what failed."""
        try:
            fsync_dir(directory)
            fsync_dir(self.run_dir.checkpoints)
            write_sidecar(directory, sidecar)
            atomic_write_text(self.run_dir.latest, tag)
        except OSError as err:
            return write_failure(self.rank, err, directory)
        return None

    def _agree(self, failure: str | None) -> str | None:
        """All ranks: the first rank's failure (the same text on every rank), or None when none failed."""
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, failure)
        return next((f for f in gathered if f is not None), None)

    def _abandon(self, directory: Path, tag: str, failure: str) -> None:
        """All ranks: rank 0 removes the partial checkpoint (sidecar first), then every rank raises."""
        if self.rank == 0:
            remove_checkpoint(entry_of(directory))  # ours: this save wrote its record first
            fsync_dir(self.run_dir.checkpoints)
        dist.barrier()
        raise CheckpointWriteError(abandoned_save_message(self.run_dir, tag, failure))

    def _record_files(self, directory: Path) -> dict[str, dict]:
        """All ranks: rank 0 splits the written files into shares of about equal bytes, each rank
        fsyncs and hashes its share, rank 0 gets every record (the others get their own)."""
        shares = [file_shares(directory, self.world_size) if self.rank == 0 else None]
        dist.broadcast_object_list(shares, src=0)
        mine = record_files(directory, shares[0][self.rank])
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        records = {}
        for share in gathered:
            records.update(share)
        return dict(sorted(records.items()))

    def load(self, source: CheckpointEntry, seed: int, universal_folder: Path | None = None) -> None:
        """Every state from checkpoint `source` (of this run, or of another run that is only read), or from
        its conversion `universal_folder` (RUN_DIR/universal/<tag>) when the shape changed
        (launcher/checkpoint/resume.py ResumePlan)."""
        universal = universal_folder is not None
        load_dir = universal_folder.parent if universal else source.path.parent
        own_scaler = _loss_scaler_state(self.engine.optimizer)
        own_decay = [group["weight_decay"] for group in self.engine.optimizer.param_groups]
        path, client_state = self.engine.load_checkpoint(str(load_dir), tag=source.tag)
        if universal:
            # DeepSpeed's ZeRO-3 universal load gives every parameter group the FIRST saved group's
            # hyper-parameters (stage3.py load_hp_checkpoint_state_from_checkpoint_dir_stage3): biases and
            # LayerNorm would get weight decay. Each group's decay is the engine's (engine.py build_engine).
            for group, decay in zip(self.engine.optimizer.param_groups, own_decay):
                group["weight_decay"] = decay
            _own_step_counters(self.engine.optimizer)
        if source.sidecar.precision != self.run.shape.precision:
            # DeepSpeed installs the checkpoint's loss scaler whatever the precision (a static scale of 1
            # from fp32 / bf16 into an fp16 run; fp16's dynamic scaler into a bf16 / fp32 run): keep the
            # engine's own, fresh from this run's config (resume.shape_notes says so).
            _set_loss_scaler_state(self.engine.optimizer, own_scaler)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {load_dir / source.tag}")
        saved_step = (client_state or {}).get("roformer_ds", {}).get("step")
        if saved_step != source.sidecar.step:
            raise RuntimeError(f"{source.path}: sidecar step {source.sidecar.step} does not match the DeepSpeed "
                               f"checkpoint's client state step {saved_step}")
        sidecar = source.sidecar
        self.train.load_state_dict({"step": sidecar.step, "consumed_samples": sidecar.consumed_samples,
                                    "consumed_tokens": sidecar.consumed_tokens,
                                    "last_validation": sidecar.last_validation})
        self.data.load_state_dict(sidecar.data_state)
        if self.noise is not None:  # {}: a checkpoint without the state starts the smoothing afresh
            self.noise.load_state_dict(sidecar.noise_scale or {})
        restore_rng(source.path, self.rank, sidecar.world_size == self.world_size,
                    fresh_seed=seed * 1009 + self.rank + 7919 * sidecar.step)


# What DeepSpeed's ZeRO optimizers load from a checkpoint as their loss scaling (stage_1_and_2.py
# _load_global_state, stage3.py _load_global_state_stage3).
_LOSS_SCALER_ATTRIBUTES = ("loss_scaler", "dynamic_loss_scale", "overflow")


def _loss_scaler_state(optimizer) -> dict:
    return {name: getattr(optimizer, name) for name in _LOSS_SCALER_ATTRIBUTES if hasattr(optimizer, name)}


def _set_loss_scaler_state(optimizer, state: dict) -> None:
    for name, value in state.items():
        setattr(optimizer, name, value)


def _own_step_counters(optimizer) -> None:
    """DeepSpeed's ZeRO-3 universal load puts ONE step tensor into the Adam state of every parameter
    group; torch's Adam(W) increments it in place once per group and step, so bias correction would run
    ahead (losses 1e-5 off the uninterrupted run one step later). Each state gets its own counter."""
    base = getattr(optimizer, "optimizer", optimizer)
    for state in base.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()


def prune(run_dir: RunDir, keep_last: int, protect_steps: Iterable[int] = (),
          named: set[str] | None = None) -> list[str]:
    """Delete what keep_last retention drops (CheckpointCatalogue.to_prune), only the files its records name;
    returns the deleted tags. A folder that is not ours is left in place and named in the log once (`named`:
    the names said already, updated), as is what a user added to one of ours."""
    catalogue = CheckpointCatalogue.scan(run_dir)
    doomed = catalogue.to_prune(keep_last, protect_steps)
    named = set() if named is None else named
    for entry in doomed:
        left = remove_checkpoint(entry)
        if left:
            write_line(f"pretrain: checkpoint {entry.tag} removed by checkpoint.keep_last; {entry.path} kept for "
                       f"what its save did not write: {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}")
            named.add(entry.tag)
    for entry in catalogue.foreign():
        if entry.tag not in named:
            named.add(entry.tag)
            write_line(f"pretrain: {entry.problem}: left in place (never pruned, resumed or set aside)")
    return [e.tag for e in doomed]


def remove_checkpoint(entry: CheckpointEntry) -> list[str]:
    """Delete what the save of `entry` wrote (catalogue.owned_files: the sidecar first, so a crash on the way
    leaves a partial save; the save record last), then its folder when nothing else is in it. Returns the names
    left in it (files a user put there), [] when the folder is gone."""
    for path in owned_files(entry):
        path.unlink(missing_ok=True)
    try:
        entry.path.rmdir()
    except FileNotFoundError:
        return []
    except OSError:
        return sorted(p.name for p in entry.path.iterdir())
    return []


def clear_for_save(run_dir: RunDir, directory: Path, tag: str) -> str | None:
    """Rank 0, before a save of `tag`: what an interrupted run that got further left there goes (a partial save
    of ours removed, one with a sidecar moved aside: never deleted), then the save record is written. None when
    the save may write there; else why not, one line (a folder this run did not write, left as it is)."""
    if directory.exists():
        entry = entry_of(directory)
        if entry.state == FOREIGN:
            return f"{entry.problem}: move it out of {run_dir.checkpoints} (a save of step {entry.step} writes there)"
        if entry.state != PARTIAL:  # complete, damaged or newer: claims to be complete, never deleted
            move_aside(run_dir, directory)
        elif left := remove_checkpoint(entry):
            return f"{directory} holds files a save did not write ({', '.join(left[:3])}): move them out of it"
    write_save_record(directory, tag)
    return None


# --------------------------------------------------------------------------- a save that failed


FULL_BELOW_BYTES = 1 << 20
"""A failed write with less than this free on its filesystem is reported as a full disk."""


def write_failure(rank: int, err: BaseException, directory: Path) -> str:
    """One line for a failed write of `rank` into `directory`: an OSError's strerror and file, else the
    error's first line. torch.save's zip writer does not pass the errno on (a full disk reads
    "[enforce fail at inline_container.cc:672] . unexpected pos 11648 vs 11542"), so the free space of
    the filesystem, taken now, says whether it was full."""
    if isinstance(err, OSError) and err.strerror:
        text = f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    else:
        text = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
    try:
        free = shutil.disk_usage(directory if directory.exists() else directory.parent).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        text = f"the filesystem is full ({free / 1e3:,.0f} kB free): {text}"
    return f"rank {rank}: {text}"


def abandoned_save_message(run_dir: RunDir, tag: str, failure: str) -> str:
    """What a save that was given up says: what failed, the free space, what is left to resume from."""
    try:
        free = f"; {shutil.disk_usage(run_dir.checkpoints).free / 1e6:,.1f} MB free there now"
    except OSError:
        free = ""
    try:
        latest = run_dir.latest.read_text().strip()
        left = f"checkpoints/latest still names {latest}, untouched: free space, then run the same command to resume"
    except OSError:
        left = "there is no earlier complete checkpoint: free space, then run the same command to start again"
    return (f"checkpoint {tag} could not be written to {run_dir.checkpoints} ({failure}{free}); its partial files "
            f"were removed and {left}")


# --------------------------------------------------------------------------- random generators
# Saved per rank as checkpoints/<tag>/rng_rank<r>.pt in plain types only, so they load back with
# torch.load(weights_only=True).


def save_rng(checkpoint_dir: Path, rank: int) -> None:
    python, numpy_state = random.getstate(), np.random.get_state()
    portable = {"python": [python[0], list(python[1]), python[2]],
                "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
                "torch_cpu": torch.get_rng_state(), "accelerator": get_accelerator().get_rng_state()}
    atomic_torch_save(portable, rng_path(checkpoint_dir, rank))


def load_rng(checkpoint_dir: Path, rank: int) -> bool:
    """Restore this rank's generators; False when the checkpoint has none for this rank (other world size)."""
    path = rng_path(checkpoint_dir, rank)
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


def restore_rng(checkpoint_dir: Path, rank: int, same_world_size: bool, fresh_seed: int) -> None:
    """This rank's generators as the checkpoint saved them; fresh streams from `fresh_seed` when it was
    written at another world size (its ranks' streams are not this one's) or holds none for this rank."""
    if not (same_world_size and load_rng(checkpoint_dir, rank)):
        seed_everything(fresh_seed)
