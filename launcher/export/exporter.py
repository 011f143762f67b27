"""`roformer export RUN_DIR [--tag TAG] --out DIR`: a checkpoint as a transformers RoFormer directory.

A `position_encoding: learned` run exports a BERT (launcher/export/bert_export.py); `--average-last N` /
`--average TAG,...` export the mean of several checkpoints (launcher/checkpoint/weights.py). The directory
is written into a hidden temporary directory next to DIR, checked against our model's logits, flushed,
and only then swapped into place; the tokenizer must be the one the checkpoint was trained with. What the
directory holds, its position-table size and the tokenizer check: docs/training.md, "Exporting".
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from launcher.export.bert_export import (bert_max_positions, bert_model_card, check_bert_parity, check_export_format,
                                          exports_as_bert, write_weights)
from launcher.export.export_reader import EXPORT_INFO
from launcher.export.parity import check_logits
from launcher.export.model_card import render_model_card, run_stages, trained_length
from launcher.export.sentence_transformers_files import write_sentence_transformers_files
from launcher.common.errors import UserError
from launcher.common.io import file_sha256, fsync_dir
from launcher.outputs.output_paths import EXPORT, check_replaceable, remove_dead_leftovers
from launcher.run_dir.layout import SIDECAR_NAME, RunDir, sidecar_path
from launcher.run_dir.records import describe_start, files_in_effect
from data_pipeline.errors import DataError
from data_pipeline.manifest import MANIFEST
from data_pipeline.remote.client import RemoteOptions
from data_pipeline.remote.url import is_remote
from launcher.checkpoint.catalogue import effective_rope_theta, saved_model_config
from launcher.checkpoint.weights import (AveragedCheckpoint, averaged_fp32, consolidate_fp32, resolve_checkpoint,
                                         select_checkpoints)
from launcher.common.size_checks import check_rope_table

if TYPE_CHECKING:  # torch is imported where it is used: `roformer export --help` must not wait for it
    import torch

    from launcher.checkpoint.weights import AverageRequest, CheckpointRef

# transformers' RoPE table is at least this long (its RoFormer default; the paper's longest stage).
MIN_MAX_POSITIONS = 1536
# ... and at least this many times the longest length the checkpoint was trained at.
MAX_POSITIONS_PER_TRAINED_LENGTH = 4


def export_checkpoint(run_dir: Path, out: Path, tag: str | None = None, tokenizer_from: Path | None = None,
                      verify: bool = True, max_positions: int | None = None,
                      average: AverageRequest | None = None) -> Path:
    """Write the export of RUN_DIR's checkpoint `tag` (default latest) to `out`; returns `out`.
    `max_positions`: transformers' RoPE table size (None: see default_max_positions). `average`: export
    the mean of those checkpoints' weights instead (launcher/checkpoint/weights.py); the newest
    of them stands for the training state, stages and tokenizer in the card."""
    from roformer import RoFormerForMaskedLM

    run_dir, out = Path(run_dir), Path(out)
    _check_destination(out, run_dir)
    refs = select_checkpoints(run_dir, average) if average is not None else [resolve_checkpoint(run_dir, tag)]
    ref = refs[-1]  # the newest
    model_config = saved_model_config(ref.path, ref.sidecar)
    for each in refs:
        check_stage_rope_theta(each)
    check_export_format(model_config)  # e.g. linear attention has no transformers counterpart
    as_bert = exports_as_bert(model_config)  # a learned-position run is a BERT (launcher/export/bert_export.py)
    stages = run_stages(ref.run_dir, ref.sidecar.step)
    if as_bert:  # the learned table's own length
        max_positions = bert_max_positions(model_config, max_positions)
    else:
        max_positions = _max_positions(max_positions, trained_length(ref.sidecar, stages))
        check_rope_table("--max-positions", max_positions, model_config.hidden_size, model_config.num_attention_heads)
    tokenizer_source = _tokenizer_source(ref, tokenizer_from)

    averaged = [AveragedCheckpoint.of(each) for each in refs] if average is not None else None
    state = averaged_fp32(refs) if average is not None else consolidate_fp32(ref)
    model = RoFormerForMaskedLM(model_config)
    _load_exact(model, state, ref)
    model.eval()

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_leftovers(out)  # a killed export's temporary directories
    if os.path.ismount(out):  # an empty mount point (the gate refuses a full one): written into, it cannot be swapped
        tmp = out / f".partial-{os.getpid()}"  # a dead writer's is removed like data prepare's
        tmp.mkdir()
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        write_weights(model, tmp, max_positions)
        _copy_tokenizer(tokenizer_source, tmp)
        # SentenceTransformer(export) truncates at the longest length trained (transformers' limit without one).
        write_sentence_transformers_files(tmp, model_config.hidden_size,
                                          min(trained_length(ref.sidecar, stages) or max_positions, max_positions))
        card = render_model_card(ref.sidecar, stages, ref.tag, run_dir, max_positions,
                                 started_from=describe_start(ref.run_dir), averaged=averaged)
        (tmp / "README.md").write_text(bert_model_card(card, max_positions) if as_bert else card, encoding="utf-8")
        _write_export_info(tmp, ref, stages, max_positions, averaged)
        if verify:
            (check_bert_parity if as_bert else check_transformers_parity)(tmp, model)
        _fsync_tree(tmp)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out.parent)  # the swap itself survives a power loss
    return out


def default_max_positions(trained: int | None) -> int:
    return max(MIN_MAX_POSITIONS, MAX_POSITIONS_PER_TRAINED_LENGTH * (trained or 0))


def _max_positions(requested: int | None, trained: int | None) -> int:
    if requested is None:
        return default_max_positions(trained)
    if trained is not None and requested < trained:
        raise UserError(f"--max-positions {requested}: shorter than the {trained} tokens this checkpoint was "
                        f"trained at; transformers could not even run it at its training length")
    if requested < 2:
        raise UserError(f"--max-positions {requested}: must be >= 2 ([CLS] plus one token)")
    return requested


# --------------------------------------------------------------------------- checks


def check_stage_rope_theta(ref: CheckpointRef) -> None:
    """A schedule stage may have changed RoPE's base (launcher/config/schedule.py, rope_theta);
    transformers' RoFormer has no such setting (its sinusoidal table always uses base 10000), so a
    checkpoint trained last at another base is refused here rather than exported into a directory
    that transformers would silently run with the wrong rotation."""
    theta = effective_rope_theta(ref.sidecar)
    if theta is not None and theta != 10000.0 and ref.sidecar.rope_theta is not None:
        raise UserError(f"{ref.path}/{SIDECAR_NAME}: rope_theta {theta:g} (stage '{ref.sidecar.stage_name}'): "
                        f"transformers' RoFormer fixes RoPE's base at 10000, so this checkpoint cannot be exported; "
                        f"export a checkpoint of a stage at 10000 (--tag), or evaluate this one from the run "
                        f"directory (python -m launcher.reproduce.checkpoint_mlm)")


def _check_destination(out: Path, run_dir: Path) -> None:
    """Only ever replace a previous export (launcher/outputs/output_paths.py): never a run directory, its
    checkpoints or an unrelated folder, nor a previous export's extra files (the user's)."""
    resolved_out, resolved_run = out.resolve(), run_dir.resolve()
    if resolved_out == resolved_run or resolved_out in resolved_run.parents:
        raise UserError(f"--out {out}: would replace the run directory {run_dir}")
    if resolved_out.is_relative_to(resolved_run / "checkpoints"):
        raise UserError(f"--out {out}: inside the run's checkpoints directory")
    check_replaceable("--out", out, EXPORT)


def _load_exact(model: torch.nn.Module, state: dict[str, torch.Tensor], ref: CheckpointRef) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise UserError(f"{ref.path}: checkpoint weights do not match model_config of sidecar.json: "
                        f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                        f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise UserError(f"{ref.path}: weight {name} has shape {tuple(tensor.shape)}, "
                            f"model_config expects {tuple(expected[name].shape)}")
    model.load_state_dict(state, strict=True)


def check_transformers_parity(export_dir: Path, model: torch.nn.Module) -> float:
    """Reload the export with transformers' own RoFormer and compare logits; returns max |diff|."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    hf = transformers.RoFormerForMaskedLM.from_pretrained(str(export_dir)).eval()
    table = hf.roformer.encoder.embed_positions.weight.shape[0]
    if table != hf.config.max_position_embeddings:
        raise UserError(f"{export_dir}: transformers built a RoPE table of {table} positions, config.json says "
                        f"{hf.config.max_position_embeddings}; export aborted, nothing replaced")
    return check_logits(model, hf, export_dir, "transformers' RoFormer")


