"""Export of bad input fails with one clear line naming the problem, and never touches a good export.

Each test damages a COPY of a real 2-rank ZeRO-2 run directory (the stored one, tests/fixtures/README.md:
no DeepSpeed job is started here), runs `roformer export` through the CLI entry point (exit code 2 +
message on stderr), and checks the previous export at --out is byte-for-byte what it was. The
ZeRO-3 case is in test_export.py, next to its run.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import launcher.export.exporter as export_module
from launcher.cli import main as cli_main
from tests.support.helpers import REPO, roformer_env

TAG2 = "global_step5"  # the stored run's checkpoint


def _tree_digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def run_copy(stored_run, stored_export, tmp_path):
    """A private copy of the ZeRO-2 run, and a good export of it already sitting at `out`."""
    run_dir = tmp_path / "run"
    shutil.copytree(stored_run, run_dir)
    out = tmp_path / "exports" / "model"
    shutil.copytree(stored_export, out)
    return run_dir, out


def _export_fails(capsys, run_dir: Path, out: Path, *extra: str) -> str:
    before = _tree_digest(out) if out.is_dir() else None
    capsys.readouterr()  # drop what fixtures printed
    rc = cli_main(["export", str(run_dir), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    # One line for the user (DeepSpeed's own progress lines may precede it).
    err = err.strip().splitlines()[-1]
    assert err.startswith("roformer export: error: "), err
    if before is not None:
        assert _tree_digest(out) == before  # the good export is untouched
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temp left
    return err


def test_missing_run_dir(capsys, tmp_path, run_copy):
    _, out = run_copy
    assert "run directory not found" in _export_fails(capsys, tmp_path / "nope", out)


def test_unknown_tag_lists_the_available_ones(capsys, run_copy):
    run_dir, out = run_copy
    err = _export_fails(capsys, run_dir, out, "--tag", "step999")
    assert "unknown checkpoint tag 'step999'" in err and f"available: {TAG2}" in err


def test_checkpoint_without_sidecar_is_partial(capsys, run_copy):
    run_dir, out = run_copy
    (run_dir / "checkpoints" / TAG2 / "sidecar.json").unlink()
    err = _export_fails(capsys, run_dir, out)
    assert "partial checkpoint" in err and "sidecar.json missing" in err


def test_missing_optimizer_shard_is_named(capsys, run_copy):
    run_dir, out = run_copy
    (run_dir / "checkpoints" / TAG2 / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    err = _export_fails(capsys, run_dir, out)
    assert "partial checkpoint" in err and "rank(s) 1 missing" in err


def test_missing_model_state_file(capsys, run_copy):
    run_dir, out = run_copy
    (run_dir / "checkpoints" / TAG2 / "mp_rank_00_model_states.pt").unlink()
    err = _export_fails(capsys, run_dir, out)
    assert "partial checkpoint: no model state file (mp_rank_00_model_states.pt" in err


def test_truncated_shard_is_reported_not_crashed_on(capsys, run_copy):
    run_dir, out = run_copy
    shard = run_dir / "checkpoints" / TAG2 / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    err = _export_fails(capsys, run_dir, out)
    assert "cannot consolidate checkpoint" in err and TAG2 in err


def test_missing_tokenizer(capsys, run_copy, tmp_path):
    run_dir, out = run_copy
    (run_dir / "config.yaml").write_text(f"data:\n  data_dir: {tmp_path / 'moved-away'}\n")
    err = _export_fails(capsys, run_dir, out)
    assert "tokenizer missing" in err and "moved-away" in err
    empty = tmp_path / "empty-tokenizer-dir"
    empty.mkdir()
    assert "tokenizer missing" in _export_fails(capsys, run_dir, out, "--tokenizer-from", str(empty))


def test_sidecar_marked_incomplete(capsys, run_copy):
    run_dir, out = run_copy
    path = run_dir / "checkpoints" / TAG2 / "sidecar.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "complete": False}))
    assert "the sidecar says the save is not complete" in _export_fails(capsys, run_dir, out)


def test_refuses_to_replace_a_directory_that_is_not_an_export(capsys, run_copy, tmp_path):
    run_dir, _ = run_copy
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert "not a previous export" in _export_fails(capsys, run_dir, precious)
    assert "would replace the run directory" in _export_fails(capsys, run_dir, run_dir)


def test_failure_late_in_the_export_keeps_the_old_one(capsys, run_copy, monkeypatch):
    """Everything but the final swap has happened (weights and tokenizer written) when this fails."""
    run_dir, out = run_copy

    def broken_parity(export_dir, model):
        assert (export_dir / "model.safetensors").is_file() and (export_dir / "tokenizer.json").is_file()
        raise export_module.UserError(f"{export_dir}: simulated failure before the swap")

    monkeypatch.setattr(export_module, "check_transformers_parity", broken_parity)
    assert "simulated failure" in _export_fails(capsys, run_dir, out)


def test_killed_export_leaves_old_export_and_next_export_cleans_up(run_copy):
    """SIGKILL in the middle of writing (the process stops itself once the weights are written)."""
    run_dir, out = run_copy
    before = _tree_digest(out)
    script = (
        "import os, signal, sys\n"
        "import roformer.hf_interop as h, launcher.export.exporter as e\n"
        "orig = h.write_pretrained_files\n"
        "def write_then_die(model, d, *a, **k):\n"
        "    orig(model, d, *a, **k); os.kill(os.getpid(), signal.SIGKILL)\n"
        "h.write_pretrained_files = write_then_die\n"
        f"e.export_checkpoint({str(run_dir)!r}, {str(out)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=roformer_env(), capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert _tree_digest(out) == before
    leftovers = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]
    assert leftovers and (leftovers[0] / "model.safetensors").is_file()  # the half-written one

    export_module.export_checkpoint(run_dir, out)  # a new export replaces the old one and sweeps up
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    assert json.loads((out / "export_info.json").read_text())["run_dir"] == str(run_dir.resolve())
    assert _tree_digest(out)["model.safetensors"] == before["model.safetensors"]  # same checkpoint
    assert os.access(out / "model.safetensors", os.R_OK)
