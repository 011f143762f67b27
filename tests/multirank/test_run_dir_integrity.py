"""A refused run leaves the run directory exactly as it was; a damaged checkpoint is named, set aside
and resumed past; export packs the tokenizer the checkpoint was trained with (issue 12, item 1).

All on copies of the session's real 2-rank run (`trainer_run`: checkpoints global_step10/12/16).
Refusals run the rank entry in this process as rank 0 (they must end before any process group
exists); the fallback is a real 2-rank resume under DeepSpeed.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from launcher.common.errors import UserError
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.checkpoint.catalogue import read_sidecar
from tests.support.helpers import (
    REPO,
    TEST_RANK_ENTRY,
    events,
    free_port,
    start_run,
    train_losses,
    write_yaml,
)

TIMEOUT = 300


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root: (size, mtime_ns); any write shows up here. Except
    heartbeats/: the hang watchdog's liveness files, which every launch rewrites (not run records)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]
            if p.relative_to(root).parts[:1] != ("heartbeats",)}


def trained_config(trainer_run: Path) -> dict:
    """The config the session run was started with (tests.support.helpers.tiny_run_config)."""
    return yaml.safe_load((trainer_run.parent / "run.yaml").read_text())


@pytest.fixture
def resumable(trainer_run, tmp_path) -> Path:
    """A copy of the run whose newest checkpoint is global_step12 (4 steps left to train)."""
    run_dir = tmp_path / "run"
    shutil.copytree(trainer_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "global_step16")
    (run_dir / "checkpoints" / "latest").write_text("global_step12")
    return run_dir


def other_corpus_same_tokenizer(data_dir: Path, dest: Path) -> Path:
    """The prepared data without its last train shard: same spm.model, another corpus."""
    shutil.copytree(data_dir, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"].pop()
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


def same_size_other_tokenizer(tmp_path_factory) -> Path:
    """The tiny corpus prepared with a fifth of it held out: its SentencePiece (also 900 pieces) is
    trained on other text, so it is another tokenizer of the same size."""
    from data_pipeline.config import CleaningConfig
    from tests.support.corpus_files import prepared_dir

    return prepared_dir(tmp_path_factory, "valid_fifth", cleaning=CleaningConfig(valid_fraction=0.2))


def refusal_cases(tiny_data: Path, stored_data: Path, other_tokenizer: Path,
                  tmp_path: Path) -> dict[str, tuple[dict, str]]:
    """name -> (config changes, text the one-line error must hold)."""
    bf16 = str(REPO / "ds_configs" / "cpu_bf16_zero2.json")
    sidecar = tmp_path / "run" / "checkpoints" / "global_step12" / "sidecar.json"  # the `resumable` copy's
    spm = lambda data: hashlib.sha256((data / "tokenizer" / "spm.model").read_bytes()).hexdigest()  # noqa: E731
    return {
        "tokenizer": ({"data": {"data_dir": str(other_tokenizer)}},
                      f"tokenizer sha256 {spm(other_tokenizer)} is not the one checkpoint global_step12 was trained "
                      f"with ({spm(tiny_data)}"),
        "tokenizer size": ({"data": {"data_dir": str(stored_data)}},  # vocab 500: refused before the resume checks
                           f"model.vocab_size 900 is larger than the tokenizer's vocabulary (500 pieces in "
                           f"{stored_data / 'tokenizer' / 'spm.model'})"),
        "corpus": ({"data": {"data_dir": str(other_corpus_same_tokenizer(tiny_data, tmp_path / "fewer_shards"))}},
                   "data_state does not fit data.data_dir"),
        # Other ZeRO stages, precisions and world sizes resume through the universal checkpoint
        # (tests/multirank/test_resume_shapes.py); ZeRO-0 has no partitioned state to carry over.
        "zero stage 0": ({"deepspeed": {"overrides": {"zero_optimization": {"stage": 0}}}},
                         f"ZeRO-0, fp32, 1 rank, but checkpoint global_step12 was saved with ZeRO-2, fp32, 2 ranks "
                         f"({sidecar})"),
        "precision auto": ({"deepspeed": {"config": bf16, "overrides": {"bf16": {"enabled": "auto"}}}},
                           f'{bf16}: bf16.enabled: "auto" is a Hugging Face Trainer placeholder'),
    }


@pytest.mark.parametrize("case", ["tokenizer", "tokenizer size", "corpus", "zero stage 0", "precision auto"])
def test_refused_resume_changes_nothing_in_the_run_directory(case, resumable, trainer_run, tiny_data, stored_run,
                                                             tmp_path, tmp_path_factory, monkeypatch, capsys):
    from launcher.train import rank_entry

    other_tokenizer = same_size_other_tokenizer(tmp_path_factory) if case == "tokenizer" else tiny_data
    changes, message = refusal_cases(tiny_data, stored_run.parent / "data", other_tokenizer, tmp_path)[case]
    config = trained_config(trainer_run)
    config["optimizer"]["lr"] = 1e-3  # a config that also differs where a change would be allowed
    for section, values in changes.items():
        config[section].update(values)
    config_path = write_yaml(tmp_path / "changed.yaml", config)
    before = tree_state(resumable)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    assert rank_entry.main(["--config", str(config_path), "--run-dir", str(resumable)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pretrain (rank 0): error: ") and message in err, err
    assert tree_state(resumable) == before  # config.yaml, ds_config, stages, checkpoints: untouched


def test_resume_with_zero_stage_1_continues_a_zero_2_run(resumable, trainer_run, tmp_path):
    """ZeRO-1 and ZeRO-2 keep the same partitioned optimizer files: the change is accepted (and
    recorded as a new config version) and the run goes on along the reference loss curve."""
    config = trained_config(trainer_run)
    config["deepspeed"]["overrides"] = {"zero_optimization": {"stage": 1}}
    proc = start_run(2, write_yaml(tmp_path / "zero1.yaml", config), resumable, module=TEST_RANK_ENTRY)
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "run.log").read_text()[-4000:]
    assert [(e["tag"], e["universal"]) for e in events(resumable, "resume")] == [("global_step12", False)]
    expected, got = train_losses(trainer_run), train_losses(resumable)
    for step in range(13, 17):  # ZeRO-1 all-reduces where ZeRO-2 reduce-scatters: summation order only
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got[step], expected[step])
    final = read_sidecar(resumable / "checkpoints" / "global_step16")
    assert (final.zero_stage, final.step) == (1, 16)
    assert json.loads((resumable / "ds_config.resolved.2.json").read_text())["zero_optimization"]["stage"] == 1


def test_export_refuses_a_tokenizer_the_checkpoint_was_not_trained_with(trainer_run, trainer_export, stored_run,
                                                                        tmp_path):
    from launcher.export.exporter import export_checkpoint

    trained = read_sidecar(trainer_run / "checkpoints" / "global_step16").tokenizer_sha256
    assert hashlib.sha256((trainer_export / "spm.model").read_bytes()).hexdigest() == trained
    run_dir = tmp_path / "run"
    shutil.copytree(trainer_run, run_dir)
    other = stored_run.parent / "data"  # another tokenizer (vocab 500)
    other_sha = hashlib.sha256((other / "tokenizer" / "spm.model").read_bytes()).hexdigest()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["data_dir"] = str(other)  # what a refused resume used to leave in config.yaml
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for tokenizer_from in (None, other):
        with pytest.raises(UserError) as caught:
            export_checkpoint(run_dir, tmp_path / "export", tokenizer_from=tokenizer_from, verify=False)
        text = str(caught.value)
        assert f"{other / 'tokenizer' / 'spm.model'}" in text and other_sha in text and trained in text
        assert str(sidecar_path(run_dir / "checkpoints" / "global_step16")) in text
    assert not (tmp_path / "export").exists()


def test_export_of_a_truncated_checkpoint_names_the_file(trainer_run, tmp_path):
    from launcher.export.exporter import export_checkpoint
    from launcher.checkpoint.catalogue import DamagedCheckpoint

    run_dir = tmp_path / "run"
    shutil.copytree(trainer_run, run_dir)
    model_file = run_dir / "checkpoints" / "global_step16" / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:4096])
    with pytest.raises(DamagedCheckpoint, match=rf"{model_file}: 4096 bytes, \d+ recorded at save time \(truncated\)"):
        export_checkpoint(run_dir, tmp_path / "export", verify=False)


def test_damaged_checkpoints_are_set_aside_and_the_run_resumes_from_the_newest_intact(trainer_run, tmp_path):
    reference = trainer_run
    run_dir = tmp_path / "run"
    shutil.copytree(trainer_run, run_dir)
    layout = RunDir(run_dir)
    truncated = layout.checkpoint("global_step16") / "mp_rank_00_model_states.pt"
    truncated.write_bytes(truncated.read_bytes()[:4096])
    sidecar_path(layout.checkpoint("global_step12")).write_text('{"tag": "global_step12", "step": 1')  # cut short
    config_before = layout.config.read_bytes()
    config = trained_config(reference)
    config["checkpoint"]["keep_last"] = 4  # a change that is allowed: recorded as version 2
    config_path = write_yaml(tmp_path / "resume.yaml", config)

    proc = start_run(2, config_path, run_dir, module=TEST_RANK_ENTRY)
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "run.log").read_text()[-4000:]
    log = (tmp_path / "run.log").read_text()

    # Named, one line each, with where the run went instead; both kept under checkpoints/damaged/.
    lines = [line for line in log.splitlines() if "is damaged" in line]
    assert len(lines) == 2, log[-4000:]
    by_tag = {tag: next(line for line in lines if f"checkpoint {tag} is damaged" in line)
              for tag in ("global_step12", "global_step16")}
    assert "truncated" in by_tag["global_step16"] and "mp_rank_00_model_states.pt" in by_tag["global_step16"]
    assert "not valid JSON" in by_tag["global_step12"]
    assert all("resuming from global_step10 (step 10)" in line for line in lines)
    kept = {p.name.split("-")[0]: p for p in layout.damaged.iterdir()}
    assert sorted(kept) == ["global_step12", "global_step16"]
    assert (kept["global_step16"] / "mp_rank_00_model_states.pt").stat().st_size == 4096  # as it was found
    assert [e["tag"] for e in events(run_dir, "resume")] == ["global_step10"]
    assert len(events(run_dir, "resume_note")) == 3  # two damaged checkpoints, one config version

    # The run went on from step 10 on the uninterrupted run's loss curve, and saved intact checkpoints.
    expected, got = train_losses(reference), train_losses(run_dir)
    for step in range(11, 17):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    from launcher.checkpoint.catalogue import verify_files
    for tag in ("global_step12", "global_step16"):
        verify_files(layout.checkpoint(tag), read_sidecar(layout.checkpoint(tag)))

    # config.yaml is version 1 forever; the change is version 2, from the step it took effect at.
    assert layout.config.read_bytes() == config_before
    versions = json.loads(layout.config_versions.read_text())["versions"]
    assert [(v["version"], v["from_step"], v["resumed_from"]) for v in versions] == \
        [(1, 0, None), (2, 10, "global_step10")]
    assert versions[1]["files"]["config"] == "config.2.yaml"
    second = run_dir / "config.2.yaml"
    assert second.read_text().startswith("# version 2 of this run's config, in effect from step 10")
    assert yaml.safe_load(second.read_text())["checkpoint"]["keep_last"] == 4
    assert "recorded as config.2.yaml" in log
