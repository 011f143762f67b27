"""Continuing pretraining from an existing model with real DeepSpeed ranks (issue 23 part 2).

1. Our own export (the session's trainer_export) continued by 2 ranks under ZeRO-2 at a learning rate
   of 1e-9: the continued run's export keeps its weights (max |diff| <= 1e-5), its first training
   loss is the export's own eval-mlm loss on the same data (not a random init's), and the run's
   report and model card say where it started.
2. A directory laid out as junnyu/roformer_chinese_base (BERT's special ids, RoFormerTokenizer with
   jieba, pytorch_model.bin; no project code): `roformer data prepare --tokenizer DIR`, a run with
   init_from DIR on 2 ranks under ZeRO-3 (the loaded weights partitioned by deepspeed.initialize), its
   export, transformers alone (project imports blocked) gets the
   source's ids and logits back from the export, eval-mlm and finetune run on it.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from launcher.export.exporter import export_checkpoint
from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm
from tests.support.corpus_files import chinese_paragraphs, write_jsonl
from tests.support.helpers import (NO_DROPOUT, REPO, hf_isolated_logits, report_of, roformer, run_to_end,
                                   tiny_run_config, train_losses, write_yaml)
from tests.support.hf_dirs import BERT_IDS, roformer_chinese_dir
from tests.support.tiny_models import eval_mlm_with_random_twin, one_thread, train_tiny_mlm

SEQ_LEN, GLOBAL_BATCH = 64, 32  # one step = 32 x 63 tokens, ~300 masked: a steady first loss
CONTINUE = {"stages": [{"name": "continue", "max_seq_len": SEQ_LEN, "global_batch_size": GLOBAL_BATCH, "steps": 2}],
            "optimizer": {"lr": 1e-9, "warmup_steps": 0, "decay": "constant"},
            "schedule": {"max_tokens_per_micro_batch": SEQ_LEN * GLOBAL_BATCH // 2},
            "checkpoint": {"every_steps": 0}, "logging": {"valid_every": 0, "progress_bar": False}}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """This module's in-process torch work (exports, eval-mlm, finetune, the trained model) on one thread: tiny
    matrices gain nothing from a second, and on the CI's shared cores a second thread spins waiting for one."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def continued(tmp_path_factory, tiny_data, trainer_export):
    root = tmp_path_factory.mktemp("continued")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, init_from=str(trainer_export), **CONTINUE)
    run_dir = root / "run"
    run_to_end(2, config, run_dir)
    return run_dir, export_checkpoint(run_dir, root / "export")


def test_a_resumed_run_continues_from_its_checkpoint_not_from_init_from(tmp_path, tiny_data, trainer_export,
                                                                          continued):
    """DIR's weights are replaced by random ones after the run started; resuming with one more step
    must not read them: the export still has trainer_export's weights, and init_from.json is untouched."""
    from roformer import RoFormerForMaskedLM
    from roformer.hf_interop import read_hf_directory, write_pretrained_files

    run_dir = tmp_path / "run"
    shutil.copytree(continued[0], run_dir)
    source = tmp_path / "source"
    shutil.copytree(trainer_export, source)
    record = json.loads((run_dir / "init_from.json").read_text())
    config, _, _ = read_hf_directory(source)
    torch.manual_seed(1)
    write_pretrained_files(RoFormerForMaskedLM(config), source)  # same config.json and tokenizer, other weights
    stages = [{**CONTINUE["stages"][0], "steps": 3}]
    resume = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, init_from=str(source),
                             **{**CONTINUE, "stages": stages})
    run_to_end(2, resume, run_dir)
    assert sorted(train_losses(run_dir)) == [1, 2, 3]
    assert json.loads((run_dir / "init_from.json").read_text()) == record
    before = load_file(str(trainer_export / "model.safetensors"))
    after = load_file(str(export_checkpoint(run_dir, tmp_path / "export") / "model.safetensors"))
    assert max((before[k] - after[k]).abs().max().item() for k in before) <= 1e-5


