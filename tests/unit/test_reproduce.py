"""`roformer reproduce` without training: the presets' plans of runs and parts, argument checks (refused before
any job), the job runner's cancel and stop (on stand-in jobs), and the reports and merges on written results.
The quick mode end to end (real `roformer` jobs, a second invocation skipping them):
tests/multirank/test_reproduce_multirank.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.commands.reproduce import parse_parts
from launcher.config.run_config import load_run_config
from launcher.common.errors import UserError
from launcher.reproduce.reproduction_plan import PARTS, PRESETS
from tests.support.helpers import roformer

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_full_preset_compares_every_variant_over_at_least_three_seeds():
    preset = PRESETS["full"]()
    runs = preset.pretrain_runs(PARTS)
    groups: dict[str, set[int]] = {}
    for run in runs:
        groups.setdefault(run.group, set()).add(run.seed)
    assert set(groups) == {"rope", "sinusoidal", "learned", "linear+rope", "linear+sinusoidal", "recipe",
                           "extension-same-theta", "extension-larger-theta", "wsd", "mask-annealed",
                           "recipe-three-phase", "from-bert-converted", "from-bert-continued-bert",
                           "from-bert-rope-scratch", "documents-document", "documents-document-positions",
                           "schedules-flat-512", "schedules-short-then-long", "schedules-staged-ramp"}
    assert all(len(seeds) >= 3 for group, seeds in groups.items() if "recipe" not in group and "extension" not in group)
    # Same config and schedule for every ablation variant: only encoding, attention, table and seed differ.
    ablation = [r for r in runs if "recipe" not in r.group and r.schedule is None]
    assert {r.config for r in ablation} == {preset.ablation_config}
    assert len({r.name for r in runs}) == len(runs)  # the recipes part reuses the encodings part's rope runs
    finetunes = preset.finetune_runs(PARTS)
    assert len({f.name for f in finetunes}) == len(finetunes)  # one report file per job
    downstream = [f for f in finetunes if f.part == "downstream"]
    assert {(f.task, f.budget, f.init) for f in downstream} == {
        (t, b, i) for t in ("movie-reviews", "inews") for b in (250, 1000, None) for i in ("pretrained", "random")}
    assert {f.max_length for f in finetunes if f.part == "lengths"} == {128, 256, 512, 1024}
    assert len(preset.finetune_seeds) >= 3
    # Table 5 with seeds: 3 fine-tuning seeds per length, all on the first recipe run's export.
    for length in (128, 256, 512, 1024):
        assert {f.seed for f in finetunes if f.part == "lengths" and f.max_length == length} == {0, 1, 2}
    assert {f.pretrain for f in finetunes if f.part == "lengths"} == {"recipe"}
    # Downstream: every pretraining seed of the recipe with every fine-tuning seed; one set of twins.
    assert preset.recipe_runs == ("recipe", "recipe-s1")
    pretrained = {(f.pretrain, f.seed) for f in downstream if f.init == "pretrained"}
    assert pretrained == {(r, s) for r in ("recipe", "recipe-s1") for s in (0, 1, 2)}
    assert {f.pretrain for f in downstream if f.init == "random"} == {"recipe"}
    recipe = {r.name: r for r in runs if r.group == "recipe"}
    assert set(recipe) == {"recipe", "recipe-s1"} and "seed=1" in recipe["recipe-s1"].overrides
    # Retrieval: the first recipe export and its twin, zero-shot and on 1000 pairs, every fine-tuning seed.
    retrieval = [f for f in finetunes if f.part == "retrieval"]
    assert {(f.pretrain, f.task, f.budget, f.init, f.seed) for f in retrieval} == {
        ("recipe", "wordnet-senses", b, i, s) for b in (0, 1000) for i in ("pretrained", "random") for s in (0, 1, 2)}
    assert all(("--epochs", "0") == f.args[-2:] for f in retrieval if f.budget == 0)
    # The whole training split gets its own (shorter) epoch count; finetune's argparse keeps the last --epochs.
    for f in downstream:
        epochs = [f.args[i + 1] for i, flag in enumerate(f.args) if flag == "--epochs"]
        assert epochs[-1] == ("3" if f.budget is None else epochs[0]), f.name


def test_each_part_runs_alone_with_only_what_it_needs():
    preset = PRESETS["full"]()
    assert [r.name for r in preset.pretrain_runs(("downstream",))] == ["recipe", "recipe-s1"]
    assert [r.name for r in preset.pretrain_runs(("lengths",))] == ["recipe"]
    assert [r.name for r in preset.pretrain_runs(("retrieval",))] == ["recipe"]
    assert preset.eval_runs(("encodings",)) == []
    assert {r.group for r in preset.pretrain_runs(("linear",))} == {"linear+rope", "linear+sinusoidal"}
    assert preset.finetune_runs(("encodings",)) == []


@pytest.mark.parametrize("name", ["ablation.yaml", "recipe.yaml", "recipe_three_phase.yaml"])
def test_shipped_reproduction_configs_load(name):
    cfg = load_run_config(REPO / "configs" / "reproduce" / name)
    assert cfg.schedule.total_steps > 0
    lengths = {stage.max_seq_len for stage in cfg.schedule.stages}
    assert len(lengths) > 1  # length changes mid-run, as the paper's Table 4
    assert PRESETS["full"]().absolute_positions >= max(lengths)


def test_parts_are_checked():
    assert parse_parts("linear,encodings") == ("encodings", "linear")
    with pytest.raises(UserError, match="--parts: unknown part"):
        parse_parts("encodings,fig9")


def test_bad_arguments_fail_before_any_job(tmp_path):
    result = roformer("reproduce", "--out", str(tmp_path / "out"), "--parts", "fig9")
    assert result.returncode == 2 and "--parts" in result.stderr
    result = roformer("reproduce", "--out", str(tmp_path / "out"), "--data", str(tmp_path / "missing"))
    assert result.returncode == 2 and "manifest.json" in result.stderr
    assert not (tmp_path / "out" / "runs").exists()


def _runner(tmp_path):
    from launcher.reproduce.job_runner import Layout, Runner

    return Runner(PRESETS["quick"](), Layout(tmp_path), log=lambda line: None)


def test_a_failed_job_cancels_the_jobs_not_started(tmp_path):
    runner, started = _runner(tmp_path), []

    def job(item):
        started.append(item)
        if item == 0:
            raise UserError("job 0 failed")

    with pytest.raises(UserError, match="job 0 failed"):
        runner._parallel(job, list(range(5)), workers=1)
    assert started == [0]


def test_a_stop_terminates_the_running_jobs(tmp_path):
    import subprocess
    import sys
    import time

    runner, codes = _runner(tmp_path), []
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]

    def job(item):
        if item == "stop":  # stands for Ctrl-C / SIGTERM reaching the main thread
            while not runner._children:
                time.sleep(0.05)
            raise KeyboardInterrupt
        with open(tmp_path / f"{item}.log", "w") as log:
            codes.append(runner._call(sleeper, log))

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runner._parallel(job, ["stop", "sleeper", "never started"], workers=2)
    assert time.monotonic() - started < 30
    assert codes == [-15]  # SIGTERM, once; the queued job never ran
    with pytest.raises(UserError, match="stopped"):
        runner._call(sleeper, subprocess.DEVNULL)


def test_extension_part_plans_two_thetas_and_the_checkpoint_before_the_extension():
    preset = PRESETS["full"]()
    runs = {r.name: r for r in preset.pretrain_runs(("extension",))}
    assert set(runs) == {f"extension-{v}-s{s}" for v in ("same-theta", "larger-theta") for s in (0, 1)}
    same, larger = runs["extension-same-theta-s0"].schedule, runs["extension-larger-theta-s0"].schedule
    assert same[:-1] == larger[:-1]  # the same base stages ...
    assert "rope_theta" not in same[-1] and larger[-1]["rope_theta"] > 10000  # ... then the two bases
    assert same[-1]["max_seq_len"] == 2048 and max(s["max_seq_len"] for s in same[:-1]) == 512
    evals = {e.name: e for e in preset.eval_runs(("extension",))}
    assert len(evals) == 6 and evals["extension-no-extension-s1"].pretrain == "extension-same-theta-s1"
    assert evals["extension-no-extension-s1"].tag == f"global_step{sum(s['steps'] for s in same[:-1])}"
    assert evals["extension-larger-theta-s0"].seq_lens == (512, 1024, 2048, 4096)


def test_extension_schedules_load_and_resolve(tmp_path):
    from launcher.config.stages import resolve_stages
    from launcher.reproduce.job_runner import Layout, Runner
    from tests.support.helpers import write_yaml

    preset = PRESETS["full"]()
    runner = Runner(preset, Layout(tmp_path), log=lambda line: None)
    for run in preset.pretrain_runs(("extension",)):
        path = runner._write_schedule(run)
        assert runner._write_schedule(run) == path  # the same plan again: accepted
        cfg = load_run_config(preset.ablation_config, [*run.overrides, f"schedule.file={path}"])
        stages = resolve_stages(cfg, preset.num_ranks)
        assert stages[-1].rope_theta == (160000.0 if "larger" in run.name else 10000.0)
    write_yaml(path, {"stages": [{"name": "x", "max_seq_len": 64, "global_batch_size": 2, "steps": 1}]})
    with pytest.raises(UserError, match="differs from the schedule this release plans"):
        runner._write_schedule(run)


def _finished_group(loss: float) -> dict:
    return {"runs": {"r": {"final_valid_loss": loss}}, "unfinished": [],
            "final_valid_loss": {"mean": loss, "min": loss, "max": loss, "n": 1}}


def test_merge_fills_missing_parts_and_groups_from_earlier_results():
    from launcher.reproduce.results import merge

    current = {"parts": ["encodings"], "encodings": {"sinusoidal": _finished_group(6.5),
                                                    "rope": {"runs": {}, "unfinished": ["rope-s0"]}}}
    ablations = {"parts": ["encodings", "linear"], "encodings": {"rope": _finished_group(6.4),
                                                                "sinusoidal": _finished_group(7.6)},
                 "linear": {"linear+rope": _finished_group(6.8)}}
    recipe = {"parts": ["lengths"], "lengths": {"128": {"accuracy": {"n": 1}}}, "recipe": {"finished": True}}
    merged = merge(current, [("old ablations", ablations), ("old recipe", recipe)], current="here")
    assert merged["encodings"]["sinusoidal"]["final_valid_loss"]["mean"] == 6.5  # this run wins
    assert merged["encodings"]["rope"]["final_valid_loss"]["mean"] == 6.4  # unfinished here: the earlier one
    assert merged["sources"] == {"encodings/sinusoidal": "here", "encodings/rope": "old ablations",
                                 "linear/linear+rope": "old ablations", "recipe": "old recipe",
                                 "lengths": "old recipe"}
    assert merged["parts"] == ["encodings", "linear", "lengths"]


def test_merge_inputs_are_checked_and_reports_name_no_absolute_path(tmp_path):
    from launcher.commands.reproduce import display_path, read_prior

    bad = tmp_path / "results.json"
    bad.write_text("{}")
    with pytest.raises(UserError, match="not a reproduction results.json"):
        read_prior(bad)
    with pytest.raises(UserError, match="cannot read"):
        read_prior(tmp_path / "missing.json")
    assert display_path(REPO / "runs" / "x") == "runs/x"
    assert not display_path(Path("/nonexistent-root/out")).startswith("/")
    label, _ = read_prior(REPO / "docs" / "reproduction" / "results" / "results.json")
    assert label.startswith("`docs/reproduction/results/results.json`")


def test_report_states_seed_spreads_and_the_extension_verdicts(tmp_path):
    from launcher.reproduce.claims_report import write_report

    def stats(*values):
        return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "n": len(values)}

    cell = {"accuracy": stats(0.68, 0.69, 0.70), "macro_f1": stats(0.6, 0.61, 0.62), "truncated_share_test": 0.5,
            "majority_baseline_accuracy": 0.3}
    ext = PRESETS["full"]().extension
    variants = {name: {"rope_theta": theta, "trained_max_seq_len": trained, "seeds": {},
                       "loss": {str(n): stats(base + n / 4096, base + n / 4096 + 0.01) for n in ext.eval_lens}}
                for name, theta, trained, base in (("no-extension", 10000.0, 512, 7.0),
                                                   ("same-theta", 10000.0, 2048, 6.5),
                                                   ("larger-theta", 160000.0, 2048, 6.0))}
    results = {"lengths": {"128": cell, "1024": {**cell, "accuracy": stats(0.71, 0.72, 0.73)}},
               "extension": {"stages": {"same-theta": list(ext.schedule("same-theta"))},
                             "base_end_tag": ext.base_end_tag, "variants": variants}}
    text = (write_report(results, tmp_path, ["header"])).read_text()
    assert "128 -> 1024: accuracy 0.690 -> 0.720 (+3.0 points; n = 3 / 3 fine-tuning seeds): beyond the seed spread" in text
    assert "| larger-theta | 160000 | 2048 |" in text
    assert "at 4096 tokens, larger-theta vs same-theta: 7.005 vs 7.505 (every seed below every seed)" in text
    assert (tmp_path / "extension.png").read_bytes()[:8] == PNG_MAGIC


def test_groups_select_the_runs_to_start_and_unknown_ones_are_named():
    from launcher.commands.reproduce import select_groups

    runs = PRESETS["full"]().pretrain_runs(("encodings", "linear"))
    chosen = select_groups(runs, "sinusoidal,linear+sinusoidal")
    assert {r.name for r in chosen} == {f"{g}-s{s}" for g in ("sinusoidal", "linear-sinusoidal") for s in (0, 1, 2)}
    assert select_groups(runs, "") == runs
    with pytest.raises(UserError, match="--groups: no run of the chosen parts is in group.s. fig9"):
        select_groups(runs, "fig9")


def test_downstream_pools_pretraining_seeds_and_keeps_each_ones_gain(tmp_path):
    """The full preset's seed structure on written fine-tune reports (no job runs): 2 recipe runs x 3
    fine-tuning seeds against one set of twins; lengths with 3 fine-tuning seeds."""
    import json

    from launcher.reproduce.results import collect
    from launcher.reproduce.job_runner import Layout

    preset, layout = PRESETS["full"](), Layout(tmp_path)
    base = {"recipe": 0.70, "recipe-s1": 0.66}
    for run in preset.finetune_runs(("downstream", "lengths")):
        accuracy = (0.60 if run.init == "random" else base[run.pretrain]) + 0.01 * run.seed
        report = {"test": {"accuracy": accuracy, "macro_f1": accuracy - 0.05}, "dev": {"accuracy": accuracy},
                  "majority_baseline": {"test": {"accuracy": 0.5}}, "train_examples": run.budget or 5000,
                  "truncated_share": {"test": 0.5}, "seconds": 1.0}
        path = layout.finetune_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report))
    results = collect(preset, layout, ("lengths", "downstream"))
    cell = results["downstream"]["inews"]["1000"]
    assert cell["pretrained"]["accuracy"]["n"] == 6 and cell["random"]["accuracy"]["n"] == 3
    assert cell["pretrained"]["accuracy"]["min"] == pytest.approx(0.66)
    assert cell["gain_points"] == pytest.approx(100 * (0.69 - 0.61))  # pooled mean minus the twins' mean
    gains = {name: run["gain_points"] for name, run in cell["by_pretraining_run"].items()}
    assert gains == {"recipe": pytest.approx(10.0), "recipe-s1": pytest.approx(6.0)}
    assert all(results["lengths"][n]["accuracy"]["n"] == 3 for n in ("128", "256", "512", "1024"))


def test_a_lengths_job_identical_to_a_downstream_job_runs_once(tmp_path):
    """The quick preset's inews fine-tune at length 32 is the downstream part's job in all but its part: one
    job, one report, read by both parts' tables. The full preset's lengths protocol differs: its own jobs."""
    import json

    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset, layout = PRESETS["quick"](), Layout(tmp_path)
    finetunes = preset.finetune_runs(("downstream", "lengths"))
    assert [f.name for f in finetunes] == [
        "downstream-rope-s0-pretrained-movie-reviews-n32-L32-s0", "downstream-rope-s0-random-movie-reviews-n32-L32-s0",
        "downstream-rope-s0-pretrained-inews-n32-L32-s0", "downstream-rope-s0-random-inews-n32-L32-s0",
        "lengths-rope-s0-pretrained-inews-n32-L64-s0"]
    assert [f.name for f in preset.finetune_runs(("lengths",))] == [f.name for f in preset.lengths_finetunes()] == [
        "downstream-rope-s0-pretrained-inews-n32-L32-s0", "lengths-rope-s0-pretrained-inews-n32-L64-s0"]
    for run in finetunes:
        accuracy = 0.5 + 0.01 * run.max_length + (0.1 if run.init == "pretrained" else 0)
        path = layout.finetune_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"test": {"accuracy": accuracy, "macro_f1": accuracy}, "dev": {"accuracy": accuracy},
                                    "majority_baseline": {"test": {"accuracy": 0.5}}, "train_examples": 32,
                                    "truncated_share": {"test": 0.5}, "seconds": 1.0}))
    results = collect(preset, layout, ("lengths", "downstream"))
    assert results["lengths"]["32"]["accuracy"]["mean"] == results["downstream"]["inews"]["32"]["pretrained"][
        "accuracy"]["mean"] == pytest.approx(0.92)
    assert results["lengths"]["64"]["accuracy"]["mean"] == pytest.approx(1.24)
    full = PRESETS["full"]()
    assert all(f.part == "lengths" for f in full.lengths_finetunes())


def test_recipes_part_changes_one_factor_of_the_rope_ablation_run(tmp_path):
    """WSD and the annealed mask rate against the encodings part's own RoPE runs (reused, not run twice);
    every variant's schedule resolves, and the annealed one masks 30% -> 15% over the ablation stages."""
    from launcher.config.stages import resolve_stages
    from launcher.reproduce.job_runner import Layout, Runner

    preset = PRESETS["full"]()
    alone = {r.name: r for r in preset.pretrain_runs(("recipes",))}
    assert set(alone) == {f"{v}-s{s}" for v in ("rope", "wsd", "mask-annealed") for s in (0, 1, 2)} | \
        {"recipe", "recipe-three-phase"}
    with_encodings = preset.pretrain_runs(("encodings", "recipes"))
    assert [r.name for r in with_encodings].count("rope-s0") == 1
    assert alone["rope-s1"].overrides == next(r for r in with_encodings if r.name == "rope-s1").overrides
    runner = Runner(preset, Layout(tmp_path), log=lambda line: None)
    resolved = {}
    for name in ("rope-s0", "wsd-s0", "mask-annealed-s0"):
        run = alone[name]
        extra = [f"schedule.file={runner._write_schedule(run)}"] if run.schedule else []
        cfg = load_run_config(preset.ablation_config, [*run.overrides, *extra])
        resolved[name] = (cfg, resolve_stages(cfg, preset.num_ranks))
    plain, wsd, annealed = (resolved[n] for n in ("rope-s0", "wsd-s0", "mask-annealed-s0"))
    assert [s.mask_prob for s in annealed[1]] == [0.3, 0.2, 0.15] and {s.mask_prob for s in plain[1]} == {0.15}
    assert [(s.max_seq_len, s.steps) for s in annealed[1]] == [(s.max_seq_len, s.steps) for s in plain[1]]
    assert wsd[0].optimizer.decay == "wsd" and wsd[0].decay_steps == plain[1][-1].steps
    assert plain[0].optimizer.decay == annealed[0].optimizer.decay == "linear"
    quick = PRESETS["quick"]()
    assert [s["mask_prob"] for s in quick.recipes.annealed_schedule(quick.ablation_schedule)] == [0.3, 0.15]


