"""Export after real 2-rank ZeRO-2 / ZeRO-3 runs and a 2 -> 1 rank resume: transformers loads it with
no project code importable, its tokenizer gives the SentencePiece ids, and its logits are our model's."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from data_pipeline import load_tokenizer
from data_pipeline.config import CLS_ID, SEP_ID
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.hf_interop import load_pretrained
from tests._downstream_common import RESUME_STEPS, STEPS, data_dir, exported, hf_isolated_logits, resumed_run, zero_run

pytestmark = pytest.mark.multiprocess

TEXTS = [
    "Use the kernel's coding style: tabs are eight characters, and so are indentations.",
    "补丁应当发送到邮件列表。",
    "Short one",
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from launcher.downstream.export import export_checkpoint

    resumed = resumed_run(tmp_path_factory)
    resumed_export = export_checkpoint(resumed, tmp_path_factory.mktemp("resumed_export") / "export")
    return {"zero2": (zero_run(tmp_path_factory, 2), exported(tmp_path_factory, 2)),
            "zero3": (zero_run(tmp_path_factory, 3), exported(tmp_path_factory, 3)),
            "resumed-2to1": (resumed, resumed_export)}


@pytest.fixture(scope="module")
def hf_outputs(exports, tmp_path_factory):
    names = list(exports)
    outputs = hf_isolated_logits([exports[n][1] for n in names], TEXTS, tmp_path_factory.mktemp("hf_isolated"))
    return dict(zip(names, outputs))


def _reference_model(run_dir) -> RoFormerForMaskedLM:
    """Our model holding the weights the live DeepSpeed engine had at save time (gathered in-run)."""
    sidecar = json.loads(next((run_dir / "checkpoints").glob("*/sidecar.json")).read_text())
    model = RoFormerForMaskedLM(RoFormerConfig.from_dict(sidecar["model_config"]))
    model.load_state_dict(load_file(str(run_dir / "reference.safetensors")))
    return model.eval()


@pytest.mark.parametrize("name", ["zero2", "zero3", "resumed-2to1"])
def test_transformers_alone_reproduces_our_logits(name, exports, hf_outputs):
    run_dir, export_dir = exports[name]
    hf = hf_outputs[name]
    assert hf["info"]["model_class"] == "RoFormerForMaskedLM"
    assert hf["info"]["pad_token_id"] == 0 and hf["info"]["mask_token_id"] == 4
    ours = _reference_model(run_dir)
    with torch.no_grad():
        logits = ours(hf["input_ids"], attention_mask=hf["attention_mask"]).logits  # (B, T, V)
    real = hf["attention_mask"].bool()
    assert logits.shape == hf["logits"].shape
    assert torch.allclose(logits[real], hf["logits"][real], atol=1e-4, rtol=1e-4), \
        (logits[real] - hf["logits"][real]).abs().max()
    # Not a vacuous match: the trained model's predictions depend on the input.
    assert not torch.allclose(hf["logits"][0, 1], hf["logits"][1, 1], atol=1e-3)


@pytest.mark.parametrize("name", ["zero2", "zero3", "resumed-2to1"])
def test_consolidated_weights_equal_the_live_engine_weights(name, exports):
    run_dir, export_dir = exports[name]
    reference = load_file(str(run_dir / "reference.safetensors"))
    loaded = load_pretrained(export_dir).state_dict()
    assert set(loaded) == set(reference)
    for key, tensor in reference.items():
        assert loaded[key].dtype == torch.float32
        assert torch.allclose(loaded[key], tensor, atol=1e-6, rtol=0), key


def test_exported_tokenizer_gives_sentencepiece_ids(exports, hf_outputs, tmp_path_factory):
    sp = load_tokenizer(data_dir(tmp_path_factory))
    ids, mask = hf_outputs["zero2"]["input_ids"], hf_outputs["zero2"]["attention_mask"]
    for row, text in enumerate(TEXTS):
        expected = [CLS_ID, *sp.encode(text), SEP_ID]
        assert ids[row][mask[row].bool()].tolist() == expected


def test_resume_changed_world_size_and_continued_training(exports):
    resumed_dir, _ = exports["resumed-2to1"]
    source_dir, _ = exports["zero2"]
    step = STEPS[2] + RESUME_STEPS
    sidecar = json.loads((resumed_dir / "checkpoints" / f"step{step}" / "sidecar.json").read_text())
    assert sidecar["world_size"] == 1 and sidecar["step"] == step
    before = load_file(str(source_dir / "reference.safetensors"))
    after = load_file(str(resumed_dir / "reference.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)  # 5 more steps really trained


def test_export_directory_contents_and_model_card(exports):
    run_dir, export_dir = exports["zero3"]
    names = {p.name for p in export_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "spm.model",
            "README.md", "export_info.json"} <= names
    assert not any(p.name.startswith(".") for p in export_dir.parent.iterdir())  # no temp dirs left
    tag = f"step{STEPS[3]}"
    sidecar = json.loads((run_dir / "checkpoints" / tag / "sidecar.json").read_text())
    card = (export_dir / "README.md").read_text()
    assert f"| optimizer steps | {STEPS[3]} |" in card
    assert f"| tokens seen | {sidecar['consumed_tokens']:,} |" in card
    assert "| world size at save | 2 |" in card
    assert "## Validation" in card and f"| loss | {sidecar['last_validation']['loss']:.4g} |" in card
    info = json.loads((export_dir / "export_info.json").read_text())
    assert info["tag"] == tag and info["step"] == STEPS[3] and info["max_seq_len_trained"] == 32
    with open(export_dir / "model.safetensors", "rb") as f:  # fp32 on disk
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}


def test_universal_checkpoint_exports_the_same_weights(exports, tmp_path):
    """A ds_to_universal folder placed as a checkpoint tag is read per parameter (weights_only)."""
    from launcher.downstream.export import export_checkpoint

    resumed_dir, _ = exports["resumed-2to1"]
    source_dir, source_export = exports["zero2"]
    tag = f"step{STEPS[2]}"
    run_dir = tmp_path / "run"
    shutil.copytree(resumed_dir / "universal" / tag, run_dir / "checkpoints" / tag)
    shutil.copy2(source_dir / "checkpoints" / tag / "sidecar.json", run_dir / "checkpoints" / tag)
    shutil.copy2(source_dir / "config.yaml", run_dir / "config.yaml")
    out = export_checkpoint(run_dir, tmp_path / "export", tag=tag)
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(source_export / "model.safetensors"))
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
