"""RUN_DIR/plots/ and `roformer report` on real runs: the session's 2-rank trainer run (whose own
stage-end hook rendered its plots), real eval-mlm / finetune reports of its export, and the stored
run (no process started). PNGs are checked as files a person could open: PNG signature, decodable,
1200 x 800, not blank, and the curves' colours present."""
from __future__ import annotations

import json
import os
import re
import shutil
import time

from launcher.cli import main as cli_main
from launcher.report.hook import LOG_NAME, PlotHook
from launcher.run_dir.layout import RunDir
from tests.support.helpers import (
    TINY_STAGES,
    TINY_TOTAL_STEPS,
    check_png,
    events,
    report_of,
)

TRAIN_BLUE, VALID_ORANGE, SKIP_RED = (31, 119, 180), (255, 127, 14), (214, 39, 40)  # tab:blue, orange, red
TFLOPS_BROWN = (140, 86, 75)  # tab:brown
# critical_batch.png: trainer_run measures the gradient noise scale (logging.noise_every 3).
RUN_PLOTS = ("curves_steps.png", "curves_tokens.png", "learning_rate.png", "throughput.png", "critical_batch.png")


def test_training_rendered_its_plots_at_stage_ends_and_the_end(trainer_run):
    """The trainer's own hook: RUN_DIR/plots holds every run figure, rendered from the final state
    (the run waited for it), and the renders' log names the last stage end."""
    plots = RunDir(trainer_run).plots
    for name in RUN_PLOTS:
        check_png(plots / name, colours=(TRAIN_BLUE,))
    check_png(plots / "curves_steps.png", colours=(TRAIN_BLUE, VALID_ORANGE))
    assert not (plots / "loss_scale.png").exists()  # fp32: a constant scale of 1 is not drawn
    log = (plots / LOG_NAME).read_text()
    renders = [int(n) for n in re.findall(r"^--- step (\d+): render started", log, flags=re.M)]
    assert renders and renders[-1] == TINY_TOTAL_STEPS, log
    assert set(renders) <= {sum(s["steps"] for s in TINY_STAGES[:k + 1]) for k in range(len(TINY_STAGES))}, log
    assert "Traceback" not in log, log
    done = re.findall(r"^report: (\d+) plots of step (\d+) \((\w+)\)", log, flags=re.M)
    assert done[-1] == (str(len(RUN_PLOTS)), str(TINY_TOTAL_STEPS), "finished"), log  # the run waited for it
    newest_metrics = RunDir(trainer_run).metrics.stat().st_mtime
    assert min((plots / n).stat().st_mtime for n in RUN_PLOTS) >= newest_metrics - 1  # the final state


def test_report_of_a_finished_run(trainer_run, tmp_path):
    out = tmp_path / "out"
    text = report_of(trainer_run, out)
    for name in RUN_PLOTS:
        check_png(out / "plots" / name, colours=(TRAIN_BLUE,))
        assert f"](plots/{name})" in text
    for stage in TINY_STAGES:
        assert f"`{stage['name']}`" in text and f"{stage['max_seq_len']} x {stage['global_batch_size']}" in text
    assert f"step {TINY_TOTAL_STEPS} of {TINY_TOTAL_STEPS} (100%)" in text
    assert "finished at step 16" in text
    assert f"**Last checkpoint:** `global_step{TINY_TOTAL_STEPS}` (step {TINY_TOTAL_STEPS}," in text
    assert "| world size | 2 ranks |" in text and "| precision | fp32 |" in text and "| ZeRO stage | 2 |" in text
    kept = sorted(int(p.name.removeprefix("global_step")) for p in (trainer_run / "checkpoints").glob("global_step*"))
    assert all(f"| `global_step{step}` | {step} |" in text for step in kept)
    assert "No evaluation report" in text
    # Per stage: the batch it used beside the median of its critical-batch estimates (steps 3, 6, ... 15).
    lines = re.findall(r"^- (\d)\. `(\w+)`: batch (\d+), (?:measured critical batch ~[\d,]+ \(median of (\d) "
                       r"estimates?\)|no estimate)$", text, flags=re.M)
    assert [line[:3] for line in lines] == [(str(i + 1), s["name"], str(s["global_batch_size"]))
                                           for i, s in enumerate(TINY_STAGES)]
    assert "## Critical batch" in text and lines[-1][3] == "2"  # `wide`: steps 12 and 15
    assert not (trainer_run / "report.md").exists()  # --out: the run directory is only read
    # The trainer records model TFLOP/s and MFU (launcher/common/mfu.py): a third throughput panel.
    first = json.loads(next(line for line in (trainer_run / "metrics.jsonl").read_text().splitlines()
                            if '"kind": "train"' in line))
    assert first["mfu"] is not None and first["tflops"] is not None
    assert "| median TFLOP/s per rank | median MFU |" in text
    check_png(out / "plots" / "throughput.png", colours=(TFLOPS_BROWN,))


