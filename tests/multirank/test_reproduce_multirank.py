"""`roformer reproduce`: the plan of runs, argument checks, and the quick mode end to end.

The quick mode starts real `roformer data prepare / pretrain / export / finetune` jobs (tiny model,
a few steps) and checks the report's shape; a second invocation must skip every finished job.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.support.helpers import roformer

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_reproduction_writes_the_report_and_resumes(tmp_path):
    out = tmp_path / "repro"
    first = roformer("reproduce", "--quick", "--out", str(out), timeout=1800)
    assert first.returncode == 0, first.stdout + first.stderr
    report = out / "report"
    text = (report / "report.md").read_text()
    for heading in ("Fig. 2 analog", "Linear attention", "Table 5 analog", "random-init twin"):
        assert heading in text
    for png in ("fig2_encodings.png", "linear_attention.png", "table5_lengths.png", "downstream.png",
                "extension.png", "recipes.png"):
        data = (report / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, png
        assert f"({png})" in text  # embedded in the report
    results = json.loads((report / "results.json").read_text())
    assert set(results["encodings"]) == {"rope", "sinusoidal", "learned"}
    assert set(results["linear"]) == {"linear+rope", "linear+sinusoidal"}
    for group in (*results["encodings"].values(), *results["linear"].values()):
        assert group["final_valid_loss"]["n"] == 1 and group["final_valid_loss"]["mean"] > 0
        run = next(iter(group["runs"].values()))
        assert run["valid_curve"] and run["stages"]
    for task in ("movie-reviews", "inews"):
        cell = results["downstream"][task]["32"]
        assert cell["pretrained"]["accuracy"]["n"] == 1 and cell["random"]["accuracy"]["n"] == 1
        assert set(cell["by_pretraining_run"]) == {"rope-s0"} and "gain_points" in cell
    assert set(results["lengths"]) == {"32", "64"}
    assert set(results["recipe_runs"]) == {"rope-s0"}
    retrieval = results["retrieval"]["32"]
    assert retrieval["pretrained"]["ndcg@10"]["n"] == 1 and retrieval["random"]["ndcg@10"]["n"] == 1
    assert retrieval["pretrained"]["queries"] == 32 and "gain_ndcg@10" in retrieval
    assert "Retrieval: the export as an embedding model" in text
    ext = results["extension"]["variants"]
    assert {name: v["rope_theta"] for name, v in ext.items()} == {
        "no-extension": 10000.0, "same-theta": 10000.0, "larger-theta": 40000.0}
    assert all(set(v["loss"]) == {"32", "64", "128"} for v in ext.values())
    assert ext["no-extension"]["trained_max_seq_len"] == 32 and ext["same-theta"]["trained_max_seq_len"] == 64
    assert "Context extension" in text
    # The recipes part: two one-factor variants of the rope-s0 run (not trained twice), on one picture.
    recipes = results["recipes"]
    assert set(recipes) == {"linear", "wsd", "mask-annealed"} and set(recipes["linear"]["runs"]) == {"rope-s0"}
    assert all(group["final_valid_loss"]["n"] == 1 for group in recipes.values())
    assert [s["mask_prob"] for s in recipes["mask-annealed"]["runs"]["mask-annealed-s0"]["stages"]] == [0.3, 0.15]
    assert "Recipe fields: WSD and an annealed mask rate" in text and "(recipes.png)" in text
    # Ordinary run directories: an export that transformers' format describes, per-job logs.
    assert (out / "runs" / "rope-s0" / "export" / "config.json").is_file()
    results_of = lambda folder: [p for p in (out / folder).glob("*.json") if not p.name.startswith(".")]  # noqa: E731
    # 7 fine-tunes: the lengths part's inews job at 32 tokens is the downstream part's (one job, one report)
    assert len(results_of("finetune")) == 7 and len(results_of("eval")) == 3  # beside each, the gate's record
    assert all((p.parent / f".{p.name}.written.json").is_file() for p in results_of("finetune"))

    second = roformer("reproduce", "--quick", "--out", str(out), timeout=1800)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("finished earlier") == 9
    assert "pretrain-" not in second.stdout and "7 of 7 reports exist" in second.stdout
    assert "eval-" not in second.stdout
