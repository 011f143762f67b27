"""Fine-tuning end to end from a real export on the real labelled tasks (the session's trainer
export), and its bad input (on the stored run's export: no DeepSpeed job)."""
from __future__ import annotations

import json
import shutil

from launcher.cli import main as cli_main


def _fails(capsys, argv) -> str:
    capsys.readouterr()
    rc = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith("roformer finetune: error: "), err
    return err


def test_unknown_task(capsys, tmp_path):
    err = _fails(capsys, ["finetune", str(tmp_path), "--task", "imdb"])  # named before the export is read
    assert "unknown task 'imdb'" in err and "inews" in err and "movie-reviews" in err


def test_labels_missing_in_a_split_are_named_and_nothing_is_overwritten(capsys, stored_export, tasks_dir, tmp_path):
    broken = tmp_path / "tasks"
    shutil.copytree(tasks_dir / "movie-reviews", broken / "movie-reviews")
    dev = broken / "movie-reviews" / "dev.jsonl"
    lines = dev.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[2])
    del row["label"]
    lines[2] = json.dumps(row)
    dev.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "report.json"
    out.write_text("earlier report")
    from launcher.outputs.gate import FINETUNE_REPORT
    from launcher.outputs.written import record_written

    record_written(out, FINETUNE_REPORT.name, FINETUNE_REPORT.made_by)  # an earlier finetune's: replaceable by the gate
    err = _fails(capsys, ["finetune", str(stored_export), "--task", "movie-reviews", "--task-data",
                          str(broken), "--out", str(out)])
    assert f"{dev}: row 3, column 'label': empty or missing label" in err
    assert out.read_text() == "earlier report"
    shutil.copy2(tasks_dir / "movie-reviews" / "dev.jsonl", dev)
    (broken / "movie-reviews" / "test.jsonl").unlink()
    err = _fails(capsys, ["finetune", str(stored_export), "--task", "movie-reviews", "--task-data", str(broken)])
    assert "test.jsonl: task file missing" in err


def test_corrupt_weights_and_missing_tokenizer(capsys, stored_export, tasks_dir, copy_of):
    export_copy = copy_of(stored_export)
    argv = ["finetune", str(export_copy), "--task", "movie-reviews", "--task-data", str(tasks_dir)]
    (export_copy / "tokenizer_config.json").unlink()
    assert "tokenizer missing (tokenizer_config.json not found)" in _fails(capsys, argv)
    shutil.copy2(stored_export / "tokenizer_config.json", export_copy)
    weights = export_copy / "model.safetensors"
    weights.write_bytes(b"\x00" * 7)  # not even a header length
    assert "model.safetensors: corrupt" in _fails(capsys, argv)
    weights.unlink()
    assert "model.safetensors: missing" in _fails(capsys, argv)


def test_a_directory_saved_by_transformers_itself_works(stored_export, tasks_dir, tmp_path):
    """Not only our exports: a RoFormer saved by transformers' save_pretrained (plus a tokenizer)."""
    import transformers

    ours = stored_export
    config = transformers.RoFormerConfig(vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, pad_token_id=0)
    foreign = tmp_path / "hf_saved"
    transformers.RoFormerForMaskedLM(config).save_pretrained(str(foreign))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(ours / name, foreign / name)
    out = tmp_path / "report.json"
    rc = cli_main(["finetune", str(foreign), "--task", "movie-reviews", "--task-data", str(tasks_dir),
                   "--max-train-examples", "32", "--epochs", "1", "--max-eval-examples", "16", "--out", str(out)])
    assert rc == 0 and json.loads(out.read_text())["test"]["examples"] == 16


def test_a_bundled_task_with_a_label_outside_its_names_is_named(capsys, stored_export, tasks_dir, tmp_path):
    """The bundled tasks read their JSONL like any own file; their integer labels must index label_names."""
    broken = tmp_path / "tasks"
    shutil.copytree(tasks_dir / "movie-reviews", broken / "movie-reviews")
    train = broken / "movie-reviews" / "train.jsonl"
    lines = train.read_text(encoding="utf-8").splitlines()
    lines[0] = json.dumps({"text": json.loads(lines[0])["text"], "label": 2})
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    err = _fails(capsys, ["finetune", str(stored_export), "--task", "movie-reviews", "--task-data", str(broken)])
    assert f"{train}: column 'label': label 2 is not an integer in [0, 2) (the task's label_names: negative, positive)" \
        in err


def test_dropout_override_keeps_the_weights_and_sets_every_dropout(stored_export):
    """`--dropout` changes only the probabilities: same encoder weights, every dropout module and the
    attention's probability set, for the export and for its random-init twin alike."""
    import torch

    from launcher.export.export_reader import load_classifier

    kept = load_classifier(stored_export, 2)
    changed = load_classifier(stored_export, 2, dropout=0.25)
    encoder = [k for k in kept.state_dict() if not k.startswith("classifier.")]
    assert all(torch.equal(kept.state_dict()[k], changed.state_dict()[k]) for k in encoder)
    for model, expected in ((changed, 0.25), (load_classifier(stored_export, 2, random_init=True, dropout=0.25), 0.25),
                            (kept, kept.config.hidden_dropout_prob)):
        probabilities = {m.p for m in model.modules() if type(m).__name__ == "Dropout"}
        probabilities |= {m.dropout_prob for m in model.modules() if hasattr(m, "dropout_prob")}
        assert probabilities == {expected}, (expected, probabilities)
    assert changed.config.hidden_dropout_prob == changed.config.attention_probs_dropout_prob == 0.25


def test_dropout_out_of_range_is_refused_by_name(capsys, stored_export, tasks_dir):
    err = _fails(capsys, ["finetune", str(stored_export), "--task", "movie-reviews", "--task-data", str(tasks_dir),
                          "--dropout", "1.5"])
    assert "--dropout" in err