# --------------------------------------------------------------------------- pieces


def _tokenizer_source(ref: CheckpointRef, override: Path | None) -> Path:
    if override is not None:
        source = Path(override)
        origin = "--tokenizer-from"
    else:
        config = files_in_effect(ref.run_dir, ref.sidecar.step)["config"]
        data = run_data_section(ref.run_dir.root, ref.sidecar.step)
        data_dir = data.get("data_dir")
        if not data_dir:
            raise UserError(f"{config}: no data.data_dir recorded; pass --tokenizer-from DATA_DIR")
        source, origin = Path(data_dir), f"data.data_dir of {config}"
        if is_remote(data_dir):  # the tokenizer files of the node's cached copy (fetched if missing)
            from data_pipeline.remote.dataset import open_remote

            source = open_remote(data_dir, RemoteOptions.from_data_section(data)).root
    if not source.is_dir():
        raise UserError(f"tokenizer missing: {source} ({origin}) does not exist; pass --tokenizer-from DATA_DIR")
    _check_trained_tokenizer(ref, source, origin)
    return source


def _check_trained_tokenizer(ref: CheckpointRef, source: Path, origin: str) -> None:
    """Refuse a tokenizer other than the one the checkpoint was trained with (see module docstring)."""
    from data_pipeline import open_corpus
    from data_pipeline.tokenizer import resolve_model_path, tokenizer_hash

    # The file copy_hf_tokenizer_files packs: spm.model, else tokenizer.json, else vocab.txt (the fingerprint).
    try:
        spm = resolve_model_path(source)
    except DataError:
        return  # reported by _copy_tokenizer, naming the missing files
    recorded, sidecar = ref.sidecar.tokenizer_sha256, sidecar_path(ref.path)
    if recorded is not None:
        actual = tokenizer_hash(spm)
        if actual != recorded:
            raise UserError(f"{spm} ({origin}): tokenizer sha256 {actual} is not the one checkpoint {ref.tag} was "
                            f"trained with ({recorded}, recorded in {sidecar}); pass --tokenizer-from the data "
                            f"dir the run was trained on")
        return
    if origin == "--tokenizer-from" or not (source / MANIFEST).is_file():
        return  # format 1 without a prepared data dir to compare: the user's choice
    try:
        fingerprint = open_corpus(source, split="train", verify=False).fingerprint
    except DataError:
        return  # shards gone: nothing to compare the tokenizer with
    trained = (ref.sidecar.data_state or {}).get("corpus")
    if trained is not None and fingerprint != trained:
        raise UserError(f"{source} ({origin}): corpus fingerprint {fingerprint} is not the one checkpoint {ref.tag} "
                        f"was trained on ({trained}, data_state.corpus in {sidecar}), so its tokenizer {spm} may "
                        f"differ too; pass --tokenizer-from the data dir the run was trained on")