def test_continuing_our_export_at_a_tiny_learning_rate_keeps_its_weights(continued, trainer_export):
    _, export = continued
    before, after = load_file(str(trainer_export / "model.safetensors")), load_file(str(export / "model.safetensors"))
    assert set(before) == set(after)
    assert max((before[k] - after[k]).abs().max().item() for k in before) <= 1e-5


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory, tiny_data):
    """An export-format directory (hf_interop.save_pretrained + the data's tokenizer files) of the tiny
    model trained in this process with plain torch (150 steps of 16 x 32 tokens, ~15 s on a quiet core): MLM
    loss ~5.8 against ~6.8 at random init, a gap the first-loss comparison can see (trainer_export's 16
    steps leave ~0.2)."""
    from data_pipeline import copy_hf_tokenizer_files
    from roformer.hf_interop import save_pretrained

    out = save_pretrained(train_tiny_mlm(tiny_data), tmp_path_factory.mktemp("trained") / "model")
    copy_hf_tokenizer_files(tiny_data, out)
    return out


def test_first_loss_is_the_models_loss_not_a_random_inits(trained_dir, tiny_data, tmp_path):
    """The first step's loss of a run continuing trained_dir (32 sequences of 64 tokens of the train
    split, before any update; 1 rank) against eval-mlm of trained_dir on the same split and length, and
    of its random-init twin (same config and tokenizer, fresh weights): the run starts where the model is."""
    from roformer.hf_interop import read_hf_directory

    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, init_from=str(trained_dir),
                             **{**CONTINUE, "stages": [{**CONTINUE["stages"][0], "steps": 1}]})
    run_to_end(1, config, tmp_path / "run")
    first = train_losses(tmp_path / "run")[1]
    model_config, _, _ = read_hf_directory(trained_dir)
    losses = dict(zip(("model", "random"), eval_mlm_with_random_twin(
        trained_dir, model_config, tiny_data, tmp_path, SEQ_LEN, tokens=16 * GLOBAL_BATCH * (SEQ_LEN - 1))))
    print(f"first training loss {first:.4f}; eval-mlm: model {losses['model']:.4f}, random init "
          f"{losses['random']:.4f} (ln V = {math.log(model_config.vocab_size):.4f})")
    gap = losses["random"] - losses["model"]
    assert gap > 0.5  # the model learned something its twin has not
    # ~300 masked tokens in the first step: a standard error of ~0.1 nats around the model's loss.
    assert abs(first - losses["model"]) < gap / 3
    assert losses["random"] - first > 2 * gap / 3


def test_where_it_started_is_in_the_records_report_and_model_card(continued, trainer_export, tmp_path):
    import hashlib

    run_dir, export = continued
    record = json.loads((run_dir / "init_from.json").read_text())
    sha = hashlib.sha256((trainer_export / "model.safetensors").read_bytes()).hexdigest()
    assert record["path"] == str(trainer_export.resolve()) and record["weights_sha256"] == sha
    assert record["mlm_head"] == "loaded" and record["tokenizer_sha256"] is not None
    line = f"{trainer_export.resolve()} (model.safetensors sha256 {sha}, MLM head loaded)"
    assert f"| started from | {line} |" in report_of(run_dir, tmp_path / "report")
    assert f"| started from | {line} |" in (export / "README.md").read_text()
    # Optimizer, schedule and data position started fresh: step 1 is the first, at the configured lr.
    losses = train_losses(run_dir)
    assert sorted(losses) == [1, 2]


