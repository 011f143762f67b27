"""Bad input to the per-rank entry, run in this process: each must fail with one line naming the
problem before DeepSpeed starts (no engine, no process group, nothing written to the run directory)."""
from __future__ import annotations

import os
import shutil

import pytest
import yaml

from launcher.run_dir.lock import read_holder
from tests.support.helpers import NO_DROPOUT, tiny_run_config


@pytest.fixture(scope="module")
def bad_input_env(tmp_path_factory, tiny_data, stored_run):
    """A fresh root for configs and run dirs, the tiny corpus, and a real run directory with a
    checkpoint (the stored one: tests/fixtures/README.md) to resume from."""
    return tmp_path_factory.mktemp("bad"), tiny_data, stored_run


def run_rank_in_process(monkeypatch, config, run_dir, world_size=2, overrides=()):
    from launcher.train import rank_entry

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    args = ["--config", str(config), "--run-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    return rank_entry.main(args)


@pytest.mark.parametrize("case, overrides, world, message", [
    ("unknown key", ["optimizer.betas=[0.9, 0.9]"], 2, "unknown key(s) optimizer.betas"),
    ("indivisible batch", [], 3, "global_batch_size 8 is not divisible by the world size 3"),
    ("learned positions", ["model.position_encoding=learned", "model.max_position_embeddings=48"], 2,
     "stage 2 (long): max_seq_len 64 is longer than the model's learned position table"),
    ("vocab too small", ["model.vocab_size=100"], 2, "model.vocab_size 100 is smaller than the tokenizer's"),
])
def test_bad_config_fails_before_training(bad_input_env, monkeypatch, capsys, case, overrides, world, message):
    root, data_dir, _ = bad_input_env
    config = tiny_run_config(root, data_dir, name=f"{case.replace(' ', '_')}.yaml")
    run_dir = root / f"run_{case.replace(' ', '_')}"
    assert run_rank_in_process(monkeypatch, config, run_dir, world, overrides) == 2
    assert message in capsys.readouterr().err
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()


@pytest.mark.parametrize("stages, message", [
    ([], "the schedule is empty"),
    ([{"max_seq_len": 16, "global_batch_size": 8, "steps": 0}], "steps must be a positive integer, got 0"),
    ([{"max_seq_len": 16, "global_batch_size": 8, "steps": -3}], "steps must be a positive integer, got -3"),
])
def test_bad_schedule_fails_before_training(bad_input_env, monkeypatch, capsys, stages, message):
    root, data_dir, _ = bad_input_env
    (root / "bad_schedule.yaml").write_text(yaml.safe_dump({"stages": stages}))
    config = tiny_run_config(root, data_dir, name="bad_schedule_run.yaml")
    assert run_rank_in_process(monkeypatch, config, root / "run_sched", 2,
                               [f"schedule.file={root / 'bad_schedule.yaml'}"]) == 2
    assert message in capsys.readouterr().err


def test_missing_or_unwritable_run_directory(bad_input_env, monkeypatch, capsys):
    root, data_dir, _ = bad_input_env
    config = tiny_run_config(root, data_dir, name="dirs.yaml")
    assert run_rank_in_process(monkeypatch, config, root / "no" / "such" / "parent" / "run") == 2
    err = capsys.readouterr().err
    assert "parent directory" in err and "does not exist" in err
    (root / "a_file").write_text("x")
    assert run_rank_in_process(monkeypatch, config, root / "a_file") == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert run_rank_in_process(monkeypatch, config, "/proc/1/roformer-run") == 2  # even root cannot write there
    assert "not writable" in capsys.readouterr().err


def test_resume_from_another_models_checkpoint_is_refused(bad_input_env, monkeypatch, capsys, tmp_path):
    root, data_dir, run = bad_input_env
    other = tmp_path / "other_run"
    shutil.copytree(run, other)
    before = sorted(os.listdir(other / "checkpoints"))
    config = tiny_run_config(root, data_dir, name="other.yaml", model=NO_DROPOUT)
    from launcher.checkpoint import resume

    holders, decide = [], resume.decide
    monkeypatch.setattr(resume, "decide", lambda *a, **kw: (holders.append(read_holder(other)), decide(*a, **kw))[1])
    assert run_rank_in_process(monkeypatch, config, other, 2, ["model.hidden_size=64", "model.num_hidden_layers=3"]) == 2
    err = capsys.readouterr().err
    assert "different model" in err and "hidden_size: checkpoint 32 vs config 64" in err and "num_hidden_layers" in err
    assert sorted(os.listdir(other / "checkpoints")) == before
    # Rank 0 decided holding the run directory's lock, taken by itself (no `roformer pretrain` above it); the
    # entry released it on the way out.
    [holder] = holders
    assert (holder.command, holder.pid) == ("rank 0", os.getpid()) and read_holder(other) is None


def test_run_directory_with_a_foreign_deepspeed_checkpoint_is_refused(bad_input_env, monkeypatch, capsys, tmp_path):
    root, data_dir, run = bad_input_env
    foreign = tmp_path / "foreign"
    shutil.copytree(run / "checkpoints" / "global_step5", foreign / "checkpoints" / "global_step5")
    (foreign / "checkpoints" / "global_step5" / "sidecar.json").unlink()  # somebody else's: no sidecar, no config
    config = tiny_run_config(root, data_dir, name="foreign.yaml", model=NO_DROPOUT)
    assert run_rank_in_process(monkeypatch, config, foreign) == 2
    assert "not written by `roformer pretrain` (global_step5" in capsys.readouterr().err
    assert sorted(set(os.listdir(foreign)) - {"heartbeats"}) == ["checkpoints"]  # heartbeats/: watchdog liveness
