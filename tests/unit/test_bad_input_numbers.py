"""Issue 49, rows 16-27: numbers checked for range and finiteness where they are parsed (run config, model
fields, flags), config files read once (encodings, directories, keys given twice), dependency errors
(safetensors, torch's optimizer checks) in our words. Real commands in this process (`roformer plan`,
`pretrain --dry-run`, ...): exit 2, one line naming the file / line / field / flag, nothing the user owns
changed and nothing written (docs/bad_inputs.md)."""
from __future__ import annotations

import os
import json
import shutil
from pathlib import Path

import pytest
import yaml

from launcher.cli import main as cli_main
from tests.support.bad_inputs import refused
from tests.support.helpers import REPO, run_config_dict, write_schedule, write_yaml

ONE_STAGE = [{"name": "one", "max_seq_len": 32, "global_batch_size": 8, "steps": 2}]


@pytest.fixture
def config(tiny_data, tmp_path) -> Path:
    """A user's run config (and its schedule) on the tiny data."""
    schedule = write_schedule(tmp_path / "schedule.yaml", ONE_STAGE)
    return write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data, schedule_file=schedule))


def _plan(config: Path, *sets: str) -> list:
    return ["plan", "--world-size", "1", "--config", config, *[a for s in sets for a in ("--set", s)]]


# --- row 16: a truncated model.safetensors in --init-from ---------------------------------------------


def test_a_truncated_safetensors_in_init_from_is_refused_before_the_ranks(capsys, stored_export, tiny_data,
                                                                          config, tmp_path):
    damaged = tmp_path / "B"
    shutil.copytree(stored_export, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    run_dir = tmp_path / "run"
    line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--run-dir", run_dir, "--init-from",
                            damaged, "--dry-run"], [damaged, tiny_data, config])
    assert f"init_from: {weights}: not a complete safetensors file (truncated or damaged: incomplete metadata" in line
    assert line.endswith("copy it again") and "SafetensorError" not in line
    assert not run_dir.exists()
    line = refused(capsys, ["pretrain", "--num_gpus", "1", "--config", config, "--run-dir", run_dir, "--init-from",
                            damaged], [damaged, tiny_data, config])  # the real start: refused before any rank
    assert f"{weights}: not a complete safetensors file" in line
    assert not run_dir.exists()
    weights.write_bytes(b"\x05")  # shorter than the header's length field
    line = refused(capsys, ["plan", "--world-size", "1", "--config", config, "--set", f"init_from={damaged}"],
                   [damaged, tiny_data])
    assert f"{weights}: not a complete safetensors file (truncated or damaged: header too small)" in line


def test_a_truncated_shard_of_a_sharded_init_from_is_named(capsys, stored_export, tiny_data, config, tmp_path):
    """A sharded model (model.safetensors.index.json and its shards, as transformers saves large ones): each
    shard the index names gets the same header check."""
    sharded = tmp_path / "sharded"
    shutil.copytree(stored_export, sharded)
    shard = sharded / "model-00001-of-00001.safetensors"
    (sharded / "model.safetensors").rename(shard)
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"roformer.embeddings.word_embeddings.weight": shard.name}}))
    shard.write_bytes(shard.read_bytes()[:5000])
    line = refused(capsys, ["plan", "--world-size", "1", "--config", config, "--set", f"init_from={sharded}"],
                   [sharded, tiny_data])
    assert f"{shard}: not a complete safetensors file (truncated or damaged: incomplete metadata" in line


# --- row 17: absurd sizes, an absurd seed, an optimizer torch refuses ---------------------------------


