"""A BERT in and out (roformer/bert_interop.py), the parts that need no DeepSpeed job: a BertForMaskedLM /
BertModel saved by plain transformers with a WordPiece vocab.txt trained by `tokenizers` (tests/support/
hf_dirs.py) as the `init_from` of a run (continued as RoPE by default, its position table dropped, or as
learned, the table kept), its config fields mapped or refused by name, the records of what was dropped
and initialised fresh, and a learned-position model written as a BERT that transformers reproduces."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from launcher.cli import main as cli_main
from launcher.resolved.init_from import load_config_and_init
from launcher.inputs.run_checks import init_source_note
from launcher.common.errors import UserError
from launcher.run_dir.records import describe_init
from launcher.train.engine import build_model
from launcher.train.init_weights import InitialWeights
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.bert_interop import BERT_POSITION_KEY, bert_state_dict, config_from_bert, write_bert_files
from roformer.config import ConfigError
from tests.support.corpus_files import english_paragraphs
from tests.support.helpers import TINY_MODEL, init_from_config
from tests.support.hf_dirs import bert_dir

HEAD = ["cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return english_paragraphs(12)


@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory, texts) -> Path:
    """transformers' BertForMaskedLM (256 positions) + a BERT English vocab.txt, save_pretrained."""
    return bert_dir(tmp_path_factory.mktemp("bert") / "mlm", texts, hidden_act="gelu_new", layer_norm_eps=1e-7)


def test_a_bert_is_continued_as_rope_by_default(tmp_path, bert_mlm):
    """Every tensor but the position table maps one to one (embeddings, token types, every layer, the MLM
    transform and the decoder's bias); the table is dropped, and the records say so."""
    import transformers

    cfg, init = load_config_and_init(init_from_config(tmp_path, bert_mlm))
    raw = json.loads((bert_mlm / "config.json").read_text())
    assert cfg.model.position_encoding == "rope" and cfg.model.max_position_embeddings is None
    assert (cfg.model.hidden_act, cfg.model.layer_norm_eps, cfg.model.vocab_size) == ("gelu_new", 1e-7, raw["vocab_size"])
    note = init_source_note(init, cfg.model)
    assert "is a BERT: continued as RoPE" in note and "256 rows dropped" in note and "\n" not in note
    initial = InitialWeights.read(init, cfg.model)
    model = build_model(cfg, initial)
    reference = transformers.BertForMaskedLM.from_pretrained(str(bert_mlm)).state_dict()
    ours = bert_state_dict(model.state_dict())
    assert BERT_POSITION_KEY not in ours and len(ours) == len(model.state_dict())
    assert set(ours) == {k for k in reference if k != BERT_POSITION_KEY and not k.startswith("cls.predictions.decoder")}
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
    record = initial.record()
    assert (record["model_type"], record["dropped"], record["fresh"], record["mlm_head"]) == \
        ("bert", [BERT_POSITION_KEY], [], "loaded")
    assert describe_init(record).endswith(f"a bert: dropped {BERT_POSITION_KEY}; initialised fresh nothing")


def test_a_bert_model_gets_a_fresh_head_and_learned_keeps_the_table(tmp_path, texts):
    """A BertModel (pooler included) saved as pytorch_model.bin, continued with position_encoding: learned:
    the table is kept, the pooler dropped, the MLM head the run's seed gives a fresh model."""
    import transformers

    source = bert_dir(tmp_path / "encoder", texts, head=False, safetensors=False, seed=3)
    cfg, init = load_config_and_init(init_from_config(tmp_path, source, model={"position_encoding": "learned"}))
    assert (cfg.model.position_encoding, cfg.model.max_position_embeddings) == ("learned", 256)
    assert "continued as it is" in init_source_note(init, cfg.model)
    initial = InitialWeights.read(init, cfg.model)
    model = build_model(cfg, initial)
    encoder = transformers.BertModel.from_pretrained(str(source)).state_dict()
    ours = bert_state_dict(model.state_dict())
    for key, value in ours.items():
        if key.startswith("bert."):
            assert torch.equal(value, encoder[key.removeprefix("bert.")]), key
    assert BERT_POSITION_KEY in ours
    fresh = build_model(cfg).state_dict()
    assert all(torch.equal(model.state_dict()[k], fresh[k]) for k in fresh if k.startswith("mlm_head."))
    record = initial.record()
    assert record["weights_file"] == "pytorch_model.bin" and record["mlm_head"] == "new"
    assert record["dropped"] == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"] and record["fresh"] == HEAD


