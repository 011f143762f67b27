"""The careless-user probe's rows of issue 63 item 6 (docs/bad_inputs.md, "Probe rows (issue 63)"): each bad
input is one line, exit 2, before any work and with nothing created, or the behaviour the row states. Real
commands in this process (no rank is started); run configs and schedules written as files."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from launcher.config.run_config import load_run_config
from tests.support.bad_inputs import refused
from tests.support.helpers import run_config_dict, write_schedule, write_yaml

STAGE = {"max_seq_len": 16, "global_batch_size": 4, "steps": 10}


def _config(tmp_path: Path, stages: list[dict] = (STAGE, STAGE), optimizer: dict | None = None,
            checkpoint: dict | None = None) -> Path:
    """A run config over `stages` whose optimizer / checkpoint sections are exactly the ones given (no
    warmup_steps / every_steps beside a token twin)."""
    raw = run_config_dict(schedule_file=write_schedule(tmp_path / "schedule.yaml", list(stages)))
    raw["optimizer"] = {"lr": 2e-3, "decay": "linear", "min_lr_ratio": 0.1, **(optimizer or {"warmup_steps": 2})}
    raw["checkpoint"] = {"keep_last": 2, **(checkpoint or {"every_steps": 0})}
    return write_yaml(tmp_path / "run.yaml", raw)


def _plan_refuses(capsys, path: Path, *sets: str) -> str:
    argv = ["plan", "--config", path, "--world-size", "1"] + [a for s in sets for a in ("--set", s)]
    return refused(capsys, argv, [path.parent])


# --- row 1: eval-mlm -----------------------------------------------------------------------------------------


def test_eval_mlm_seed_out_of_range_and_a_repeated_length_are_one_line(capsys, tmp_path):
    base = ["eval-mlm", tmp_path / "export", "--data", tmp_path / "data"]
    assert "argument --seed: must be an integer in [0, 4,294,967,295], got '-1'" in refused(
        capsys, [*base, "--seed", "-1"], [tmp_path])  # numpy's "Seed must be between 0 and 2**32 - 1" traceback before
    assert "--seq-lens: '32,64,32' gives 32 more than once" in refused(capsys, [*base, "--seq-lens", "32,64,32"],
                                                                      [tmp_path])  # evaluated twice before
    assert not (tmp_path / "export").exists()


# --- row 2: reproduce --groups -------------------------------------------------------------------------------


def test_reproduce_refuses_an_unknown_group_before_its_output_exists(capsys, tmp_path):
    out = tmp_path / "repro"
    line = refused(capsys, ["reproduce", "--out", out, "--quick", "--groups", "nosuch"], [tmp_path])
    assert "--groups: no run of the chosen parts is in group(s) nosuch (groups: " in line and "rope" in line
    assert "--groups: chooses the runs to start; --report-only starts none" in refused(
        capsys, ["reproduce", "--out", out, "--quick", "--groups", "rope", "--report-only"], [tmp_path])
    assert not out.exists()


# --- rows 4 and 5: the schedule and the optimizer --------------------------------------------------------------


def test_a_token_stage_past_any_run_is_refused_as_its_steps_are(capsys, tmp_path):
    big = {"name": "big", "max_seq_len": 16, "global_batch_size": 4, "tokens": "100T"}
    line = _plan_refuses(capsys, _config(tmp_path, [STAGE, big]))
    assert "schedule.yaml: stage 2 (big): tokens '100T' is 1,562,500,000,000 steps, more than any run (at most " \
           "2,147,483,647 steps" in line


def test_every_tokens_beyond_the_run_is_refused_as_warmup_is(capsys, tmp_path):
    line = _plan_refuses(capsys, _config(tmp_path, checkpoint={"every_tokens": "9K"}))
    assert "checkpoint.every_tokens: 9K tokens is longer than the run (1,280 token slots in 20 steps)" in line


@pytest.mark.parametrize("optimizer, message", [
    ({"warmup_steps": 2, "reference_batch": 8},
     "optimizer.reference_batch: only applies with optimizer.batch_scaling linear or sqrt (it is 'none')"),
    ({"warmup_steps": 2, "batch_scaling": "none", "reference_batch": 8},
     "optimizer.reference_batch: only applies with optimizer.batch_scaling linear or sqrt (it is 'none')"),
    ({"warmup_steps": 2, "batch_scaling": "linear", "reference_batch": 0},
     "optimizer.reference_batch: must be a positive global batch, got 0"),
])
def test_reference_batch_unused_or_zero_is_one_line(capsys, tmp_path, optimizer, message):
    assert message in _plan_refuses(capsys, _config(tmp_path, optimizer=optimizer))


def test_an_absurd_reference_batch_is_planned_with_a_warning_naming_the_scale(capsys, tmp_path):
    path = _config(tmp_path, optimizer={"warmup_steps": 2, "batch_scaling": "linear", "reference_batch": 10**9})
    assert cli_main(["plan", "--config", str(path), "--world-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "warning: optimizer.reference_batch 1000000000 is outside the schedule's batches (4 to 4): the LR is " \
           "4e-09 to 4e-09 x the curve's at every step" in out


def test_zero_warmup_tokens_is_zero_warmup_steps_and_set_null_unsets_a_field(tmp_path):
    assert load_run_config(_config(tmp_path / "a", optimizer={"warmup_tokens": 0})).optimizer.warmup_steps == 0
    assert load_run_config(_config(tmp_path / "b", checkpoint={"every_tokens": "0"})).checkpoint.every_steps == 0
    # The file says warmup_steps: 2; --set ...=null drops it, so the token twin can be given instead.
    path = _config(tmp_path / "c")
    cfg = load_run_config(path, ["optimizer.warmup_steps=null", "optimizer.warmup_tokens=192"])
    assert cfg.optimizer.warmup_steps == 3  # 192 token slots = 3 steps of 4 x 16
    assert load_run_config(path, ["optimizer.warmup_steps=null"]).optimizer.warmup_steps == 100  # the field's default
    with pytest.raises(Exception, match="optimizer.warmup_steps: expected int, got None"):
        load_run_config(path, ["optimizer.warmup_steps=~"])  # only the word null unsets (a bare ~ may be a home path)
    with pytest.raises(Exception, match="give optimizer.warmup_steps or optimizer.warmup_tokens, not both"):
        load_run_config(path, ["optimizer.warmup_tokens=192"])


# --- row 6: finetune --dev-fraction, data prepare --lenient ----------------------------------------------------


@pytest.mark.parametrize("fraction", ["0", "1"])
def test_finetune_dev_fraction_names_the_flag(capsys, tmp_path, fraction):
    train = tmp_path / "t.csv"
    train.write_text("text,label\n" + "".join(f"text {i},{i % 2}\n" for i in range(6)), encoding="utf-8")
    line = refused(capsys, ["finetune", tmp_path / "export", "--train", train, "--dev-fraction", fraction], [tmp_path])
    assert f"argument --dev-fraction: must be a number between 0 and 1 (exclusive), got '{fraction}'" in line


def test_lenient_prepare_of_a_latin1_file_says_what_it_skipped(capsys, tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("\n".join(f"Le café numéro {i} est très bon." for i in range(50)).encode("latin-1"))
    line = refused(capsys, ["data", "prepare", "--input", latin, "--out", tmp_path / "out", "--lenient",
                            "--vocab-size", "300"], [latin], progress=True)
    assert "no documents for the train split (0 read, 0 dropped as duplicates or over the cap; --lenient skipped " \
           f"50 line(s): 50 invalid UTF-8, e.g. {latin}:1: invalid UTF-8 (at byte 6 of the line); input is read as " \
           "UTF-8: convert the file, e.g. `iconv -f latin1 -t utf-8`)" in line
    assert not (tmp_path / "out").exists()


# --- row 3: --init-from checked at load ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roformer_dir(tmp_path_factory) -> Path:
    """transformers' RoFormerForMaskedLM (safetensors) + a WordPiece tokenizer, save_pretrained. Read-only."""
    from tests.support.corpus_files import english_paragraphs
    from tests.support.hf_dirs import plain_transformers_dir

    return plain_transformers_dir(tmp_path_factory.mktemp("hf") / "mlm", english_paragraphs(12))