def test_absurd_sizes_seeds_and_optimizer_values_are_refused_by_plan(capsys, tiny_data, config):
    owned = [tiny_data, config]
    line = refused(capsys, _plan(config, "model.hidden_size=100000000000000000000000"), owned)
    assert line.endswith(f"{config}: model: hidden_size: 100,000,000,000,000,000,000,000 is larger than any model "
                         f"dimension (at most 2,147,483,647)")
    line = refused(capsys, _plan(config, "schedule.max_tokens_per_micro_batch=100000000000000000000000"), owned)
    assert line.endswith(f"{config}: schedule.max_tokens_per_micro_batch: 100,000,000,000,000,000,000,000 is out of "
                         f"range (a 64-bit integer)")
    schedule = write_schedule(config.parent / "huge.yaml", [{**ONE_STAGE[0], "steps": 10**23}])
    line = refused(capsys, _plan(config, f"schedule.file={schedule}"), [*owned, schedule])
    assert line.endswith(f"{schedule}: stage 1 (one): steps 100,000,000,000,000,000,000,000 is larger than any run "
                         f"(at most 2,147,483,647)")
    for seed in ("1e23", "100000000000000000000000", "-1"):
        line = refused(capsys, _plan(config, f"seed={seed}"), owned)
        assert f"{config}: seed: must be an integer in [0, 4,294,967,295], got " in line, line
    line = refused(capsys, _plan(config, "data.seed=4294967296"), owned)
    assert "data.seed: must be an integer in [0, 4,294,967,295], got 4294967296" in line
    line = refused(capsys, _plan(config, "deepspeed.overrides={optimizer: {type: SGD, params: {nesterov: true}}}"),
                   owned)
    assert "optimizer.params {'nesterov': True}: SGD (torch.optim.SGD) refuses them: Nesterov momentum requires a " \
           "momentum and zero dampening" in line
    line = refused(capsys, _plan(config, "deepspeed.overrides={optimizer: {type: RMSprop, params: {alpha: -2}}}"),
                   owned)
    assert "RMSprop (torch.optim.RMSprop) refuses them: Invalid alpha value: -2" in line
    capsys.readouterr()  # the values torch takes pass
    assert cli_main([str(a) for a in _plan(
        config, "deepspeed.overrides={optimizer: {type: SGD, params: {momentum: 0.9, nesterov: true}}}")]) == 0


# --- row 18: infinite numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("setting, field", [("optimizer.lr=1e400", "optimizer.lr"),
                                            ("optimizer.lr=.inf", "optimizer.lr"),
                                            ("model.layer_norm_eps=.inf", "model: layer_norm_eps"),
                                            ("model.rope_theta=.nan", "model: rope_theta")])
def test_infinite_and_nan_config_numbers_are_refused(capsys, tiny_data, config, setting, field):
    line = refused(capsys, _plan(config, setting), [tiny_data, config])
    assert f"{config}: {field}: must be a finite number, got " in line


def test_infinite_stage_numbers_are_refused(capsys, tiny_data, tmp_path):
    schedule = write_schedule(tmp_path / "schedule.yaml", [{**ONE_STAGE[0], "lr_scale": float("inf")}])
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data, schedule_file=schedule))
    line = refused(capsys, _plan(config), [tiny_data, tmp_path])
    assert f"{schedule}: stage 1 (one): lr_scale must be a positive number, got inf" in line


def test_infinite_flags_are_refused_naming_the_flag(capsys, stored_export, texts_dir):
    owned = [stored_export, texts_dir]
    line = refused(capsys, ["finetune", stored_export, "--train", texts_dir / "train.csv", "--lr", "inf"], owned)
    assert line.endswith("argument --lr: must be a finite number, got 'inf'")
    line = refused(capsys, ["finetune", stored_export, "--train", texts_dir / "train.csv", "--dropout", "1e400"], owned)
    assert line.endswith("argument --dropout: must be a finite number, got '1e400'")
    line = refused(capsys, ["eval-mlm", stored_export, "--input", texts_dir / "train.csv", "--mask-prob", "nan"], owned)
    assert line.endswith("argument --mask-prob: must be a finite number, got 'nan'")


@pytest.fixture
def texts_dir(tmp_path) -> Path:
    root = tmp_path / "texts"
    root.mkdir()
    (root / "train.csv").write_text("text,label\n" + "".join(f"some words {i},{'pos' if i % 2 else 'neg'}\n"
                                                              for i in range(8)), encoding="utf-8")
    return root


# --- row 19: config files that are not text, or not files ---------------------------------------------


