"""`roformer export --average-last N / --average TAG,...` on bad input: one line, exit code 2, nothing written.

Works on a copy of the stored 2-rank ZeRO-2 run (tests/fixtures/README.md, no DeepSpeed job) whose one
checkpoint is copied under two more tags (sidecar tag and step edited; a format-1 sidecar records no
checksums, so the copies verify). The averaging itself is checked on the real trainer's run
(tests/multirank/test_export_average.py).
"""
from __future__ import annotations

import json
import shutil

import pytest

from launcher.checkpoint.weights import AverageRequest
from launcher.common.errors import UserError
from tests.unit.test_export_errors import TAG2, _export_fails


@pytest.fixture
def three_checkpoints(stored_run, stored_export, tmp_path):
    """(run dir with global_step3, global_step4 and global_step5, a good export at `out`)."""
    run_dir = tmp_path / "run"
    shutil.copytree(stored_run, run_dir)
    for step in (3, 4):
        _copy_checkpoint(run_dir, f"global_step{step}", step=step)
    out = tmp_path / "exports" / "model"
    shutil.copytree(stored_export, out)
    return run_dir, out


def _copy_checkpoint(run_dir, tag: str, **changes) -> None:
    directory = run_dir / "checkpoints" / tag
    shutil.copytree(run_dir / "checkpoints" / TAG2, directory)
    _edit_sidecar(run_dir, tag, tag=tag, **changes)


def _edit_sidecar(run_dir, name: str, **changes) -> None:
    path = run_dir / "checkpoints" / name / "sidecar.json"
    sidecar = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "model_config":
            sidecar["model_config"].update(value)
        else:
            sidecar[key] = value
    path.write_text(json.dumps(sidecar))


def test_average_last_larger_than_the_checkpoints_present(capsys, three_checkpoints):
    run_dir, out = three_checkpoints
    (run_dir / "checkpoints" / "global_step4" / "sidecar.json").unlink()  # a partial save does not count
    err = _export_fails(capsys, run_dir, out, "--average-last", "3")
    assert "--average-last 3:" in err and "only 2 complete checkpoints (global_step3, global_step5)" in err


def test_average_names_a_missing_or_incomplete_tag(capsys, three_checkpoints):
    run_dir, out = three_checkpoints
    err = _export_fails(capsys, run_dir, out, "--average", "global_step3,global_step9")
    assert "unknown checkpoint tag 'global_step9'" in err
    (run_dir / "checkpoints" / "global_step4" / "sidecar.json").unlink()
    err = _export_fails(capsys, run_dir, out, "--average", "global_step4,global_step5")
    assert "global_step4: partial checkpoint" in err


def test_checkpoints_of_another_model_or_tokenizer_are_refused(capsys, three_checkpoints):
    run_dir, out = three_checkpoints
    _edit_sidecar(run_dir, "global_step4", model_config={"intermediate_size": 999})
    err = _export_fails(capsys, run_dir, out, "--average-last", "3")
    assert "global_step4/sidecar.json: model_config.intermediate_size 999 differs" in err
    _edit_sidecar(run_dir, "global_step5", tokenizer_sha256="0" * 64)
    assert "global_step5/sidecar.json: tokenizer_sha256 " in _export_fails(
        capsys, run_dir, out, "--average", "global_step3,global_step5")


def test_flag_combinations(capsys, three_checkpoints):
    run_dir, out = three_checkpoints
    assert "--tag global_step5 with --average-last" in _export_fails(
        capsys, run_dir, out, "--tag", TAG2, "--average-last", "2")
    assert "give one of them" in _export_fails(capsys, run_dir, out, "--average-last", "2", "--average", TAG2)
    assert "global_step5 named twice" in _export_fails(capsys, run_dir, out, "--average", f"{TAG2},{TAG2}")
    assert "must be >= 1" in _export_fails(capsys, run_dir, out, "--average-last", "0")


def test_request_from_flags():
    assert AverageRequest.from_flags(None, None, "global_step5") is None
    assert AverageRequest.from_flags(2, None, None) == AverageRequest(last=2)
    assert AverageRequest.from_flags(None, " a, b ", None) == AverageRequest(tags=("a", "b"))
    with pytest.raises(UserError, match="no empty names"):
        AverageRequest.from_flags(None, "a,,b", None)