def test_recipes_report_compares_each_variant_with_the_linear_run(tmp_path):
    from launcher.reproduce.claims_report import write_report
    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset = PRESETS["full"]()
    # No run started yet: the ablation's RoPE runs are the "linear" group, each variant its own.
    empty = collect(preset, Layout(tmp_path / "out"), ("recipes",))["recipes"]
    assert {group: data["unfinished"] for group, data in empty.items()} == {
        group: [f"{name}-s{s}" for s in (0, 1, 2)] for group, name in
        (("linear", "rope"), ("wsd", "wsd"), ("mask-annealed", "mask-annealed"))}

    def group(*finals):
        runs = {f"r{i}": {"final_valid_loss": v, "valid_curve": [[25, v + 1, 0.2], [370, v, 0.3]],
                          "median_tokens_per_s": 1000.0, "stages": []} for i, v in enumerate(finals)}
        return {"runs": runs, "unfinished": [],
                "final_valid_loss": {"mean": sum(finals) / len(finals), "min": min(finals), "max": max(finals),
                                     "n": len(finals)},
                "final_valid_accuracy": {"n": 0}}

    def accuracy(*values):
        return {"accuracy": {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
                             "n": len(values)}}

    results = {"recipes": {"linear": group(6.0, 6.1, 6.2), "wsd": group(5.7, 5.8, 5.9),
                           "mask-annealed": group(6.1, 6.2, 6.3)},
               "recipe_comparison": {"budget": 1000, "pretraining": {"three-phase": {"final_valid_loss": 5.1},
                                                                     "recipe": {"final_valid_loss": 5.3}},
                                     "tasks": {"inews": {"three-phase": accuracy(0.70, 0.72), "recipe": accuracy(0.68),
                                                         "random-init twin": accuracy(0.62),
                                                         "three_phase_minus_recipe_points": 3.0}}}}
    text = write_report(results, tmp_path, ["header"]).read_text()
    assert "## Recipe fields: WSD and an annealed mask rate" in text and "fixed 15%" in text
    assert "- wsd vs linear: final loss 5.800 vs 6.100 (gap +0.300); the claim holds: every seed" in text
    assert "- mask-annealed vs linear: final loss 6.200 vs 6.100 (gap -0.100); the claim does NOT hold here." in text
    assert "| wsd | 5.800 (5.700-5.900, n=3) |" in text
    assert (tmp_path / "recipes.png").read_bytes()[:8] == PNG_MAGIC
    assert "validation loss at the fixed 15% mask rate on the same tokens: three-phase 5.100, recipe 5.300" in text
    assert "| inews | 0.710 (0.700-0.720, n=2) | 0.680 (0.680-0.680, n=1) | 0.620 (0.620-0.620, n=1) | +3.0 |" in text
    assert "](recipe_comparison.png)" in text and (tmp_path / "recipe_comparison.png").read_bytes()[:8] == PNG_MAGIC