def test_config_files_that_are_not_utf8_or_are_directories_are_one_line(capsys, tiny_data, stored_export, config,
                                                                         texts_dir, tmp_path):
    owned = [tiny_data, tmp_path]
    text = config.read_text(encoding="utf-8").replace("seed: 7\n", "seed: 7\n# caf\xe9\n", 1)
    config.write_bytes(text.encode("latin-1"))
    line = refused(capsys, _plan(config), owned)
    assert line.endswith(f"{config}: line 2: not UTF-8 text (byte 0xe9); a run config is a UTF-8 text file")
    line = refused(capsys, _plan(tmp_path), owned)
    assert line.endswith(f"{tmp_path}: a directory; the run config is a file")
    config.write_bytes(text.encode("utf-8").replace(b"# caf", b"# \x00caf", 1))  # UTF-8, but a control character
    line = refused(capsys, _plan(config), owned)
    assert line.endswith(f"{config}: line 2: not valid YAML: unacceptable character #x0000: special characters are "
                         f"not allowed")
    config.write_text(yaml.safe_dump(run_config_dict(data_dir=tiny_data, schedule_file=tmp_path / "schedule.yaml")))
    (tmp_path / "schedule.yaml").write_bytes(b"stages:\n  - name: \x00\xff\xfe\n")
    line = refused(capsys, _plan(config), owned)
    assert f"{tmp_path / 'schedule.yaml'}: line 2: not UTF-8 text (byte 0xff); a schedule is" in line
    write_schedule(tmp_path / "schedule.yaml", ONE_STAGE)
    ds = tmp_path / "ds.json"
    ds.write_bytes((REPO / "ds_configs" / "cpu_fp32_zero2.json").read_bytes().replace(b"{", b"{\xa0", 1))
    line = refused(capsys, _plan(config, f"deepspeed.config={ds}"), owned)
    assert f"{ds}: line 1: not UTF-8 text (byte 0xa0); a DeepSpeed config is a UTF-8 text file" in line
    spec = texts_dir / "task.yaml"
    spec.write_bytes(b"train: train.csv\n# \xe9t\xe9\n")
    line = refused(capsys, ["finetune", stored_export, "--task-spec", spec], [texts_dir, stored_export])
    assert line.endswith(f"{spec}: line 2: not UTF-8 text (byte 0xe9); a task spec is a UTF-8 text file")
    line = refused(capsys, ["finetune", stored_export, "--task-spec", texts_dir], [texts_dir, stored_export])
    assert line.endswith(f"{texts_dir}: a directory; the task spec is a file")


# --- row 20: a key given twice ------------------------------------------------------------------------


def test_a_key_given_twice_is_refused_naming_the_line(capsys, tiny_data, config, tmp_path):
    owned = [tiny_data, tmp_path]
    original = config.read_text(encoding="utf-8")
    config.write_text(original.replace("  hidden_size: 32\n", "  hidden_size: 32\n  hidden_size: 64\n", 1))
    lines = config.read_text().splitlines()
    first = lines.index("  hidden_size: 32") + 1
    line = refused(capsys, _plan(config), owned)
    assert line.endswith(f"{config}: line {first + 1}: not valid YAML: key 'hidden_size' given twice (first at line "
                         f"{first})")
    config.write_text(original + "model:\n  hidden_size: 64\n")
    line = refused(capsys, _plan(config), owned)
    assert f"{config}: line {len(original.splitlines()) + 1}: not valid YAML: key 'model' given twice (first at " \
           f"line 2)" in line
    config.write_text(original)
    line = refused(capsys, _plan(config, "model={hidden_size: 32, hidden_size: 64}"), owned)
    assert "--set 'model={hidden_size: 32, hidden_size: 64}': value is not valid YAML: key 'hidden_size' given " \
           "twice" in line
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}')
    line = refused(capsys, _plan(config, f"deepspeed.config={ds}"), owned)
    assert line.endswith(f"{ds}: not valid JSON: key 'train_micro_batch_size_per_gpu' given twice")
    # YAML's merge keys may still override what they bring in
    config.write_text(original.replace("model:\n", "defaults: &tiny\n  hidden_size: 16\nmodel:\n  <<: *tiny\n", 1))
    line = refused(capsys, _plan(config), owned)
    assert "unknown section(s) defaults" in line


