"""Run-config loading: sections, overrides, path resolution, and errors naming file and field."""
from __future__ import annotations

import pytest

from launcher.config.run_config import dump_run_config, load_run_config
from launcher.common.errors import UserError
from tests.support.helpers import REPO, run_config_dict, write_yaml


def test_shipped_configs_load_with_absolute_paths():
    for name in ("demo_cpu.yaml", "reference_v100.yaml"):
        cfg = load_run_config(REPO / "configs" / name)
        assert cfg.deepspeed.config.startswith("/") and cfg.schedule.file.startswith("/")
        assert cfg.model.position_encoding == "rope"


def test_overrides_parse_values_as_yaml(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", run_config_dict())
    cfg = load_run_config(path, ["optimizer.lr=3e-4", "logging.progress_bar=false", "seed=99",
                                 "model.hidden_size=64"])
    assert cfg.optimizer.lr == 3e-4 and cfg.logging.progress_bar is False and cfg.seed == 99
    assert cfg.model.hidden_size == 64


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "s.yaml").write_text("stages: [{max_seq_len: 8, global_batch_size: 2, steps: 1}]")
    path = write_yaml(tmp_path / "cfgs" / "run.yaml", run_config_dict(schedule_file="../sub/s.yaml", data_dir="../d"))
    cfg = load_run_config(path)
    assert cfg.schedule.file == str(tmp_path / "sub" / "s.yaml")
    assert cfg.data.data_dir == str(tmp_path / "d")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_run_config(write_yaml(tmp_path / "run.yaml", run_config_dict()), ["optimizer.lr=1e-3"])
    dump_run_config(cfg, tmp_path / "resolved.yaml")
    again = load_run_config(tmp_path / "resolved.yaml")
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["optimizer"].update(learning_rate=1), "optimizer.learning_rate"),
    (lambda c: c["logging"].update(tensorbord=True), "logging.tensorbord"),
    (lambda c: c.update(trainer={}), "unknown section(s) trainer"),
    (lambda c: c["model"].update(hiden_size=3), "hiden_size"),
    (lambda c: c["optimizer"].update(lr="fast"), "optimizer.lr: expected float"),
    (lambda c: c["optimizer"].update(decay="step"), "optimizer.decay"),
    (lambda c: c["checkpoint"].update(keep_last=0), "checkpoint.keep_last"),
    (lambda c: c["deepspeed"].update(config="/nope/x.json"), "deepspeed.config: file not found"),
    (lambda c: c["model"].update(num_attention_heads=5), "num_attention_heads"),
    (lambda c: c["data"].update(masking={"mask_probability": 0.2}), "data.masking.mask_probability: unknown key"),
    (lambda c: c["data"].update(masking={"mask_prob": 1.5}), "masking.mask_prob: 1.5 must be in (0, 1)"),
    (lambda c: c["logging"].update(stage_end_evals=["mlm", 3]), "logging.stage_end_evals: must be a list of names"),
])
def test_bad_fields_are_named_with_the_file(tmp_path, mutate, message):
    raw = run_config_dict()
    mutate(raw)
    path = write_yaml(tmp_path / "bad.yaml", raw)
    with pytest.raises(UserError) as info:
        load_run_config(path)
    assert message in str(info.value) and "bad.yaml" in str(info.value)


def test_bad_override_syntax(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", run_config_dict())
    with pytest.raises(UserError, match="section.key=value"):
        load_run_config(path, ["optimizer.lr"])
    with pytest.raises(UserError, match="optimizer.betas"):
        load_run_config(path, ["optimizer.betas=[0.9, 0.99]"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_run_config(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    with pytest.raises(UserError, match="broken.yaml: line 2: not valid YAML"):
        load_run_config(tmp_path / "broken.yaml")


def test_unknown_stage_end_eval_is_named_by_roformer_plan(tmp_path, capsys, tiny_data):
    """Loading the YAML does not import the eval code; `roformer plan` (like `roformer pretrain` and every
    rank) asks the eval job's --check, which names the entry and the file."""
    from launcher.cli import main as cli_main

    raw = run_config_dict(data_dir=tiny_data, logging={"stage_end_evals": ["mlm", "glue"]})
    path = write_yaml(tmp_path / "bad.yaml", raw)
    load_run_config(path)  # the YAML itself is well-formed
    assert cli_main(["plan", "--config", str(path), "--world-size", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("roformer plan: error: ") and "bad.yaml: logging.stage_end_evals: unknown eval 'glue'" in err
    raw["logging"]["stage_end_evals"] = ["mlm", "movie-reviews:epochs=1"]
    assert cli_main(["plan", "--config", str(write_yaml(tmp_path / "good.yaml", raw)), "--world-size", "2"]) == 0