def test_recipes_part_compares_the_three_phase_recipe_at_the_recipes_tokens():
    """The three-phase run trains recipe.yaml's lengths, batches and steps (equal tokens) and changes only
    recipe fields; its fine-tunes sit beside the recipe's and the twin's, which are the downstream part's."""
    from launcher.config.stages import resolve_stages

    preset = PRESETS["full"]()
    recipe = load_run_config(preset.recipe_config)
    three = load_run_config(preset.recipe_comparison.config)
    shapes = [[(s.max_seq_len, s.global_batch_size, s.steps) for s in resolve_stages(c, 2)] for c in (recipe, three)]
    assert shapes[0] == shapes[1] and three.model.diff(recipe.model) == []
    assert three.data.data_dir == recipe.data.data_dir and three.optimizer.decay == "wsd"
    assert [s.mask_prob for s in three.schedule.stages] == [0.3, 0.3, 0.15]
    finetunes = preset.recipe_comparison_finetunes(("recipes",))
    downstream = {f.name for f in preset.finetune_runs(("downstream",))}
    assert {f.name for f in finetunes if f.pretrain == "recipe"} <= downstream  # one report serves both parts
    assert len({f.name for f in preset.finetune_runs(("downstream", "recipes"))}) == \
        len(preset.finetune_runs(("downstream", "recipes")))
    assert {(f.task, f.init, f.budget) for f in finetunes if f.pretrain == "recipe-three-phase"} == \
        {(t, "pretrained", 1000) for t in ("movie-reviews", "inews")}
    assert "recipe-three-phase" in preset.exported_runs
    assert PRESETS["quick"]().finetune_runs(("recipes",)) == []  # the quick check stays cheap