# --- row 23: the vocabulary of --init-from and of the data --------------------------------------------


def test_init_from_with_data_of_another_vocabulary_says_prepare_with_its_tokenizer(capsys, stored_export, tiny_data,
                                                                                  config, tmp_path):
    """The model comes from --init-from (no model section); the data's tokenizer has another size: the data is
    what must change. A model.vocab_size set to the data's size (the old hint) points at the same command."""
    run_dir = tmp_path / "run"
    raw = yaml.safe_load(config.read_text())
    raw.pop("model")
    write_yaml(config, raw)
    argv = ["pretrain", "--num_gpus", "1", "--config", config, "--run-dir", run_dir, "--init-from", stored_export,
            "--dry-run"]
    line = refused(capsys, argv, [stored_export, tiny_data, config])
    assert "was tokenized with a vocabulary of 900 pieces" in line and "init_from" in line
    assert line.endswith(f"prepare the data with `roformer data prepare --tokenizer {stored_export} ...`")
    assert "set model.vocab_size" not in line
    write_yaml(config, {**raw, "model": {"vocab_size": 900}})
    line = refused(capsys, argv, [stored_export, tiny_data, config])
    assert line.endswith(f"(data for it is prepared with `roformer data prepare --tokenizer {stored_export} ...`)")
    assert not run_dir.exists()


# --- rows 24, 25: eval-mlm --threads, --report-to -----------------------------------------------------


def test_threads_and_report_to_are_refused_naming_the_command(capsys, stored_export, tiny_data, config, texts_dir):
    line = refused(capsys, ["eval-mlm", stored_export, "--data", tiny_data, "--threads", "-3"], [stored_export])
    assert line.endswith("argument --threads: must be >= 0, got '-3'")
    line = refused(capsys, ["finetune", stored_export, "--train", texts_dir / "train.csv", "--report-to",
                            "tensorboard"], [stored_export, texts_dir])
    assert line.endswith("argument --report-to: tensorboard: a fine-tune writes no TensorBoard files; its trackers "
                         "are mlflow and wandb (the JSON report: --out)")
    line = refused(capsys, ["pretrain", "--config", config, "--report-to", "foo", "--dry-run"], [config])
    assert line == "roformer pretrain: error: --report-to: unknown foo (known: tensorboard, mlflow, wandb, none)"
    capsys.readouterr()  # no command, an unknown one: one line, no usage block
    assert cli_main([]) == 2 and capsys.readouterr().err == ("roformer: error: the following arguments are required: "
                                                             "COMMAND\n")
    assert cli_main(["bogus"]) == 2 and capsys.readouterr().err.startswith(
        "roformer: error: argument COMMAND: invalid choice: 'bogus' (choose from ")


# --- row 27: wording of config errors -----------------------------------------------------------------


@pytest.mark.parametrize("setting, says", [
    ("model=5", "section 'model' must be a mapping of RoFormerConfig fields (hidden_size: ..., num_hidden_layers: "
                "...), got 5"),
    ("data.cache_dir=~", "data.cache_dir: no value (YAML reads a bare ~ or null as none); quote a path: "
                         "cache_dir: \"~/...\"")])
def test_config_wording_says_what_is_wrong(capsys, tiny_data, config, setting, says):
    assert refused(capsys, _plan(config, setting), [tiny_data, config]).endswith(f"{config}: {says}")


def test_stages_given_as_a_mapping_say_they_must_be_a_list(capsys, tiny_data, config, tmp_path):
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text("stages: {name: a}\n")
    line = refused(capsys, _plan(config), [tiny_data, tmp_path])
    assert line.endswith(f"{schedule}: stages: must be a list of stages (each line starting with '- '), got dict "
                         f"{{'name': 'a'}}")


# --- row 22: an endpoint that is no URL ---------------------------------------------------------------


