"""Progress in logs (issue 32): run with a pipe, as in a Slurm job log, CI or `make demo > log`, the
commands print plain lines (nothing redrawn with carriage returns, no line over 300 characters) with
the figures a bar shows, at a bounded rate; on a terminal the bar stays (data_pipeline/progress.py,
the one display of every command). Real commands, real export (the session's), real SentencePiece."""
from __future__ import annotations

import io
import re

from data_pipeline import progress
from tests.support.corpus_files import english_paragraphs, write_jsonl
from tests.support.helpers import roformer

MAX_LINE = 300


def _plain(output: str) -> list[str]:
    """The output's lines, after checking none was redrawn or is longer than MAX_LINE."""
    assert "\r" not in output, "a carriage return: a bar redrawn into the log"
    lines = output.splitlines()
    assert max(map(len, lines)) <= MAX_LINE, max(lines, key=len)
    return lines


def test_finetune_in_a_pipe_prints_one_plain_line_per_epoch_end_with_the_bars_figures(stored_export, tasks_dir):
    done = roformer("finetune", str(stored_export), "--task", "movie-reviews", "--task-data", str(tasks_dir),
                    "--max-train-examples", "16", "--epochs", "2", "--max-eval-examples", "8", "--max-length", "32",
                    "--compare-random-init", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = _plain(done.stdout + done.stderr)
    for name in ("movie-reviews", "movie-reviews \\(random init\\)"):
        for epoch in (1, 2):  # 16 examples, batch 16 (the default): one step per epoch
            pattern = (rf"{name} seed 0: {50 * epoch}% {epoch}/2 step \[\d\d:\d\d<\d\d:\d\d, +[\d.]+(s/)?step(/s)?, "
                       rf"epoch={epoch}/2, loss=[\d.]+, dev \w+=[\d.]+\]")
            assert sum(bool(re.fullmatch(pattern, line)) for line in lines) == 1, (pattern, lines)


def test_data_prepare_in_a_pipe_prints_plain_bounded_lines(tmp_path):
    source = write_jsonl(tmp_path / "en.jsonl", english_paragraphs(limit_files=20))
    done = roformer("data", "prepare", "--input", str(source), "--out", str(tmp_path / "prepared"),
                    "--vocab-size", "1000", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = _plain(done.stdout + done.stderr)
    for phase in ("reading", "tokenizer", "encoding"):
        assert sum(line.startswith(f"{phase}: done in ") for line in lines) == 1, lines


class _Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def test_a_terminal_gets_the_bar_and_a_pipe_gets_lines_at_most_every_log_interval(monkeypatch):
    from tqdm import tqdm

    terminal = progress.progress_bar(10, "task seed 0", stream=_Stream(terminal=True))
    assert isinstance(terminal, tqdm)  # the bar, redrawn in place, as before
    terminal.close()

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = _Stream(terminal=False)
    bar = progress.progress_bar(300, "task seed 0", stream=stream)
    for _ in range(300):  # one step a second: 300 s
        clock[0] += 1.0
        bar.update(1)
    bar.set_postfix({"epoch": "1/1", "loss": "0.6931", "dev accuracy": 0.5})
    bar.close()  # nothing new since the epoch's line: no second one
    lines = stream.getvalue().splitlines()
    done = [int(re.search(r" (\d+)/300 step", line).group(1)) for line in lines]
    assert done[0] == progress.INTERVAL_S  # the first line early, then at most one per LOG_INTERVAL_S
    assert all(b - a >= progress.LOG_INTERVAL_S for a, b in zip(done[:-2], done[1:-1]))
    assert len(lines) <= 2 + 300 / progress.LOG_INTERVAL_S
    assert lines[-1] == ("task seed 0: 100% 300/300 step [05:00<00:00,  1.00step/s, epoch=1/1, loss=0.6931, "
                         "dev accuracy=0.5]")