def test_retrieval_part_on_written_reports(tmp_path):
    """The full preset's retrieval jobs on written reports (no job runs): per budget and init the test
    metrics over 3 fine-tuning seeds, the twin gap, and the report's section with its verdicts."""
    import json

    from launcher.reproduce.claims_report import write_report
    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset, layout = PRESETS["full"](), Layout(tmp_path)
    for run in preset.finetune_runs(("retrieval",)):
        ndcg = (0.10 if run.init == "random" else 0.30) + (0.2 if run.budget else 0.0) + 0.01 * run.seed
        metrics = {"ndcg@10": ndcg, "mrr@10": ndcg - 0.02, "recall@1": ndcg / 2, "recall@10": ndcg + 0.1,
                   "map@100": ndcg - 0.01, "queries": 2324, "passages": 4000}
        path = layout.finetune_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"held_out": "test", "test": metrics, "train_examples": run.budget, "seconds": 2.0}))
    table = collect(preset, layout, ("retrieval",))["retrieval"]
    assert list(table) == ["0", "1000"]
    assert table["1000"]["pretrained"]["ndcg@10"] == {"mean": pytest.approx(0.51), "min": 0.50, "max": 0.52, "n": 3}
    assert table["0"]["gain_ndcg@10"] == pytest.approx(0.2) and table["1000"]["random"]["train_examples"] == 1000
    text = write_report({"retrieval": table}, tmp_path / "report", ["header"]).read_text()
    assert "| zero-shot | pretrained export | 0.310 (0.300-0.320, n=3) |" in text
    assert "- 1000 pairs: pretraining changed test nDCG@10 by +0.200 (every seed above every seed)." in text


