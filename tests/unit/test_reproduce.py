"""`roformer reproduce`: the plan of runs, argument checks, and the quick mode end to end.

The quick mode starts real `roformer data prepare / pretrain / export / finetune` jobs (tiny model,
a few steps) and checks the report's shape; a second invocation must skip every finished job.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.commands.reproduce import parse_parts
from launcher.config.run_config import load_run_config
from launcher.errors import UserError
from launcher.reproduce.plan import PARTS, PRESETS
from tests.support.helpers import roformer

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_full_preset_compares_every_variant_over_at_least_three_seeds():
    preset = PRESETS["full"]()
    runs = preset.pretrain_runs(PARTS)
    groups: dict[str, set[int]] = {}
    for run in runs:
        groups.setdefault(run.group, set()).add(run.seed)
    assert set(groups) == {"rope", "sinusoidal", "learned", "linear+rope", "linear+sinusoidal", "recipe"}
    assert all(len(seeds) >= 3 for group, seeds in groups.items() if group != "recipe")
    # Same config and schedule for every ablation variant: only encoding, attention, table and seed differ.
    ablation = [r for r in runs if r.group != "recipe"]
    assert {r.config for r in ablation} == {preset.ablation_config}
    finetunes = preset.finetune_runs(PARTS)
    assert len({f.name for f in finetunes}) == len(finetunes)  # one report file per job
    downstream = [f for f in finetunes if f.part == "downstream"]
    assert {(f.task, f.budget, f.init) for f in downstream} == {
        (t, b, i) for t in ("movie-reviews", "inews") for b in (250, 1000, None) for i in ("pretrained", "random")}
    assert {f.max_length for f in finetunes if f.part == "lengths"} == {128, 256, 512, 1024}
    assert len(preset.finetune_seeds) >= 3
    # The whole training split gets its own (shorter) epoch count; finetune's argparse keeps the last --epochs.
    for f in downstream:
        epochs = [f.args[i + 1] for i, flag in enumerate(f.args) if flag == "--epochs"]
        assert epochs[-1] == ("3" if f.budget is None else epochs[0]), f.name


def test_each_part_runs_alone_with_only_what_it_needs():
    preset = PRESETS["full"]()
    assert [r.name for r in preset.pretrain_runs(("downstream",))] == ["recipe"]
    assert {r.group for r in preset.pretrain_runs(("linear",))} == {"linear+rope", "linear+sinusoidal"}
    assert preset.finetune_runs(("encodings",)) == []


@pytest.mark.parametrize("name", ["ablation.yaml", "recipe.yaml"])
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
    from launcher.reproduce.runner import Layout, Runner

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
