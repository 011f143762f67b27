"""Export after real trainer runs (2-rank ZeRO-2, 2-rank ZeRO-3, and a 2 -> 1 rank resume through a
universal checkpoint): transformers loads it with no project code importable, its tokenizer gives the
SentencePiece ids, and its logits are those of the weights the live engine held at the end."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from data_pipeline import load_tokenizer
from data_pipeline.config import CLS_ID, SEP_ID
from launcher.export.exporter import export_checkpoint
from launcher.train.metrics import read_metrics
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.hf_interop import load_pretrained
from tests.multirank.conftest import RESUMED_FROM
from tests.support.helpers import (
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_STAGES,
    TINY_TOTAL_STEPS,
    hf_isolated_logits,
    run_to_end,
    tiny_run_config,
)

LIVE_WEIGHTS = {"ROFORMER_TEST_SAVE_LIVE_WEIGHTS": "1"}
ZERO3_STAGES = TINY_STAGES[:2]  # 10 steps, lengths 32 and 64
ZERO3_STEPS = sum(s["steps"] for s in ZERO3_STAGES)

TEXTS = [
    "Use the kernel's coding style: tabs are eight characters, and so are indentations.",
    "补丁应当发送到邮件列表。",
    "Short one",
]


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory, tiny_data):
    """The trainer under ZeRO-3 (2 ranks, two stages)."""
    root = tmp_path_factory.mktemp("zero3")
    config = tiny_run_config(root, tiny_data, stages=ZERO3_STAGES, model=NO_DROPOUT,
                             deepspeed={"overrides": {"zero_optimization": {"stage": 3}}})
    run_to_end(2, config, root / "run", module=TEST_RANK_ENTRY, **LIVE_WEIGHTS)
    return root / "run"


@pytest.fixture(scope="module")
def resumed_run(one_rank_resume):
    """The session's 2-rank run resumed on ONE rank from its global_step10 (tests/multirank/conftest.py
    one_rank_resume, whose schedule and loss curve test_resume.py checks): the trainer converts the checkpoint to a
    universal one (DeepSpeed refuses a ZeRO checkpoint at another data-parallel size) and trains steps 11-16."""
    return one_rank_resume[1]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, trainer_run, trainer_export, zero3_run, resumed_run):
    return {"zero2": (trainer_run, trainer_export),
            "zero3": (zero3_run, export_checkpoint(zero3_run, tmp_path_factory.mktemp("zero3_export") / "export")),
            "resumed-2to1": (resumed_run, export_checkpoint(resumed_run, tmp_path_factory.mktemp("resumed_export") / "export"))}


@pytest.fixture(scope="module")
def hf_outputs(exports, tmp_path_factory):
    names = list(exports)
    outputs = hf_isolated_logits([exports[n][1] for n in names], TEXTS, tmp_path_factory.mktemp("hf_isolated"))
    return dict(zip(names, outputs))


def _reference_model(run_dir) -> RoFormerForMaskedLM:
    """Our model holding the weights the live DeepSpeed engine had at save time (gathered in-run)."""
    sidecar = json.loads(next((run_dir / "checkpoints").glob("*/sidecar.json")).read_text())  # any: same model
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


def test_exported_tokenizer_gives_sentencepiece_ids(exports, hf_outputs, tiny_data):
    sp = load_tokenizer(tiny_data)
    ids, mask = hf_outputs["zero2"]["input_ids"], hf_outputs["zero2"]["attention_mask"]
    for row, text in enumerate(TEXTS):
        expected = [CLS_ID, *sp.encode(text), SEP_ID]
        assert ids[row][mask[row].bool()].tolist() == expected


def test_resume_changed_world_size_and_continued_training(exports):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    resumed_dir, _ = exports["resumed-2to1"]
    source_dir, _ = exports["zero2"]
    sidecar = json.loads((resumed_dir / "checkpoints" / f"global_step{TINY_TOTAL_STEPS}" / "sidecar.json").read_text())
    assert sidecar["world_size"] == 1 and sidecar["step"] == TINY_TOTAL_STEPS
    resume = [r for r in read_metrics(resumed_dir, "event") if r["event"] == "resume"][-1]
    assert (resume["tag"], resume["from_world_size"], resume["universal"]) == (RESUMED_FROM, 2, True)
    # The steps after the resume really trained: away from the checkpoint it resumed from, to (about) the weights
    # the 2-rank run reached (another micro-batch split: another summation order only).
    start = get_fp32_state_dict_from_zero_checkpoint(str(source_dir / "checkpoints"), tag=RESUMED_FROM)
    before = load_file(str(source_dir / "reference.safetensors"))
    after = load_file(str(resumed_dir / "reference.safetensors"))
    assert any(not torch.allclose(start[k].float(), after[k], atol=1e-4) for k in after)
    assert all(torch.allclose(before[k], after[k], atol=1e-3, rtol=0) for k in after)


def test_export_directory_contents_and_model_card(exports):
    run_dir, export_dir = exports["zero3"]
    names = {p.name for p in export_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "spm.model",
            "README.md", "export_info.json"} <= names
    assert not any(p.name.startswith(".") for p in export_dir.parent.iterdir())  # no temp dirs left
    tag = f"global_step{ZERO3_STEPS}"
    sidecar = json.loads((run_dir / "checkpoints" / tag / "sidecar.json").read_text())
    card = (export_dir / "README.md").read_text()
    assert f"| optimizer steps | {ZERO3_STEPS} |" in card and "| ZeRO stage | 3 |" in card
    assert f"| tokens seen | {sidecar['consumed_tokens']:,} |" in card
    assert "| world size at save | 2 |" in card
    assert "## Validation" in card and f"| loss | {sidecar['last_validation']['loss']:.4g} |" in card
    info = json.loads((export_dir / "export_info.json").read_text())
    assert info["tag"] == tag and info["step"] == ZERO3_STEPS
    assert info["max_seq_len_trained"] == max(s["max_seq_len"] for s in ZERO3_STAGES)
    with open(export_dir / "model.safetensors", "rb") as f:  # fp32 on disk
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}


def test_universal_checkpoint_exports_the_same_weights(exports, tmp_path):
    """A ds_to_universal folder (the trainer's conversion for the 2 -> 1 resume) placed as a checkpoint
    tag is read per parameter (weights_only)."""
    resumed_dir, _ = exports["resumed-2to1"]
    source_dir, _ = exports["zero2"]
    tag = RESUMED_FROM  # the checkpoint the resume converted
    source_export = export_checkpoint(source_dir, tmp_path / "source_export", tag=tag)
    run_dir = tmp_path / "run"
    shutil.copytree(resumed_dir / "universal" / tag, run_dir / "checkpoints" / tag)
    # The conversion's files are not the ones the ZeRO-2 save recorded: keep the sidecar's facts,
    # not its file list (a universal folder is checked per parameter when read).
    sidecar = json.loads((source_dir / "checkpoints" / tag / "sidecar.json").read_text())
    sidecar.pop("files", None)
    (run_dir / "checkpoints" / tag / "sidecar.json").write_text(json.dumps(sidecar))
    shutil.copy2(source_dir / "config.yaml", run_dir / "config.yaml")
    out = export_checkpoint(run_dir, tmp_path / "export", tag=tag)
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(source_export / "model.safetensors"))
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_missing_zero3_model_shard_is_named(exports, capsys, tmp_path):
    """(The other damaged-checkpoint cases are in test_export_errors.py, on a stored ZeRO-2 run.)"""
    from launcher.cli import main as cli_main

    run_dir, export_dir = exports["zero3"]
    damaged = tmp_path / "run3"
    shutil.copytree(run_dir, damaged)
    (damaged / "checkpoints" / f"global_step{ZERO3_STEPS}" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    capsys.readouterr()
    assert cli_main(["export", str(damaged), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("roformer export: error: ") and "zero_pp_rank_1_mp_rank_00_model_states.pt: missing" in err
    assert not (tmp_path / "out").exists()
