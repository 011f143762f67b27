"""RUN_DIR/plots/ and `roformer report` on real runs: the session's 2-rank trainer run (whose own
stage-end hook rendered its plots), real eval-mlm / finetune reports of its export, and the stored
run (no process started). PNGs are checked as files a person could open: PNG signature, decodable,
1200 x 800, not blank, and the curves' colours present."""
from __future__ import annotations

import json
import shutil

from launcher.cli import main as cli_main
from launcher.report.hook import LOG_NAME, PlotHook
from launcher.run_dir.layout import RunDir
from tests.support.helpers import check_png, report_of

TRAIN_BLUE, VALID_ORANGE, SKIP_RED = (31, 119, 180), (255, 127, 14), (214, 39, 40)  # tab:blue, orange, red
TFLOPS_BROWN = (140, 86, 75)  # tab:brown
RUN_PLOTS = ("curves_steps.png", "curves_tokens.png", "learning_rate.png", "throughput.png")


def test_report_of_a_stored_run_without_starting_anything(stored_run, copy_of):
    """The fast suite's check: a run directory written by an older version, report into RUN_DIR itself."""
    run = copy_of(stored_run)
    assert cli_main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "`short`" in text and "`long`" in text and "32 x 8" in text
    assert "step 5 of 5 (100%)" in text and "`global_step5`" in text
    for name in RUN_PLOTS:
        check_png(run / "plots" / name)


def test_report_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "not a run directory of `roformer pretrain`" in capsys.readouterr().err
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_plot_hook_failures_are_messages_not_errors(tmp_path):
    """A render that cannot start (plots/ is a file) or fails (not a run dir) is one message each."""
    messages = []
    blocked = RunDir(tmp_path / "blocked")
    blocked.root.mkdir()
    blocked.plots.write_text("not a directory")
    hook = PlotHook(blocked, 10, messages.append)
    hook.stage_end(3)
    hook.run_end(3, wait=True)
    assert len(messages) == 2 and all("could not start rendering" in m for m in messages)

    messages.clear()
    empty = RunDir(tmp_path / "empty")
    empty.root.mkdir()
    hook = PlotHook(empty, 10, messages.append)
    hook.run_end(7, wait=True)
    assert messages == [f"plots: rendering failed (exit code 2); see {empty.plots / LOG_NAME}"]
    assert "not a run directory" in (empty.plots / LOG_NAME).read_text()
    shutil.rmtree(empty.root)


def test_rendering_imports_neither_torch_nor_deepspeed():
    """The stage-end render is a fresh process on the training machine: it must start light."""
    import subprocess
    import sys

    code = ("import sys, launcher.commands.report, launcher.report.plots, launcher.report.run_report, "
            "launcher.report.hook; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_report_shows_the_config_version_in_effect(stored_run, copy_of, tmp_path):
    """A resume with another config writes config.2.yaml / stages.2.json (launcher/run_dir/records.py):
    the report describes the newest, and lists the versions."""
    import yaml

    from launcher.run_dir.records import record_start

    run = RunDir(copy_of(stored_run))
    config = yaml.safe_load(run.config.read_text())
    config["optimizer"]["lr"] = 0.0005
    stages = json.loads(run.stages.read_text())
    stages["world_size"] = 1
    for stage in stages["stages"]:
        stage["grad_accum_steps"] *= 2
    ds_config = json.loads(run.ds_config.read_text())
    assert record_start(run, {"config": config, "ds_config": ds_config, "stages": stages}, step=5,
                        resumed_from="global_step5") is not None
    text = report_of(run.root, tmp_path / "out", cli=True)  # the command itself, once (elsewhere in-process)
    assert f"| run config | `{run.root / 'config.2.yaml'}` |" in text
    assert "| world size | 1 rank |" in text and "lr 0.0005" in text
    assert "| config versions | v1 from step 0: " in text and "v2 from step 5: `config.2.yaml`" in text
    assert "4 x 2 x 1" in text  # stage 1: micro 4, the new grad-accum, the new world size
