"""Continuing from an existing model (issue 23 part 2), the parts that need no DeepSpeed job: the run
config's init_from (model section from DIR, shape changes refused naming both values), the weights
loaded into the model the engine gets (a bare RoFormerModel source gets a new MLM head), the record of
where the run started, `data prepare --tokenizer` with a plain transformers tokenizer directory, and
`pretrain --init-from` refusing data tokenized with another tokenizer. DIRs are written by plain
transformers / tokenizers (tests/support/hf_dirs.py), not by this project."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.shards import open_corpus
from launcher.cli import main as cli_main
from launcher.config.run_config import dump_run_config
from launcher.resolved.init_from import load_config_and_init, load_run_config
from launcher.common.errors import UserError
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import describe_init, read_init_record, write_init_record
from launcher.train.engine import build_model
from launcher.train.init_weights import InitialWeights
from roformer.hf_interop import to_hf_state_dict
from tests.support.corpus_files import english_paragraphs, write_jsonl
from tests.support.helpers import REPO, init_from_config, run_config_dict, write_schedule, write_yaml
from tests.support.open_counts import counting_opens
from tests.support.hf_dirs import SPECIALS, plain_transformers_dir, wordpiece_tokenizer


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return english_paragraphs(12)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, texts) -> Path:
    """transformers' RoFormerForMaskedLM + a WordPiece tokenizer (vocab 700), save_pretrained."""
    return plain_transformers_dir(tmp_path_factory.mktemp("hf") / "mlm", texts)


@pytest.fixture(scope="module")
def hf_data(tmp_path_factory, hf_dir, texts) -> Path:
    """The texts prepared with hf_dir's tokenizer (`roformer data prepare --tokenizer hf_dir`)."""
    root = tmp_path_factory.mktemp("hf_data")
    corpus = write_jsonl(root / "corpus.jsonl", texts)
    out = root / "data"
    prepare(PrepareConfig(input=InputConfig(inputs=[str(corpus)]), out_dir=out, existing_tokenizer=hf_dir,
                          cleaning=CleaningConfig(valid_fraction=0.05)), log=lambda message: None)
    return out


def test_model_section_comes_from_the_directory(tmp_path, hf_dir):
    hf = json.loads((hf_dir / "config.json").read_text())
    cfg = load_run_config(init_from_config(tmp_path, hf_dir))
    assert cfg.init_from == str(hf_dir)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(cfg.model, key) == hf[key]
    # Shape-free fields may change, from the config or --set; equal values of shape fields are accepted.
    cfg = load_run_config(init_from_config(tmp_path, hf_dir, model={"hidden_size": hf["hidden_size"]}),
                          ["model.hidden_dropout_prob=0.25", "model.attention_probs_dropout_prob=0.05"])
    assert (cfg.model.hidden_dropout_prob, cfg.model.attention_probs_dropout_prob) == (0.25, 0.05)
    # The resolved copy (config.yaml of the run) loads back to the same model.
    dump_run_config(cfg, tmp_path / "resolved.yaml")
    assert load_run_config(tmp_path / "resolved.yaml").model == cfg.model


@pytest.mark.parametrize("override, field, ours, theirs", [
    ("model.hidden_size=64", "hidden_size", "64", "32"),
    ("model.vocab_size=900", "vocab_size", "900", "700"),
    ("model.num_hidden_layers=3", "num_hidden_layers", "3", "2"),
])
def test_a_change_of_weight_shape_is_refused_naming_both_values(tmp_path, hf_dir, override, field, ours, theirs):
    with pytest.raises(UserError) as caught:
        load_run_config(init_from_config(tmp_path, hf_dir), [override])
    message = str(caught.value)
    assert f"model.{field}: {ours} differs from {theirs} in {hf_dir}/config.json" in message
    assert "\n" not in message