def _copy_tokenizer(source: Path, dest: Path) -> None:
    """From a prepared data dir or a tokenizer dir (spm.model + transformers files, e.g. an export)."""
    from data_pipeline import copy_hf_tokenizer_files

    try:
        copy_hf_tokenizer_files(source, dest)
    except DataError as err:
        raise UserError(f"tokenizer missing: {err}") from None


def run_data_section(run_dir: Path, step: int | None = None) -> dict:
    """The `data` section of the run's config (the version in effect at `step`, default the latest:
    launcher/run_dir/records.py) as written there; {} when there is none."""
    path = files_in_effect(RunDir(Path(run_dir)), 10**18 if step is None else step)["config"]
    data = (_read_run_config(path) or {}).get("data")
    return data if isinstance(data, dict) else {}


def _read_run_config(path: Path) -> dict | None:
    """A run's config.yaml as plain YAML: only data.data_dir is needed, and an export must not fail
    because the schedule or DeepSpeed files the run config names have moved since."""
    if not path.is_file():
        return None
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {err}") from None
    return loaded if isinstance(loaded, dict) else None


def _write_export_info(export_dir: Path, ref: CheckpointRef, stages: list[dict] | None, max_positions: int,
                       averaged: list[AveragedCheckpoint] | None = None) -> None:
    files = {p.relative_to(export_dir).as_posix(): file_sha256(p) for p in sorted(export_dir.rglob("*")) if p.is_file()}
    reached = [s["max_seq_len"] for s in stages or [] if s["reached"]]
    info = {
        "format": "roformer-ds-export",
        "version": 1,
        "run_dir": str(ref.run_dir.root.resolve()),
        "tag": ref.tag,
        "step": ref.sidecar.step,
        "stage": ref.sidecar.stage_name,
        "stage_index": ref.sidecar.stage_index,  # 0-based
        "max_seq_len_trained": max(reached) if reached else None,
        "max_positions": max_positions,  # transformers' limit (config.json max_position_embeddings)
        "sha256": files,
    }
    if averaged is not None:  # the weights are the mean of these (tag/step above: the newest of them)
        info["averaged"] = [each.to_dict() for each in averaged]
    (export_dir / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- atomic placement


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_dir():  # the sentence-transformers pooling config (1_Pooling/)
            path.chmod(0o755)
            _fsync_tree(path)
            continue
        path.chmod(0o644)  # some writers create 0600 files; an export is shared read-only
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Make `tmp` appear at `out` in one step; the previous export (if any) is deleted afterwards. Into an
    empty mount point (tmp inside it): file by file, export_info.json last, so it reads as an export only whole."""
    if tmp.parent == out:
        for entry in sorted(tmp.iterdir(), key=lambda p: p.name == EXPORT_INFO):
            os.rename(entry, out / entry.name)
        tmp.rmdir()
        return
    if not out.exists():
        os.rename(tmp, out)
        return
    if not _rename_exchange(tmp, out):
        # No atomic exchange on this filesystem: move the old export aside first. A crash between
        # the two renames leaves it intact at `.NAME.old-*`, never a half-written directory at `out`.
        aside = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, aside)
        os.rename(tmp, out)
        tmp = aside
    shutil.rmtree(tmp, ignore_errors=True)  # now holds the previous export


def _rename_exchange(a: Path, b: Path) -> bool:
    """Linux renameat2(RENAME_EXCHANGE): swap two paths atomically. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange)
    return result == 0