def test_the_from_bert_part_continues_each_learned_runs_bert():
    """(a) the encodings part's learned run of each seed, exported (a BERT), continued as RoPE and (b) as it is;
    (c) RoPE from scratch for the learned run's steps plus the continuation; every export they need planned;
    the learned models evaluated only within their table; not in --quick's default parts."""
    preset = PRESETS["full"]()
    runs = {r.name: r for r in preset.pretrain_runs(("encodings", "from-bert"))}
    assert len([r for r in runs.values() if r.name.startswith("learned-")]) == 3  # the encodings part's, once
    for seed in (0, 1, 2):
        converted, continued = runs[f"from-bert-rope-s{seed}"], runs[f"from-bert-learned-s{seed}"]
        assert converted.init_from == continued.init_from == f"learned-s{seed}"
        assert "model.position_encoding=rope" in converted.overrides
        assert "model.max_position_embeddings=1024" in continued.overrides and converted.schedule == continued.schedule
        scratch = runs[f"rope-long-s{seed}"]
        assert scratch.init_from is None and scratch.schedule[-1] == converted.schedule[-1]
        assert sum(s["steps"] for s in scratch.schedule) == 370 + converted.schedule[-1]["steps"]
    assert {f"learned-s{s}" for s in (0, 1, 2)} <= preset.exported(("from-bert",))
    assert "learned-s0" not in preset.exported(("encodings",))
    evals = {e.name: e for e in preset.eval_runs(("from-bert",))}
    assert evals["from-bert-converted-s0"].seq_lens == (128, 2048)
    assert evals["from-bert-continued-bert-s0"].seq_lens == evals["from-bert-learned-base-s0"].seq_lens == (128,)
    finetunes = [f for f in preset.finetune_runs(("from-bert",)) if f.part == "from-bert"]
    assert {(f.task, f.budget, f.max_length) for f in finetunes} == {("inews", 1000, 128)} and len(finetunes) == 27
    assert "from-bert" not in PRESETS["quick"]().default_parts and "from-bert" in preset.default_parts