def test_a_hub_roformer_directory_round_trips(tmp_path):
    """A directory laid out as junnyu/roformer_chinese_base (vocab.txt in BERT's layout: [PAD]=0 [UNK]=100
    [CLS]=101 [SEP]=102 [MASK]=103; RoFormerTokenizer with jieba; pytorch_model.bin; no project code):
    `roformer data prepare --tokenizer DIR` on 2 workers holds transformers' ids for every document,
    a pretraining run with init_from DIR on 2 ranks under ZeRO-3 (the loaded weights partitioned by
    deepspeed.initialize) at a learning rate of 1e-9 keeps the weights, its export keeps DIR's
    tokenizer files, transformers alone (project imports blocked) gets DIR's ids and logits back from
    the export, and eval-mlm and finetune run on it.
    The run's ranks are forked warm and the export, eval-mlm and finetune run in this process: the commands
    themselves are checked end to end elsewhere (`roformer pretrain` with its launcher: test_restarts.py,
    test_guard.py (a); --init-from is --set init_from=DIR, resolved by --dry-run in tests/unit/test_init_from.py;
    `roformer export`: tests/unit/test_export_length.py)."""
    from transformers import AutoTokenizer

    from data_pipeline import open_corpus
    from launcher.downstream.fine_tuning import FinetuneConfig, finetune
    from launcher.downstream.task_spec import TaskSpec
    from roformer.hf_interop import from_hf_state_dict, to_hf_state_dict

    texts = list(dict.fromkeys(chinese_paragraphs(3)))  # prepare drops duplicates
    source = roformer_chinese_dir(tmp_path / "hf", texts, seed=5)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)
    prepared = roformer("data", "prepare", "--input", str(corpus), "--out", str(tmp_path / "data"),
                        "--tokenizer", str(source), "--valid-fraction", "0.05", "--workers", "2")
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["special_ids"] == BERT_IDS
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    expected = sorted(tokenizer(texts, add_special_tokens=False)["input_ids"])
    shards = [shard for split in ("train", "valid") for shard in open_corpus(tmp_path / "data", split).shards]
    got = sorted(shard.token_ids[shard.offsets[d]:shard.offsets[d + 1]].tolist()
                 for shard in shards for d in range(shard.documents))
    assert got == expected  # every document, exactly transformers' ids

    zero3 = json.loads((REPO / "ds_configs" / "cpu_fp32_zero2.json").read_text())
    zero3["zero_optimization"] = {"stage": 3}
    ds_config = tmp_path / "cpu_fp32_zero3.json"
    ds_config.write_text(json.dumps(zero3))
    config = tiny_run_config(tmp_path, tmp_path / "data", **CONTINUE)
    raw = yaml.safe_load(config.read_text())
    raw.pop("model")  # everything about the model comes from the directory
    raw["deepspeed"]["config"] = str(ds_config)
    raw["init_from"] = str(source)  # what `roformer pretrain --init-from DIR` sets (= --set init_from=DIR)
    write_yaml(config, raw)
    run_to_end(2, config, tmp_path / "run")
    export = export_checkpoint(tmp_path / "run", tmp_path / "export")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert (export / name).read_bytes() == (source / name).read_bytes(), name

    hub = torch.load(source / "pytorch_model.bin", weights_only=True)
    before = from_hf_state_dict(hub)
    after = from_hf_state_dict(load_file(str(export / "model.safetensors")))
    assert set(before) == set(after)
    # Back in transformers' names: DIR's parameters but the decoder (tied to the word embeddings, its bias
    # cls.predictions.bias) and the sinusoidal table transformers builds itself.
    assert set(hub) - set(to_hf_state_dict(after)) == {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                                                       "roformer.encoder.embed_positions.weight"}
    assert set(to_hf_state_dict(after)) < set(hub)
    assert max((before[k] - after[k]).abs().max().item() for k in before) <= 1e-5
    work = tmp_path / "hf_out"
    work.mkdir()
    theirs, ours = hf_isolated_logits([source, export], texts[:3], work)
    assert theirs["info"]["tokenizer_class"] == ours["info"]["tokenizer_class"] == "RoFormerTokenizer"
    assert torch.equal(theirs["input_ids"], ours["input_ids"]) and theirs["input_ids"][0, 0].item() == 101
    real = theirs["attention_mask"].bool()
    assert (theirs["logits"][real] - ours["logits"][real]).abs().max().item() <= 1e-4

    report = evaluate_mlm(MLMEvalConfig(export_dir=export, data_dir=tmp_path / "data", split="train",
                                        seq_lens=[SEQ_LEN], tokens=4096))
    loss = report["results"][0]["loss"]
    assert abs(loss - math.log(len(tokenizer))) < 0.5  # random weights: about uniform over the vocabulary
    rows = [{"text": text, "label": int(any("a" <= c <= "z" for c in text.lower()))} for text in texts]
    task = TaskSpec(name="latin", train=write_jsonl_rows(tmp_path / "train.jsonl", rows[:96]),
                    dev=write_jsonl_rows(tmp_path / "dev.jsonl", rows[96:]))
    tuned = finetune(FinetuneConfig(export_dir=export, task=task, max_length=SEQ_LEN, epochs=1, batch_size=16),
                     log=lambda message: None, progress=False)
    assert tuned["runs"][0]["dev"]["examples"] == len(rows) - 96 and 0 <= tuned["runs"][0]["dev"]["accuracy"] <= 1
    assert tuned["unk_token_share"]["train"] < 0.05  # the export's tokenizer covers the text it was built from


def write_jsonl_rows(path, rows):
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path
