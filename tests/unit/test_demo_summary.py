"""scripts/demo_summary.py, the demo's closing table: read from the JSON reports that the real
`roformer eval-mlm` (of the export and of its `--random-init` twin) and `roformer finetune
--compare-random-init` write with --out (on the stored run's export, no DeepSpeed job), so a renamed
report key fails here rather than at the end of `make demo`; its one quoted figure is checked against
docs/reproduction/README.md, where it was measured."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from launcher.cli import main as cli_main
from tests.support.helpers import REPO

SCRIPT = REPO / "scripts" / "demo_summary.py"


def summarise(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture(scope="module")
def reports(stored_run, stored_export, tasks_dir, tmp_path_factory):
    """(eval-mlm JSON, its twin's eval-mlm JSON, finetune JSON) written by the real commands, tiny settings."""
    out = tmp_path_factory.mktemp("demo_summary")
    eval_json, twin_json, finetune_json = out / "eval_mlm.json", out / "eval_twin.json", out / "finetune.json"
    data = str(stored_run.parent / "data")
    assert cli_main(["eval-mlm", str(stored_export), "--data", data, "--seq-lens", "16,128",
                     "--tokens", "512", "--out", str(eval_json)]) == 0
    assert cli_main(["eval-mlm", str(stored_export), "--random-init", "--data", data, "--seq-lens", "16",
                     "--tokens", "512", "--out", str(twin_json)]) == 0
    assert cli_main(["finetune", str(stored_export), "--task", "movie-reviews", "--task-data", str(tasks_dir),
                     "--max-train-examples", "16", "--epochs", "1", "--max-eval-examples", "8", "--max-length", "32",
                     "--compare-random-init", "--out", str(finetune_json)]) == 0
    return eval_json, twin_json, finetune_json


def test_the_table_shows_the_reports_figures_and_paths(reports, tmp_path):
    eval_json, twin_json, finetune_json = reports
    report_md = tmp_path / "report.md"
    done = summarise(eval_json, twin_json, finetune_json, report_md)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    mlm, twin, ft = (json.loads(path.read_text()) for path in (eval_json, twin_json, finetune_json))
    assert twin["config"]["random_init"] and not mlm["config"]["random_init"]
    assert twin["results"][0]["loss"] > mlm["results"][0]["loss"]  # the stored run learned something
    twin_at = lines.index("  random-init twin, same tokens and masks:")
    row = twin["results"][0]
    assert lines[twin_at + 1].split() == [str(row["seq_len"]), f"{row['loss']:.3f}", f"{row['accuracy']:.4f}",
                                          f"{row['perplexity']:.1f}"]
    change = mlm["results"][0]["loss"] - row["loss"]
    assert lines[twin_at + 2] == (f"  pretraining took the masked-LM loss at 16 tokens from {row['loss']:.3f} to "
                                  f"{mlm['results'][0]['loss']:.3f} ({change:+.2f} nats): what this pretraining learned")
    for row in mlm["results"]:
        line = next(x for x in lines[:twin_at] if x.split()[:1] == [str(row["seq_len"])])
        assert line.split()[1:4] == [f"{row['loss']:.3f}", f"{row['accuracy']:.4f}", f"{row['perplexity']:.1f}"]
        assert ("longer than trained" in line) == bool(row["longer_than_trained"])
    assert any(r["longer_than_trained"] for r in mlm["results"])  # the stored run trained at 64 tokens
    for name, scores in (("pretrained export", ft["test"]), ("random-init twin", ft["random_init"]["test"]),
                         ("majority baseline", ft["majority_baseline"]["test"])):
        line = next(x for x in lines[twin_at + 3:] if x.strip().startswith(name))  # the fine-tuning table
        assert line.split()[-2:] == [f"{scores['accuracy']:.4f}", f"{scores['macro_f1']:.4f}"]
    gain = (ft["test"]["accuracy"] - ft["random_init"]["test"]["accuracy"]) * 100
    assert f"pretraining changed test accuracy by {gain:+.1f} points" in done.stdout
    assert "in context: a 3-minute CPU pretraining on Linux documentation is not expected to transfer to" in done.stdout
    assert lines[-4:] == [f"  {eval_json}", f"  {twin_json}", f"  {finetune_json}", f"  {report_md}"]
    assert len(lines) < 30 and "{" not in done.stdout and max(map(len, lines)) <= 120  # a table, not the JSON


def test_the_quoted_reproduction_figure_is_the_one_measured():
    """The inews row at 1000 labels of docs/reproduction/README.md's downstream table says what the summary quotes."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from demo_summary import REPRODUCTION_CONTEXT
    finally:
        sys.path.remove(str(SCRIPT.parent))
    quoted = " ".join(line.strip() for line in REPRODUCTION_CONTEXT)
    gain, export, twin = re.search(r"measured ([+-][\d.]+) points on inews at 1000 labels \(([\d.]+) vs ([\d.]+) for",
                                   quoted).groups()
    readme = (REPO / "docs" / "reproduction" / "README.md").read_text(encoding="utf-8")
    row = re.search(r"^\| inews \| 1000 \| ([\d.]+) \([^)]*\) \| ([\d.]+) \([^)]*\) \| \*\*([+-][\d.]+)\*\* \|",
                    readme, re.M)
    assert row is not None and row.groups() == (export, twin, gain)
    assert "26.2M token slots" in readme and "24 min" in readme and "3 fine-tuning seeds" in readme


def test_an_added_key_changes_nothing_and_a_missing_one_is_named(reports, tmp_path):
    eval_json, twin_json, finetune_json = reports
    before = summarise(eval_json, twin_json, finetune_json, "report.md").stdout
    mlm, ft = json.loads(eval_json.read_text()), json.loads(finetune_json.read_text())
    mlm["new_top_level_key"], mlm["results"][0]["new_figure"], ft["test"]["new_score"] = 1, 2.0, 3.0
    grown_eval, grown_ft = tmp_path / "eval.json", tmp_path / "ft.json"
    grown_eval.write_text(json.dumps(mlm))
    grown_ft.write_text(json.dumps(ft))
    assert summarise(grown_eval, twin_json, grown_ft, "report.md").stdout.replace(str(tmp_path / "eval.json"), str(eval_json)) \
        .replace(str(tmp_path / "ft.json"), str(finetune_json)) == before

    del ft["random_init"]["test"]["macro_f1"]
    grown_ft.write_text(json.dumps(ft))
    done = summarise(grown_eval, twin_json, grown_ft, "report.md")
    assert done.returncode == 2 and done.stderr.strip() == f"demo summary: error: {grown_ft}: no random_init.test.macro_f1"
    done = summarise(tmp_path / "absent.json", twin_json, grown_ft, "report.md")
    assert done.returncode == 2 and done.stderr.strip() == f"demo summary: error: {tmp_path / 'absent.json'}: no such report"