def test_the_from_bert_report_says_what_recovered_and_what_cannot_be_read():
    """The section of report.md from a results table: n/a where a learned model cannot read (past its table),
    the recovery step of the converted model, or that it did not recover."""
    from launcher.reproduce.claims_report import _fmt
    from launcher.reproduce.from_bert_results import from_bert_section, recovery_step

    curve = [[10, 6.1, 0.1], [20, 5.9, 0.12], [30, 5.7, 0.14]]
    assert (recovery_step(curve, 5.9), recovery_step(curve, 5.0), recovery_step(curve, None)) == (20, None, None)
    one = {"mean": 5.8, "min": 5.7, "max": 5.9, "n": 3}
    table = {"stage": {"name": "continue", "max_seq_len": 256, "global_batch_size": 16, "steps": 120},
             "base_steps": 370, "table_positions": 1024,
             "variants": {"learned-base": {"loss": {"128": one}}, "converted": {"loss": {"128": one, "2048": one}}},
             "recovery": {"0": {"target_valid_loss": 5.9, "steps": 20, "first_valid": curve[0], "of_steps": 120},
                          "1": {"target_valid_loss": 5.0, "steps": None, "first_valid": curve[0], "of_steps": 120}},
             "finetune": {"converted": {"accuracy": one, "macro_f1": one, "train_examples": 1000}}}
    text = "\n".join(from_bert_section(table, _fmt))
    assert "| learned (the BERT, before continuing) | 5.800 (5.700-5.900, n=3) | n/a |" in text
    assert "seed 0: the learned model's last validation loss 5.900; converted to RoPE, the first validation " \
           "(step 10) was 6.100, and it recovered it after 20 steps." in text
    assert "did NOT recover it within its 120 steps" in text and "| 1000 |" in text