@pytest.mark.parametrize("variable, value, reason", [
    ("AWS_ENDPOINT_URL", "not a url", "no http:// or https:// and host"),
    ("AWS_ENDPOINT_URL", "ftp://127.0.0.1:9", "scheme 'ftp'"),
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:99999", "port '99999' out of 0-65535")])
def test_data_upload_names_the_endpoint_variable(capsys, monkeypatch, tiny_data, variable, value, reason):
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    line = refused(capsys, ["data", "upload", tiny_data, "s3://bkt/z", "--remote-retries", "0"], [tiny_data])
    assert line.endswith(f"s3://bkt/z: {variable}={value!r} is not an endpoint URL ({reason}): expected "
                         f"http(s)://HOST[:PORT]")


# --- row 26: a tokenizer of special pieces only -------------------------------------------------------


def test_a_tokenizer_of_special_pieces_only_is_refused_at_prepare_time(capsys, texts_dir, tmp_path):
    """A BERT-style vocab.txt and a tokenizer.json (WordLevel) holding only [PAD] [UNK] [CLS] [SEP] [MASK]."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from tests.support.hf_dirs import SPECIALS

    vocab_txt = tmp_path / "vocab_only"
    vocab_txt.mkdir()
    (vocab_txt / "vocab.txt").write_text("".join(f"{piece}\n" for piece in SPECIALS), encoding="utf-8")
    (vocab_txt / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer"}', encoding="utf-8")
    fast = tmp_path / "fast_only"
    backend = Tokenizer(models.WordLevel({piece: i for i, piece in enumerate(SPECIALS)}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(fast))
    for tokenizer, file in ((vocab_txt, "vocab.txt"), (fast, "tokenizer.json")):
        out = tmp_path / f"out_{tokenizer.name}"
        line = refused(capsys, ["data", "prepare", "--input", texts_dir / "train.csv", "--out", out, "--format", "txt",
                                "--tokenizer", tokenizer], [texts_dir, tokenizer], progress=True)
        assert line.endswith(f"{tokenizer / file}: the vocabulary holds only its {len(SPECIALS)} special pieces, no "
                             f"ordinary piece to encode text with (every word would be [UNK]); use a tokenizer with a "
                             f"vocabulary, or leave out --tokenizer so that `data prepare` trains one"), line
        assert not out.exists()


# --- row 27: wording of labelled and text files -------------------------------------------------------


def test_labelled_files_say_what_is_wrong(capsys, stored_export, texts_dir, tmp_path):
    owned = [stored_export, texts_dir]
    train = texts_dir / "train.csv"
    fifo = tmp_path / "pipe.csv"  # not among the owned files: hashing them would wait on the FIFO
    os.mkfifo(fifo)
    line = refused(capsys, ["finetune", stored_export, "--train", fifo, "--dev", train], owned)
    assert line.endswith(f"{fifo}: not a regular file (a FIFO, socket or device); give a file, it is read twice")
    folder = texts_dir / "folder.csv"
    folder.mkdir()
    line = refused(capsys, ["finetune", stored_export, "--train", train, "--dev", folder], owned)
    assert line.endswith(f"{folder}: a directory; give the labelled file itself")
    latin = texts_dir / "latin.csv"
    latin.write_bytes("text,label\nfine words,pos\ncaf\xe9 words,neg\n".encode("latin-1"))
    line = refused(capsys, ["finetune", stored_export, "--train", latin, "--dev", train], owned)
    assert line.endswith(f"{latin}: line 3: not UTF-8 text (byte 0xe9); save it as UTF-8")
    twice = texts_dir / "twice.csv"
    twice.write_text("text,label,label\nsome words,pos,neg\nmore words,neg,pos\n", encoding="utf-8")
    line = refused(capsys, ["finetune", stored_export, "--train", twice, "--dev", train], owned)
    assert line.endswith(f"{twice}: line 1: column 'label' named twice in the header; rename one")


def test_a_fifo_as_corpus_or_config_is_named_not_read(capsys, texts_dir, tmp_path):
    fifo = tmp_path / "pipe.txt"  # not among the owned files: hashing them would wait on the FIFO
    os.mkfifo(fifo)
    line = refused(capsys, ["data", "prepare", "--input", fifo, "--out", tmp_path / "out"], [texts_dir],
                   progress=True)
    assert line.endswith(f"{fifo}: not a regular file (a FIFO, socket or device); give a file or a directory of "
                         f"files (they are read more than once)")
    line = refused(capsys, ["plan", "--world-size", "1", "--config", fifo], [texts_dir])
    assert line.endswith(f"{fifo}: not a regular file (a FIFO, socket or device); the run config is a file")
    assert not (tmp_path / "out").exists()


def test_a_text_file_of_unknown_type_says_how_to_read_it(capsys, stored_export, texts_dir):
    train = texts_dir / "train.csv"
    line = refused(capsys, ["eval-mlm", stored_export, "--input", train], [stored_export, texts_dir])
    assert line.endswith(f"{train}: unknown file type .csv: text is read from .txt, .jsonl, .json or .parquet files "
                         f"(optionally .gz); rename it, or give `data prepare` its format with --format "
                         f"txt|jsonl|parquet")
    assert "set the format explicitly" not in line


# --- row 27: an s3:// output inside another data set --------------------------------------------------


def test_an_s3_output_inside_another_data_set_is_refused(capsys, monkeypatch, s3_server, s3_tiny_data, tiny_data,
                                                        texts_dir):
    """s3_tiny_data is prepared data at s3://roformer-test/tiny: its train/ prefix is not a place for another."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    inside = f"{s3_tiny_data}/train"
    client = s3_server.client()
    before = sorted(o["Key"] for o in client.list_objects_v2(Bucket="roformer-test")["Contents"])
    line = refused(capsys, ["data", "prepare", "--input", texts_dir / "train.csv", "--format", "txt", "--out", inside,
                            "--remote-retries", "0"], [texts_dir], progress=True)
    assert line.endswith(f"--out {inside}: inside the prepared data at {s3_tiny_data} (it has a manifest.json): "
                         f"choose a prefix outside it")
    line = refused(capsys, ["data", "upload", tiny_data, f"{inside}/deeper", "--remote-retries", "0"], [tiny_data])
    assert line.endswith(f"destination {inside}/deeper: inside the prepared data at {s3_tiny_data} (it has a "
                         f"manifest.json): choose a prefix outside it")
    assert sorted(o["Key"] for o in client.list_objects_v2(Bucket="roformer-test")["Contents"]) == before


def test_launch_and_pricing_flags_state_their_range(capsys, tiny_data, config, tmp_path):
    run_dir = tmp_path / "run"
    for value in ("-2", "0"):
        line = refused(capsys, ["pretrain", "--num_gpus", value, "--config", config, "--run-dir", run_dir,
                                "--dry-run"], [tiny_data, config])
        assert line.endswith(f"--num_gpus {value}: must be >= 1 when given (-1: all of them)")
    line = refused(capsys, [*_plan(config), "--peak-tflops", "-1"], [tiny_data, config])
    assert line.endswith("argument --peak-tflops: must be > 0, got '-1'")
    assert not run_dir.exists()


# --- row 21: flags of data prepare (object storage included) ------------------------------------------


@pytest.mark.parametrize("flag, value, tail", [
    ("--remote-timeout", "0", "argument --remote-timeout: must be > 0, got '0'"),
    ("--remote-timeout", "nan", "argument --remote-timeout: must be a finite number, got 'nan'"),
    ("--remote-retries", "-1", "argument --remote-retries: must be >= 0, got '-1'"),
    ("--vocab-size", "-5", "--vocab-size: -5 is too small (need >= 15)"),
    ("--workers", "-2", "--workers: -2 must be >= 1"),
    ("--shard-tokens", "0", "--shard-tokens: 0 must be >= 1"),
    ("--valid-fraction", "2", "--valid-fraction: 2.0 must be in [0, 1)")])
def test_data_prepare_values_name_the_flag(capsys, texts_dir, tmp_path, flag, value, tail):
    """Checked where parsed (argparse types), or by the data config and then named by the flag the user gave."""
    out = tmp_path / "out"
    line = refused(capsys, ["data", "prepare", "--input", texts_dir / "train.csv", "--format", "txt", "--out", out,
                            flag, value], [texts_dir])
    assert line == f"roformer data: error: {tail}"
    assert not out.exists()