def test_report_reads_eval_reports_and_skips_a_cut_metrics_line(trainer_run, trainer_export, tiny_data, copy_of,
                                                               tmp_path):
    """Real eval-mlm and finetune JSON (a random-init twin inside the report, and as a separate
    report), a metrics line cut by a kill, and a damaged JSON file."""
    from launcher.downstream.task_data import prepare_task_data
    from launcher.downstream.tasks import default_tasks_dir

    run = copy_of(trainer_run)
    prepare_task_data(default_tasks_dir())
    assert cli_main(["eval-mlm", str(trainer_export), "--data", str(tiny_data), "--seq-lens", "32,128",
                     "--tokens", "2048", "--out", str(run / "eval_mlm.json")]) == 0
    small = ["--task", "inews", "--max-train-examples", "48", "--epochs", "1", "--max-eval-examples", "24",
             "--threads", "1"]
    for length in (64, 32):
        for init in ("pretrained", "random"):
            assert cli_main(["finetune", str(trainer_export), *small, "--max-length", str(length), "--init", init,
                             "--out", str(tmp_path / f"inews{length}_{init}.json")]) == 0
    # At 64 tokens the twin inside the report (as `finetune --compare-random-init` writes it), at 32 apart.
    inside = {**json.loads((tmp_path / "inews64_pretrained.json").read_text()),
              "random_init": json.loads((tmp_path / "inews64_random.json").read_text())}
    (run / "finetune_inews.json").write_text(json.dumps(inside))
    shutil.copy(tmp_path / "inews32_pretrained.json", run / "finetune_inews32.json")
    shutil.copy(tmp_path / "inews32_random.json", run / "finetune_inews32_random.json")
    (run / "finetune_broken.json").write_text('{"task": "inews", "test": {"accu')
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        metrics.write('{"kind": "train", "step": 16, "stage": 2, "loss": 4.1, "mlm_acc')  # killed mid-write

    text = report_of(run, tmp_path / "out")
    plots = tmp_path / "out" / "plots"
    check_png(plots / "eval_mlm.png")
    check_png(plots / "finetune.png", colours=(TRAIN_BLUE,))
    assert "1 line(s) of metrics.jsonl were not JSON" in text
    assert f"step {TINY_TOTAL_STEPS} of {TINY_TOTAL_STEPS} (100%)" in text
    mlm = json.loads((run / "eval_mlm.json").read_text())
    for row in mlm["results"]:
        assert f"| `eval_mlm` | {row['seq_len']} | {row['loss']:.4f} | {row['accuracy']:.4f} |" in text
    twin = json.loads((run / "finetune_inews.json").read_text())
    pair = lambda s: f"{s['accuracy']:.4f} / {s['macro_f1']:.4f}"  # noqa: E731
    assert (f"| inews, len 64, 48 ex. | {pair(twin['test'])} | {pair(twin['random_init']['test'])} | "
            f"{pair(twin['majority_baseline']['test'])} |") in text
    apart, apart_random = (json.loads((run / f"finetune_inews32{s}.json").read_text()) for s in ("", "_random"))
    assert f"| inews, len 32, 48 ex. | {pair(apart['test'])} | {pair(apart_random['test'])} |" in text
    assert "Not valid JSON (skipped): `finetune_broken.json`" in text