def test_the_extension_table_takes_only_the_extension_parts_evaluations(tmp_path):
    """A report over every part of an output directory where only the from-bert part ran: its checkpoint
    evaluations are not the extension part's variants (they once were, and hid the extension figures that
    a merged earlier report held)."""
    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset, layout = PRESETS["full"](), Layout(tmp_path)
    for run in preset.eval_runs(("from-bert",)):
        path = layout.eval_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"rope_theta": 10000.0, "trained_max_seq_len": 512, '
                        '"results": [{"seq_len": 128, "loss": 6.5, "accuracy": 0.1}]}', encoding="utf-8")
    results = collect(preset, layout, ("extension", "from-bert"))
    assert results["extension"]["variants"] == {}
    assert results["from-bert"]["variants"]


def test_the_documents_part_trains_each_view_on_the_rope_ablation_run():
    """Per seed: the encodings part's RoPE run (planned once when both parts run) and the same run with document
    attention, positions running on or restarting; every export fine-tuned on both tasks at 1000 labels with
    every fine-tuning seed; each checkpoint scored with each document alone and as packed; not in --quick's
    default parts."""
    preset = PRESETS["full"]()
    runs = {r.name: r for r in preset.pretrain_runs(("encodings", "documents"))}
    assert len(runs) == len(preset.pretrain_runs(("encodings", "documents")))  # rope-s<seed> planned once
    for seed in (0, 1, 2):
        rope, doc, restart = runs[f"rope-s{seed}"], runs[f"doc-attention-s{seed}"], runs[f"doc-positions-s{seed}"]
        assert set(doc.overrides) - set(rope.overrides) == {"data.attention=document"}
        assert set(restart.overrides) - set(rope.overrides) == {"data.attention=document", "data.positions=document"}
        assert rope.config == doc.config == restart.config == preset.ablation_config
        assert rope.schedule is doc.schedule is restart.schedule is None  # equal tokens: one schedule
    assert {f"rope-s{s}" for s in (0, 1, 2)} <= preset.exported(("documents",))
    evals = preset.eval_runs(("documents",))
    assert {(e.attention, e.seq_lens) for e in evals} == {("document", (128, 512)), ("sequence", (128, 512))}
    assert len({e.name for e in evals}) == len(evals) == 18
    finetunes = [f for f in preset.finetune_runs(("documents",)) if f.part == "documents"]
    assert {(f.task, f.budget) for f in finetunes} == {("inews", 1000), ("movie-reviews", 1000)}
    assert len({f.name for f in finetunes}) == len(finetunes) == 3 * 3 * 2 * 3
    assert "documents" not in PRESETS["quick"]().default_parts and "documents" in preset.default_parts