def test_bert_config_fields_map_onto_ours_or_are_refused_by_name():
    raw = {"model_type": "bert", "vocab_size": 120, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "hidden_act": "relu", "layer_norm_eps": 1e-6, "type_vocab_size": 3,
           "pad_token_id": 1, "max_position_embeddings": 40, "hidden_dropout_prob": 0.0, "use_cache": True}
    config = config_from_bert(raw, "learned", source="x/config.json")
    assert (config.hidden_act, config.layer_norm_eps, config.type_vocab_size, config.pad_token_id,
            config.max_position_embeddings, config.hidden_dropout_prob) == ("relu", 1e-6, 3, 1, 40, 0.0)
    for change, field in (({"is_decoder": True}, "is_decoder"), ({"tie_word_embeddings": False}, "tie_word_embeddings"),
                          ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
                          ({"hidden_act": "quick_gelu"}, "hidden_act"), ({"pad_token_id": None}, "pad_token_id")):
        with pytest.raises(ConfigError, match=f"^x/config.json: {field}: ") as caught:
            config_from_bert({**raw, **change}, "rope", source="x/config.json")
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("case", ["model_type", "sinusoidal", "stage_longer", "missing", "shape"])
def test_bad_bert_input_is_one_line_exit_2_nothing_written(capsys, tmp_path, bert_mlm, case):
    source = tmp_path / "source"
    source.mkdir()
    for path in bert_mlm.iterdir():
        (source / path.name).write_bytes(path.read_bytes())
    raw = json.loads((source / "config.json").read_text())
    model, expected = None, None
    if case == "model_type":
        (source / "config.json").write_text(json.dumps({**raw, "model_type": "gpt2"}))
        expected = "model_type: 'gpt2' is not 'roformer' (RoFormer-DS reads two: 'roformer' here and 'bert'"
    elif case == "sinusoidal":
        model = {"position_encoding": "sinusoidal", "max_position_embeddings": 256}
        expected = "model.position_encoding: 'sinusoidal' cannot continue a BERT"
    elif case == "stage_longer":  # the tiny schedule's 64-token stage against a 32-row table
        (source / "config.json").write_text(json.dumps({**raw, "max_position_embeddings": 32}))
        model = {"position_encoding": "learned"}
        expected = "max_seq_len 64 is longer than the model's learned position table"
    else:
        tensors = load_file(str(source / "model.safetensors"))
        key = "bert.encoder.layer.1.output.dense.weight"
        if case == "missing":
            tensors.pop(key)
            expected = "missing: ['roformer.layers.1.ffn_out.weight']"
        else:
            tensors[key] = tensors[key][:, :-1].contiguous()
            expected = "roformer.layers.1.ffn_out.weight (32, 63) != (32, 64)"
        save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    config = init_from_config(tmp_path, source, model=model)
    capsys.readouterr()
    if case in ("missing", "shape"):  # read by every rank at the engine's start, before any step
        cfg, init = load_config_and_init(config)
        with pytest.raises(UserError) as caught:
            build_model(cfg, InitialWeights.read(init, cfg.model))
        message = str(caught.value)
        assert expected in message and str(source) in message and "\n" not in message
        return
    argv = ["pretrain", "--num_gpus", "1", "--config", str(config), "--run-dir", str(tmp_path / "run"), "--dry-run"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_learned_model_writes_a_bert_transformers_reproduces(tmp_path):
    """write_bert_files + the exporter's check: BertForMaskedLM loads with no missing or unexpected keys and
    gives our logits; the sinusoidal encodings and a RoPE model are refused as BERT in one line."""
    from launcher.export.bert_export import bert_max_positions, check_bert_parity, check_export_format
    from roformer.bert_interop import check_bert_exportable

    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(**TINY_MODEL, position_encoding="learned", max_position_embeddings=48,
                                               type_vocab_size=3, layer_norm_eps=1e-6)).eval()
    write_bert_files(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"
    assert check_bert_parity(tmp_path, model) <= 1e-4
    assert bert_max_positions(model.config, None) == 48
    with pytest.raises(UserError, match="--max-positions 64: a learned-position model exports as a BERT"):
        bert_max_positions(model.config, 64)
    for encoding in ("sinusoidal", "sinusoidal_unscaled"):
        sinusoidal = RoFormerConfig(**TINY_MODEL, position_encoding=encoding, max_position_embeddings=48)
        with pytest.raises(ConfigError, match="only 'learned' runs export, as BERT") as caught:
            check_export_format(sinusoidal)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="only 'learned' exports as a BERT"):
        check_bert_exportable(RoFormerConfig(**TINY_MODEL))
