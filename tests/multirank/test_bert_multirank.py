"""A BERT continued as RoFormer, and learned-position runs exported as BERT, with real DeepSpeed ranks.

1. A BertForMaskedLM saved by transformers (WordPiece vocab.txt trained by `tokenizers` on real text):
   data prepared with DIR's tokenizer, a run with init_from DIR on 2 ranks under ZeRO-2 at a learning rate
   of 1e-9 (continued as RoPE, the default), its export: every mapped tensor is the BERT's (1e-5) and the
   export has no absolute position table; init_from.json, the report and the model card say it was a BERT
   and what was dropped.
2. A BertModel (pytorch_model.bin, no MLM head) continued with `position_encoding: learned` on 2 ranks:
   the export is a BertForMaskedLM directory, every encoder tensor the source's, the position table kept,
   and transformers alone (project imports blocked) reproduces our logits from it.
3. A learned-position model trained here with plain torch and written by the export's BERT writer,
   continued as RoPE (1 rank): its first training loss is far below its random-init twin's.

The preparation and the exports run in this process, the ranks forked warm (tests/support/helpers.py start_run):
the commands end to end are checked elsewhere (`roformer data prepare --tokenizer DIR`: test_init_from_multirank.py's
hub test; `roformer export`: tests/unit/test_export_length.py).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from tests.support.corpus_files import english_paragraphs, write_jsonl
from launcher.export.exporter import export_checkpoint
from tests.support.helpers import (NO_DROPOUT, TINY_MODEL, hf_isolated_logits, report_of, run_to_end, tiny_run_config,
                                   train_losses)
from tests.support.hf_dirs import bert_dir
from tests.support.tiny_models import eval_mlm_with_random_twin, one_thread, train_tiny_mlm

SEQ_LEN, GLOBAL_BATCH = 64, 16
CONTINUE = {"stages": [{"name": "continue", "max_seq_len": SEQ_LEN, "global_batch_size": GLOBAL_BATCH, "steps": 2}],
            "optimizer": {"lr": 1e-9, "warmup_steps": 0, "decay": "constant"},
            "schedule": {"max_tokens_per_micro_batch": SEQ_LEN * GLOBAL_BATCH // 2},
            "checkpoint": {"every_steps": 0}, "logging": {"valid_every": 0, "progress_bar": False}}
POSITIONS = "bert.embeddings.position_embeddings.weight"


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """This module's in-process torch work (preparation, exports, logits, the trained model) on one thread: tiny
    matrices gain nothing from a second, and on the CI's shared cores a second thread spins waiting for one."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return list(dict.fromkeys(english_paragraphs(12)))


def _prepared(root, source, texts):
    """`roformer data prepare --input CORPUS --out DATA --tokenizer SOURCE --valid-fraction 0.05`'s preparation, in
    this process (the command itself with a transformers directory: test_init_from_multirank.py's hub test)."""
    from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
    from data_pipeline.prepare import prepare

    corpus = write_jsonl(root / "corpus.jsonl", texts)
    prepare(PrepareConfig(input=InputConfig(inputs=[str(corpus)]), out_dir=root / "data", existing_tokenizer=source,
                          cleaning=CleaningConfig(valid_fraction=0.05)), log=lambda message: None)
    return root / "data"


def _continued(root, source, data, model: dict | None = None):
    """init_from: source, on 2 ranks (model section from source, plus `model`), exported (in this process: `roformer
    export` itself is checked in tests/unit/test_export_length.py)."""
    import yaml

    config = tiny_run_config(root, data, **CONTINUE)
    raw = yaml.safe_load(config.read_text())
    raw.pop("model")
    if model:
        raw["model"] = model
    raw["init_from"] = str(source)
    config.write_text(yaml.safe_dump(raw))
    run_dir = root / "run"
    run_to_end(2, config, run_dir)
    return run_dir, export_checkpoint(run_dir, root / "export")


@pytest.fixture(scope="module")
def from_bert_mlm(tmp_path_factory, texts):
    root = tmp_path_factory.mktemp("bert_mlm")
    source = bert_dir(root / "bert", texts, seed=1)
    return (source, *_continued(root, source, _prepared(root, source, texts)))


def test_a_bert_continued_as_rope_keeps_every_mapped_tensor(from_bert_mlm, tmp_path):
    source, run_dir, export = from_bert_mlm
    before = load_file(str(source / "model.safetensors"))
    after = load_file(str(export / "model.safetensors"))
    assert json.loads((export / "config.json").read_text())["model_type"] == "roformer"
    assert not any("position_embeddings" in key for key in after)  # only RoPE's derived sin/cos table
    mapped = {key: "roformer." + key.removeprefix("bert.") if key.startswith("bert.") else key
              for key in before if key != POSITIONS and not key.startswith("cls.predictions.decoder")}
    assert set(mapped.values()) <= set(after)
    assert max((before[k] - after[v]).abs().max().item() for k, v in mapped.items()) <= 1e-5
    record = json.loads((run_dir / "init_from.json").read_text())
    assert (record["model_type"], record["dropped"], record["fresh"]) == ("bert", [POSITIONS], [])
    line = f"a bert: dropped {POSITIONS}; initialised fresh nothing |"
    assert line in report_of(run_dir, tmp_path / "report") and line in (export / "README.md").read_text()
    for name in ("vocab.txt", "tokenizer_config.json"):
        assert (export / name).read_bytes() == (source / name).read_bytes(), name