def test_the_documents_report_compares_each_view_over_seeds(tmp_path):
    """From written evaluation and fine-tune reports: the loss per view and length over seeds, the fine-tunes
    per task and variant, whether document beats sequence beyond the seed spread, and the plot."""
    import json

    from launcher.reproduce.claims_report import write_report
    from launcher.reproduce.job_runner import Layout
    from launcher.reproduce.results import collect

    preset, layout = PRESETS["full"](), Layout(tmp_path)
    loss = {"sequence": 6.0, "document": 5.5, "document-positions": 5.5}
    for run in preset.eval_runs(("documents",)):
        path = layout.eval_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        value = loss[run.variant] + 0.01 * run.seed + (0.3 if run.attention == "sequence" else 0.0)
        path.write_text(json.dumps({"results": [{"seq_len": n, "loss": value, "accuracy": 0.1}
                                                for n in run.seq_lens]}), encoding="utf-8")
    for run in preset.finetune_runs(("documents",)):
        path = layout.finetune_report(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        accuracy = 0.6 + 0.01 * run.seed + (0.0 if run.pretrain.startswith("rope") else 0.005)
        path.write_text(json.dumps({"test": {"accuracy": accuracy, "macro_f1": accuracy}, "dev": {"accuracy": 0.5},
                                    "majority_baseline": {"test": {"accuracy": 0.4}}, "train_examples": 1000,
                                    "truncated_share": {}, "seconds": 1.0}), encoding="utf-8")
    results = collect(preset, layout, ("documents",))
    table = results["documents"]
    assert table["variants"]["document"]["loss"]["document"]["512"] == pytest.approx(
        {"mean": 5.51, "min": 5.5, "max": 5.52, "n": 3})
    assert table["finetune"]["inews"]["sequence"]["accuracy"]["n"] == 9  # 3 pretraining x 3 fine-tuning seeds
    assert len(table["unfinished"]) == 9  # no run directory: none finished
    report = write_report(results, tmp_path / "report", ["header"]).read_text(encoding="utf-8")
    assert "- loss scored per document at 128: document 5.510 vs sequence 6.010; document lower: yes, beyond " \
           "the seed spread." in report
    assert "- inews test accuracy: document 0.615 vs sequence 0.610; document higher: on the mean only" in report
    assert (tmp_path / "report" / "documents.png").read_bytes()[:8] == PNG_MAGIC


def test_side_by_side_pretraining_jobs_share_the_cores(tmp_path, monkeypatch):
    """The quick preset runs two 1-rank pretraining jobs at a time: each rank gets half the cores' threads (alone it
    would take them all and the two would spin waiting for each other); a user's OMP_NUM_THREADS is kept."""
    import os

    from launcher.reproduce.job_runner import Layout, Runner

    preset = PRESETS["quick"]()
    assert (preset.pretrain_jobs, preset.num_ranks) == (2, 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert Runner(preset, Layout(tmp_path), log=lambda line: None).env["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert Runner(preset, Layout(tmp_path), log=lambda line: None).env["OMP_NUM_THREADS"] == "3"
    full = PRESETS["full"]()
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert full.pretrain_jobs == 1 and "OMP_NUM_THREADS" not in Runner(full, Layout(tmp_path), log=print).env