def test_a_bert_config_over_roformer_weights_is_refused_by_the_plan(capsys, tmp_path, roformer_dir):
    import json
    import shutil

    copy = Path(shutil.copytree(roformer_dir, tmp_path / "mixed"))
    config = json.loads((copy / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertForMaskedLM"])
    (copy / "config.json").write_text(json.dumps(config))
    path = write_yaml(tmp_path / "run.yaml", {**{k: v for k, v in run_config_dict().items() if k != "model"},
                                              "init_from": str(copy)})
    line = refused(capsys, ["plan", "--config", path, "--world-size", "1"], [tmp_path])
    assert f"init_from: {copy}/config.json says model_type 'bert', but {copy}/model.safetensors holds roformer " \
           "tensors (roformer." in line and "the config.json does not belong to these weights" in line
    # The same line from the dry run, before the run directory exists.
    line = refused(capsys, ["pretrain", "--config", path, "--run-dir", tmp_path / "run", "--dry-run"], [tmp_path])
    assert "says model_type 'bert', but" in line and not (tmp_path / "run").exists()


def test_an_init_tensor_holding_nan_is_refused_at_load_naming_it(tmp_path, roformer_dir):
    import shutil

    from safetensors.torch import load_file, save_file

    from launcher.common.errors import UserError
    from launcher.resolved.init_from import read_init_source
    from launcher.train.init_weights import InitialWeights

    copy = Path(shutil.copytree(roformer_dir, tmp_path / "nan"))
    tensors = load_file(copy / "model.safetensors")
    name = next(k for k in sorted(tensors) if k.endswith("attention.self.query.weight"))
    tensors[name][0, :3] = float("nan")
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    init = read_init_source(str(copy), "run.yaml")
    with pytest.raises(UserError, match=rf"init_from {copy}/model.safetensors: tensor {name} holds 3 NaN or inf "
                                        rf"value\(s\) of [\d,]+: the weights are damaged"):
        InitialWeights.read(init, init.model)
    original = read_init_source(str(roformer_dir), "run.yaml")
    assert InitialWeights.read(original, original.model).tensors  # the undamaged copy loads


@pytest.mark.parametrize("url", ["s3://bucket/models/bert", "hf://bert-base-uncased"])
def test_an_init_from_url_is_one_line_not_a_local_directory(capsys, tmp_path, url):
    scheme = url.split(":")[0]
    line = refused(capsys, ["pretrain", "--config", tmp_path / "run.yaml", "--run-dir", tmp_path / "run",
                            "--init-from", url, "--dry-run"], [tmp_path])
    assert f"--init-from {url}: a {scheme}:// URL, but a local path is expected" in line
    path = write_yaml(tmp_path / "run.yaml", {**{k: v for k, v in run_config_dict().items() if k != "model"},
                                              "init_from": url})
    line = refused(capsys, ["plan", "--config", path, "--world-size", "1"], [tmp_path])
    assert f"run.yaml: init_from {url}: a {scheme}:// URL, but a local path is expected" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # no ./s3:/ directory


# --- row 7: MLflow's address (the catch-up of a finished run: tests/unit/test_tracking.py) -----------------------


def test_an_mlflow_tracking_uri_that_is_no_uri_is_one_line_before_the_run(capsys, tmp_path, monkeypatch):
    from launcher.tracking.mlflow_backend import check_tracking_uri

    raw = run_config_dict()
    raw["logging"]["report_to"] = ["mlflow"]
    path = write_yaml(tmp_path / "run.yaml", raw)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "not a uri")
    says = "MLFLOW_TRACKING_URI 'not a uri': not a tracking URI; give a server (http://HOST:5000), a database"
    assert says in refused(capsys, ["pretrain", "--config", path, "--run-dir", tmp_path / "run", "--dry-run"],
                           [tmp_path])
    assert f"argument --report-to: {says}" in refused(
        capsys, ["finetune", tmp_path / "export", "--task", "movie-reviews", "--report-to", "mlflow"], [tmp_path])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # no ./not a uri/ file store
    for uri in ("http://mlflow:5000", "sqlite:////srv/mlflow.db", "file:///srv/mlruns", "databricks"):
        check_tracking_uri({"MLFLOW_TRACKING_URI": uri})