def test_report_while_running_and_after_a_kill(trainer_run, copy_of, tmp_path):
    """Records of a run cut after its first stage: fresh -> running; untouched for long -> not running."""
    run = copy_of(trainer_run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    first_stage_end = next(i for i, line in enumerate(lines)
                           if '"event": "stage_start", ' in line and '"stage": 1' in line)
    (run / "metrics.jsonl").write_text("\n".join(lines[:first_stage_end]) + "\n")
    steps = TINY_STAGES[0]["steps"]
    text = report_of(run, tmp_path / "live")
    assert "**Status:** running (last record" in text
    assert f"step {steps} of {TINY_TOTAL_STEPS}" in text and "stage 1/3 `short`" in text
    old = time.time() - 3600
    os.utime(run / "metrics.jsonl", (old, old))
    text = report_of(run, tmp_path / "dead")
    assert "**Status:** no end record and nothing written for 60 min" in text
    check_png(tmp_path / "dead" / "plots" / "curves_steps.png", colours=(TRAIN_BLUE,))


def test_plot_hook_returns_at_once_and_renders_in_the_background(trainer_run, copy_of):
    run = RunDir(copy_of(trainer_run))
    shutil.rmtree(run.plots)
    messages = []
    hook = PlotHook(run, TINY_TOTAL_STEPS, messages.append)
    started = time.perf_counter()
    hook.stage_end(TINY_STAGES[0]["steps"])
    assert time.perf_counter() - started < 2.0  # the training step does not wait for matplotlib
    hook.stage_end(TINY_TOTAL_STEPS)  # the last stage's end is left to run_end
    hook.run_end(TINY_TOTAL_STEPS, wait=True)
    assert messages == []
    log = (run.plots / LOG_NAME).read_text()
    assert re.findall(r"^--- step (\d+): render started", log, flags=re.M) == [str(TINY_STAGES[0]["steps"]),
                                                                              str(TINY_TOTAL_STEPS)]
    # run_end waited for its own render; the detached one may still be going. Both read the
    # finished run's records (each reads them once it holds the lock) and neither fails.
    done = rf"^report: {len(RUN_PLOTS)} plots of step {TINY_TOTAL_STEPS} \(finished\)"
    assert re.search(done, log, flags=re.M), log
    deadline = time.time() + 120
    while len(re.findall(done, (run.plots / LOG_NAME).read_text(), flags=re.M)) < 2:
        assert time.time() < deadline, (run.plots / LOG_NAME).read_text()
        time.sleep(1)
    for name in RUN_PLOTS:
        check_png(run.plots / name, colours=(TRAIN_BLUE,))


def test_a_stopped_fp16_run_renders_its_loss_scale_on_the_way_out(fp16_stopped_run, tmp_path):
    """A real fp16 run (a loss scale that overflows at once; tests/multirank/conftest.py) stopped by
    SIGTERM: the stop starts a detached render that outlives the run (the fixture waits for its line),
    the loss-scale figure shows the skipped steps, and the report says the run stopped and where."""
    _, run_dir = fp16_stopped_run
    (stopped,) = events(run_dir, "stopped")
    assert f"plots of step {stopped['step']} (stopped)" in (RunDir(run_dir).plots / LOG_NAME).read_text()
    check_png(RunDir(run_dir).plots / "loss_scale.png", colours=(TRAIN_BLUE,))
    check_png(RunDir(run_dir).plots / "loss_scale.png", colours=(SKIP_RED,), min_pixels=100)  # a few crosses
    text = report_of(run_dir, tmp_path / "out")
    assert f"stopped by a signal at step {stopped['step']} after a checkpoint" in text
    assert f"step {stopped['step']} of {TINY_TOTAL_STEPS}" in text and "| precision | fp16 |" in text
    assert "](plots/loss_scale.png)" in text
