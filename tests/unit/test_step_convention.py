"""One step convention (launcher/run_dir/metrics_format.py): a step number counts optimizer steps completed.

Fast checks on files (the real run's records are checked in tests/multirank/test_training.py and
tests/multirank/test_launch_local.py): an older metrics.jsonl (0-based train/valid steps) reads the same as a
new one through every reader, the trainer's restart rewrites it into the new convention without
losing a record, and the progress lines of launcher/train/progress_line.py.
"""
from __future__ import annotations

import io
import json

import pytest

from launcher.report.curves import load_curves
from launcher.run_dir.metrics_format import FORMAT_EVENT, is_current, normalise
from launcher.train.metrics import _truncate_from, read_metrics
from launcher.train.progress_line import STATUS_MARKER, ProgressPrinter, progress_every

# Two stages of 3 and 2 steps, validation after steps 3 and 5, checkpoints after 3 and 5, written
# by the trainer before the convention: train/valid steps are the 0-based index of the step taken.
OLD_LINES = [
    {"kind": "event", "event": "stage_start", "step": 0, "stage": 0, "name": "short"},
    *[{"kind": "train", "step": i, "stage": 0, "loss": 9.0 - i, "mlm_accuracy": 0.1, "max_seq_len": 32,
       "global_batch_size": 8, "tokens_per_s": 100.0, "step_time_s": 1.0} for i in range(3)],
    {"kind": "valid", "step": 2, "stage": 0, "loss": 6.5, "mlm_accuracy": 0.2},
    {"kind": "event", "event": "checkpoint", "step": 3, "tag": "global_step3"},
    {"kind": "event", "event": "stage_start", "step": 3, "stage": 1, "name": "long"},
    *[{"kind": "train", "step": i, "stage": 1, "loss": 9.0 - i, "mlm_accuracy": 0.1, "max_seq_len": 64,
       "global_batch_size": 8, "tokens_per_s": 100.0, "step_time_s": 1.0} for i in range(3, 5)],
    {"kind": "valid", "step": 4, "stage": 1, "loss": 5.5, "mlm_accuracy": 0.3},
    {"kind": "event", "event": "checkpoint", "step": 5, "tag": "global_step5"},
]


def _write(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _new_format(records):
    return [{"kind": "event", "event": FORMAT_EVENT, "version": 2}, *normalise(records)]


def test_an_older_file_reads_as_steps_completed_everywhere(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _write(old, OLD_LINES)
    _write(new, _new_format(OLD_LINES))
    for run in (old, new):
        assert [r["step"] for r in read_metrics(run, "train")] == [1, 2, 3, 4, 5]
        assert [r["step"] for r in read_metrics(run, "valid")] == [3, 5]  # = the checkpoints' steps
        assert [r["step"] for r in read_metrics(run, "event") if r.get("event") == "checkpoint"] == [3, 5]
        curves = load_curves(run)
        assert curves.train.step.tolist() == [1, 2, 3, 4, 5] and curves.valid.step.tolist() == [3, 5]
        assert [b.step for b in curves.boundaries()] == [0, 3]  # = the stage_start events' steps
        # No stages.json: the stages come from the records, first_step = steps done before the stage.
        assert [(s.name, s.first_step) for s in curves.stages] == [("short", 0), ("long", 3)]


@pytest.mark.parametrize("written", ["old", "new"])
def test_a_restart_rewrites_the_file_in_the_new_convention_up_to_its_checkpoint(tmp_path, written):
    run = tmp_path / "run"
    _write(run, OLD_LINES if written == "old" else _new_format(OLD_LINES))
    _truncate_from(run / "metrics.jsonl", 3)  # resume from global_step3: steps 4, 5 are a lost future
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["event"] == FORMAT_EVENT and is_current(records)
    assert sum(r.get("event") == FORMAT_EVENT for r in records) == 1
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert [r["step"] for r in records if r["kind"] == "valid"] == [3]  # ran before global_step3 was saved
    assert [r["step"] for r in records if r.get("event") == "checkpoint"] == [3, 5]  # events are all kept
    assert [r["step"] for r in read_metrics(run, "train")] == [1, 2, 3]  # read as is: no second shift


def test_plain_progress_lines_come_every_n_steps_and_at_the_end():
    out = io.StringIO()
    printer = ProgressPrinter(total_steps=10, every=4, mode="lines", out=out)
    for step in range(1, 11):
        printer.step(step, lambda s=step: f"step {s}/10")
    printer.message("validation at step 10")
    assert out.getvalue().splitlines() == ["step 4/10", "step 8/10", "step 10/10", "validation at step 10"]
    assert progress_every(0, 570) == 28 and progress_every(0, 5) == 1 and progress_every(7, 570) == 7


def test_status_lines_are_marked_and_at_most_one_per_interval():
    out = io.StringIO()
    printer = ProgressPrinter(total_steps=1000, every=1, mode="status", out=out)
    asked = []
    for step in range(1, 1001):  # much faster than one interval: the first and the last are printed
        printer.step(step, lambda s=step: asked.append(s) or f"step {s}")
    assert out.getvalue().splitlines() == [f"{STATUS_MARKER}step 1", f"{STATUS_MARKER}step 1000"]
    assert asked == [1, 1000]  # the text is only formatted when a line is due


def test_one_reader_skips_a_cut_line_and_bytes_that_are_not_utf8_for_every_caller(tmp_path):
    from launcher.launch.restart_loop import train_records
    from launcher.run_dir.layout import RunDir
    from launcher.run_dir.metrics_format import format_event

    run = RunDir(tmp_path)
    good = [format_event(), {"kind": "train", "step": 1, "loss": 7.0}, {"kind": "train", "step": 2, "loss": 6.0}]
    lines = [json.dumps(r).encode() for r in good]
    run.metrics.write_bytes(lines[0] + b"\n" + lines[1] + b"\n" + b'{"kind": "train", "step": \xff\xfe}\n'
                            + lines[2] + b"\n" + b'{"kind": "train", "st')
    assert [r["step"] for r in read_metrics(tmp_path, "train")] == [1, 2]
    assert [r["step"] for r in train_records(run)] == [1, 2]  # the restart loop reads it the same way