def test_a_bert_model_continued_as_learned_exports_as_a_bert_transformers_reproduces(tmp_path_factory, texts):
    root = tmp_path_factory.mktemp("bert_model")
    source = bert_dir(root / "bert", texts, head=False, safetensors=False, seed=2)
    run_dir, export = _continued(root, source, _prepared(root, source, texts), model={"position_encoding": "learned"})
    hf_config = json.loads((export / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["architectures"]) == ("bert", ["BertForMaskedLM"])
    assert hf_config["max_position_embeddings"] == 256
    before = torch.load(source / "pytorch_model.bin", weights_only=True)
    after = load_file(str(export / "model.safetensors"))
    encoder = {key: "bert." + key for key in before if not key.startswith("pooler.")}
    assert "bert." + POSITIONS.removeprefix("bert.") in encoder.values()
    assert max((before[k] - after[v]).abs().max().item() for k, v in encoder.items()) <= 1e-5
    assert {k for k in after if k.startswith("cls.")} == {"cls.predictions.transform.dense.weight",
                                                          "cls.predictions.transform.dense.bias",
                                                          "cls.predictions.transform.LayerNorm.weight",
                                                          "cls.predictions.transform.LayerNorm.bias",
                                                          "cls.predictions.bias"}
    record = json.loads((run_dir / "init_from.json").read_text())
    assert record["mlm_head"] == "new" and record["dropped"] == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    assert "BERT (learned absolute positions) masked-LM export" in (export / "README.md").read_text()
    info = json.loads((export / "export_info.json").read_text())
    assert {"config.json", "model.safetensors", "vocab.txt", "README.md"} <= set(info["sha256"])

    from roformer.hf_interop import load_pretrained

    work = tmp_path_factory.mktemp("hf_out")
    (theirs,) = hf_isolated_logits([export], texts[:3], work)
    assert theirs["info"]["model_class"] == "BertForMaskedLM"
    ours = load_pretrained(export).eval()
    with torch.no_grad():
        logits = ours(theirs["input_ids"], attention_mask=theirs["attention_mask"]).logits
    real = theirs["attention_mask"].bool()
    assert (logits[real] - theirs["logits"][real]).abs().max().item() <= 1e-4


def test_a_learned_models_bert_export_continued_as_rope_starts_far_below_random(tiny_data, tmp_path):
    """Learned positions trained here (plain torch, 150 steps of 16 x 32 tokens), written as the export
    writes a learned run (a BERT + the data's tokenizer), continued as RoPE on 1 rank: the first step's
    loss (before any update) is far below eval-mlm of a random-init RoPE twin on the same split; the
    position table was the only thing lost."""
    from data_pipeline import copy_hf_tokenizer_files
    from roformer import RoFormerConfig
    from roformer.bert_interop import write_bert_files

    model = train_tiny_mlm(tiny_data, position_encoding="learned", max_position_embeddings=SEQ_LEN)
    bert = tmp_path / "bert"
    bert.mkdir()
    write_bert_files(model, bert)
    copy_hf_tokenizer_files(tiny_data, bert)

    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, init_from=str(bert),
                             **{**CONTINUE, "stages": [{**CONTINUE["stages"][0], "steps": 1}]})
    import yaml

    raw = yaml.safe_load(config.read_text())
    raw["model"] = NO_DROPOUT  # everything else from the BERT: RoPE, the default for a BERT source
    config.write_text(yaml.safe_dump(raw))
    run_to_end(1, config, tmp_path / "run")
    first = train_losses(tmp_path / "run")[1]
    twin_config = RoFormerConfig(**{**TINY_MODEL, **NO_DROPOUT})
    losses = dict(zip(("bert", "random"), eval_mlm_with_random_twin(
        bert, twin_config, tiny_data, tmp_path, SEQ_LEN, tokens=8 * GLOBAL_BATCH * (SEQ_LEN - 1))))
    print(f"first loss as RoPE {first:.4f}; eval-mlm: learned BERT {losses['bert']:.4f}, random RoPE init "
          f"{losses['random']:.4f} (ln V = {math.log(twin_config.vocab_size):.4f})")
    gap = losses["random"] - losses["bert"]
    assert gap > 0.5  # the learned model learned something
    assert losses["random"] - first > gap / 2  # converted, it keeps most of it