def test_init_from_errors_name_the_field(tmp_path, hf_dir):
    with pytest.raises(UserError, match="init_from: .* is not a directory"):
        load_run_config(init_from_config(tmp_path, tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="config.json missing"):
        load_run_config(init_from_config(tmp_path, tmp_path / "empty"))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(UserError, match="has no weights"):
        load_run_config(init_from_config(tmp_path, no_weights))
    # Relative to the config file's directory, like every other path of a run config.
    (tmp_path / "sub").mkdir()
    raw = yaml.safe_load(init_from_config(tmp_path, hf_dir).read_text())
    raw["init_from"] = "../" + hf_dir.name
    hf_sibling = tmp_path / hf_dir.name
    shutil.copytree(hf_dir, hf_sibling)
    cfg = load_run_config(write_yaml(tmp_path / "sub" / "run.yaml", raw))
    assert cfg.init_from == str(hf_sibling)
    # A run without init_from records no init_from key (its config.yaml is what it always was).
    assert "init_from" not in load_run_config(write_yaml(tmp_path / "plain.yaml", run_config_dict())).to_dict()


def test_weights_are_loaded_into_the_engine_model(tmp_path, hf_dir):
    import transformers

    cfg, init = load_config_and_init(init_from_config(tmp_path, hf_dir))
    initial = InitialWeights.read(init, cfg.model)
    model = build_model(cfg, initial)
    assert initial.new_head is False
    reference = transformers.RoFormerForMaskedLM.from_pretrained(str(hf_dir)).state_dict()
    ours = to_hf_state_dict(model.state_dict())
    assert set(ours) <= set(reference)
    assert max((ours[k] - reference[k]).abs().max().item() for k in ours) == 0.0
    record = initial.record()
    assert record["weights_file"] == "model.safetensors"
    assert record["weights_sha256"] == hashlib.sha256((hf_dir / "model.safetensors").read_bytes()).hexdigest()
    assert record["tokenizer_sha256"] == hashlib.sha256((hf_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert record["mlm_head"] == "loaded" and record["architectures"] == ["RoFormerForMaskedLM"]
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    write_init_record(run_dir, record)
    assert read_init_record(run_dir) == record
    assert describe_init(record).startswith(f"{hf_dir.resolve()} (model.safetensors sha256 {record['weights_sha256']}")


def test_a_bare_roformer_model_gets_a_new_mlm_head(tmp_path, texts):
    """RoFormerModel saved as pytorch_model.bin (read with torch.load(weights_only=True)): its encoder is
    loaded, the MLM head is the one the run's seed gives a fresh model, the same on every rank."""
    import transformers

    source = plain_transformers_dir(tmp_path / "encoder", texts, head=False, safetensors=False, seed=3)
    assert (source / "pytorch_model.bin").is_file() and not (source / "model.safetensors").exists()
    cfg, init = load_config_and_init(init_from_config(tmp_path, source))
    initial = InitialWeights.read(init, cfg.model)
    model = build_model(cfg, initial)
    assert initial.new_head is True and initial.record()["mlm_head"] == "new"
    encoder = transformers.RoFormerModel.from_pretrained(str(source)).state_dict()
    ours = to_hf_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("roformer.")})
    for key, value in ours.items():
        assert torch.equal(value, encoder[key.removeprefix("roformer.")]), key
    fresh = build_model(cfg).state_dict()  # random init from the same seed
    head = [k for k in fresh if k.startswith("mlm_head.")]
    assert head and all(torch.equal(model.state_dict()[k], fresh[k]) for k in head)
    assert not torch.equal(model.state_dict()["roformer.embeddings.word.weight"],
                           fresh["roformer.embeddings.word.weight"])


def test_prepare_with_a_transformers_tokenizer(hf_dir, hf_data, texts):
    """The corpus is tokenized with the model's own vocabulary: the ids are AutoTokenizer's, and the
    manifest's fingerprint is the sha256 of the tokenizer.json it came from."""
    from transformers import AutoTokenizer

    manifest = json.loads((hf_data / "manifest.json").read_text())
    assert manifest["tokenizer"]["path"] == "tokenizer/tokenizer.json"
    assert manifest["tokenizer"]["model_type"] == "WordPiece"
    assert manifest["tokenizer"]["vocab_size"] == 700
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((hf_dir / "tokenizer.json").read_bytes()).hexdigest()
    corpus = open_corpus(hf_data, "train")
    tokenizer = AutoTokenizer.from_pretrained(str(hf_data / "tokenizer"))
    shard = corpus.shards[0]
    first = np.asarray(shard.token_ids[shard.offsets[0]:shard.offsets[1]]).tolist()
    encoded = {tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts}
    assert tuple(first) in encoded
    starts = corpus.word_starts()  # whole-word masking: WordPiece's '##' pieces continue a word
    vocab = tokenizer.get_vocab()
    assert not starts[vocab["##s"]] and starts[vocab["the"]]


def test_a_tokenizer_with_other_special_ids_records_them(tmp_path, texts):
    """[MASK] at id 5 (an [unused0] before it): the manifest records the tokenizer's own ids."""
    tokenizer = wordpiece_tokenizer(texts, specials=SPECIALS[:4] + ["[unused0]", "[MASK]"])
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    write_jsonl(tmp_path / "c.jsonl", texts[:50])
    prepare(PrepareConfig(input=InputConfig(inputs=[str(tmp_path / "c.jsonl")]), out_dir=tmp_path / "data",
                          existing_tokenizer=tmp_path / "tok"), log=lambda message: None)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["special_ids"] == {"pad_token": 0, "unk_token": 1, "cls_token": 2, "sep_token": 3, "mask_token": 5}
    assert manifest["special_tokens"]["[MASK]"] == 5 and "[unused0]" not in manifest["special_tokens"]


def test_pretrain_refuses_data_of_another_tokenizer(capsys, tmp_path, hf_dir, hf_data, texts):
    """Same vocabulary size, other tokenizer (cased): refused in one line before anything starts."""
    other = wordpiece_tokenizer([t.upper() for t in texts])
    assert len(other) == 700
    other.save_pretrained(str(tmp_path / "other_tok"))
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    prepare(PrepareConfig(input=InputConfig(inputs=[str(corpus)]), out_dir=tmp_path / "other_data",
                          existing_tokenizer=tmp_path / "other_tok", cleaning=CleaningConfig(valid_fraction=0.05)),
            log=lambda message: None)
    raw = run_config_dict(data_dir=tmp_path / "other_data")
    raw.pop("model")
    config = write_yaml(tmp_path / "run.yaml", raw)
    argv = ["pretrain", "--num_gpus", "1", "--config", str(config), "--run-dir", str(tmp_path / "run"),
            "--init-from", str(hf_dir), "--dry-run"]
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was tokenized with tokenizer" in err[0] and f"not init_from's {hf_dir}" in err[0]
    assert not (tmp_path / "run").exists()
    # The data prepared with the model's own tokenizer passes the same checks.
    raw["data"]["data_dir"] = str(hf_data)
    write_yaml(config, raw)
    assert cli_main(argv) == 0


@pytest.mark.parametrize("micro_batch", [None, "auto"], ids=["micro-batch from max_tokens", "micro-batch auto"])
def test_a_ranks_start_up_reads_the_init_directory_and_the_deepspeed_json_once(tmp_path, hf_dir, hf_data, monkeypatch,
                                                                              micro_batch):
    """A rank's step 1 (check_inputs: the run config with DIR, the stages' DeepSpeed configs, the data and the
    tokenizer check), rank 0's resume decision and the initial weights open every input file at most once (the
    sys.addaudithook 'open' events): DIR's config.json and the DeepSpeed JSON once each, the data's manifest and
    tokenizer once for both splits; the later steps take what step 1 resolved (RankSetup).
    With `micro_batch_size: auto` on a declared device its memory plan reads no JSON of its own. `roformer plan`
    and --dry-run (check_run) resolve the same configs and shape."""
    from launcher.checkpoint import resume
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.inputs.run_checks import check_run
    from launcher.resolved.run_stages import stages_at
    from launcher.train.rank import check_inputs

    sections = {}
    if micro_batch == "auto":
        schedule = write_schedule(tmp_path / "schedule.yaml", [
            {"name": "one", "max_seq_len": 32, "global_batch_size": 4, "steps": 2, "micro_batch_size": "auto"}])
        sections = {"schedule_file": schedule, "hardware": {"device": "V100-16GB"}}
    config = init_from_config(tmp_path, hf_dir, data_dir=hf_data, **sections)
    ds_json = yaml.safe_load(config.read_text())["deepspeed"]["config"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    watched = [os.path.realpath(hf_dir / "config.json"), os.path.realpath(ds_json)]
    with counting_opens(tmp_path, hf_dir, hf_data, REPO / "ds_configs", REPO / "launcher" / "schedules") as opened:
        setup = check_inputs(["--config", str(config), "--run-dir", str(tmp_path / "run")])
        plan = resume.decide(setup.run_dir, setup.run, setup.train_batches, setup.branch_point)
        initial = InitialWeights.read(setup.run.init, setup.cfg.model)
    assert [opened.get(path) for path in watched] == [1, 1]
    assert {path: n for path, n in opened.items() if n > 1} == {}, opened
    assert os.path.realpath(hf_data / "manifest.json") in opened  # the data was read (here, once)
    # DIR's config.json is parsed once too: the rank's InitSource carries the typed config the weights were read
    # for, the one the run's model section was laid over (issue 62 R1).
    from launcher.config.run_config import WEIGHT_FIELDS
    from roformer.config import RoFormerConfig

    assert isinstance(setup.run.init.model, RoFormerConfig)
    assert {f: getattr(setup.run.init.model, f) for f in WEIGHT_FIELDS} == \
        {f: getattr(setup.cfg.model, f) for f in WEIGHT_FIELDS}
    assert plan.init_from == hf_dir and plan.ds_config == setup.run.ds_config(0) and initial.new_head is False
    assert initial.record()["tokenizer_sha256"] == setup.train_batches.corpus.tokenizer_sha256
    if micro_batch == "auto":
        assert setup.run.stages[0].micro_batch_size == 4 and "V100" in setup.run.stages[0].micro_batch_note
    read_again = DeepSpeedJson.of(setup.cfg)
    stages = stages_at(setup.cfg, 1, read_again)
    planned = check_run(setup.cfg, stages, 1, ds_json=read_again, init=setup.run.init).setup
    assert (planned.ds_configs, planned.shape) == (setup.run.ds_configs, setup.run.shape)



@pytest.mark.parametrize("command", [["plan", "--world-size", "1"], ["pretrain", "--dry-run", "--num_gpus", "1"]],
                         ids=["roformer plan", "roformer pretrain --dry-run"])
def test_the_launching_side_reads_the_init_directory_and_the_deepspeed_json_once(tmp_path, hf_dir, hf_data, capsys,
                                                                                 command):
    """`roformer plan` and `pretrain --dry-run` (the launch plan, every start-up check of the ranks, the memory and
    time estimate) with `micro_batch_size: auto`: every input file is opened at most once, DIR's config.json and
    the DeepSpeed JSON once each; the stages, checks and estimate take the DeepSpeedJson the load read
    (LaunchPlan.ds_json), `roformer plan`'s tokens per source the manifest the checks read."""
    schedule = write_schedule(tmp_path / "schedule.yaml", [
        {"name": "one", "max_seq_len": 32, "global_batch_size": 4, "steps": 2, "micro_batch_size": "auto"}])
    config = init_from_config(tmp_path, hf_dir, data_dir=hf_data, schedule_file=schedule,
                              hardware={"device": "V100-16GB"})
    ds_json = yaml.safe_load(config.read_text())["deepspeed"]["config"]
    watched = [os.path.realpath(hf_dir / "config.json"), os.path.realpath(ds_json)]
    with counting_opens(tmp_path, hf_dir, hf_data, REPO / "ds_configs") as opened:
        code = cli_main([command[0], "--config", str(config), *command[1:],
                         *(["--run-dir", str(tmp_path / "run")] if command[0] == "pretrain" else [])])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [opened.get(path) for path in watched] == [1, 1]
    assert {path: n for path, n in opened.items() if n > 1} == {}, opened  # the manifest too (plan's sources)
    assert "V100" in out  # the estimate ran, on the declared device
