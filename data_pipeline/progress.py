"""Progress of `data prepare`'s long phases on stderr: reading, tokenizer training, encoding.

Reading and encoding run in worker processes (or inline with one worker): each advances a shared
byte counter (`advance`, installed in every worker by `install_counter`) as it goes through its
documents, and a thread of the main process prints, at most every INTERVAL_S seconds,

    reading: 12.3 / 60.0 MB (20%), 3.1 MB/s, ETA 0:15

Bytes are document text (UTF-8) against the inputs' sizes, so JSON syntax, gzip and dropped
documents make the count end below 100%; each phase's last line says it is done.

Tokenizer training is one call into SentencePiece, which reports only through its own log on the
process's stderr: `sentencepiece_log` reads that log through a pipe while the trainer runs and turns
BPE's "Merged: ... merges=N" into the same kind of line, with an ETA, against the merges the
vocabulary needs (unigram training reports no count: its lines show the time elapsed).

Every progress display of the project goes through this module (`data prepare` here, `roformer
finetune`'s bars through `progress_bar`): on a terminal a line every INTERVAL_S (a tqdm bar for
finetune); when nobody watches (stderr is a file or a pipe: a Slurm job log, CI, `make demo > log`)
plain lines only, nothing redrawn with carriage returns, the first after INTERVAL_S and then at most
one every LOG_INTERVAL_S (`line_interval`), plus one at each point the display is told to show now
(finetune: each epoch's end).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from typing import Callable, Iterator, TextIO

INTERVAL_S = 5.0
LOG_INTERVAL_S = 30.0  # after the first line, when nobody watches: at most one line this often
FLUSH_BYTES = 1 << 20  # a worker adds to the shared counter every MB (one lock per MB, not per document)

_counter = None  # this process's multiprocessing.Value('q'), when a phase counts
_pending = 0


def install_counter(counter) -> None:
    """Pool initializer (and the inline pool): the shared counter `advance` adds to."""
    global _counter, _pending
    _counter, _pending = counter, 0


def advance(nbytes: int, flush: bool = False) -> None:
    """Count `nbytes` of input done (cheap: the shared counter is touched once per FLUSH_BYTES)."""
    global _pending
    _pending += nbytes
    if _counter is not None and (flush or _pending >= FLUSH_BYTES):
        with _counter.get_lock():
            _counter.value += _pending
        _pending = 0


def fmt_seconds(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def watched(stream: TextIO | None = None) -> bool:
    """Someone watches `stream` (default stderr) on a terminal; False for a file, a pipe, a closed stream."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def line_interval(lines_shown: int, on_terminal: bool) -> float:
    """Seconds until the next progress line after `lines_shown` lines: INTERVAL_S on a terminal and for
    the first line (a log shows early that the phase runs, and its ETA), then LOG_INTERVAL_S."""
    return INTERVAL_S if lines_shown == 0 or on_terminal else LOG_INTERVAL_S


class Ticker:
    """A thread that logs `line(elapsed)` at `line_interval` (every `interval` seconds when given) until stopped;
    `on_terminal`: whether stderr is watched (default: asked now)."""

    def __init__(self, line: Callable[[float], str | None], log: Callable[[str], None], interval: float | None = None,
                 on_terminal: bool | None = None):
        self.line, self.log = line, log
        self.interval = interval
        self.on_terminal = watched() if on_terminal is None else on_terminal
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="data-progress", daemon=True)

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        shown = 0
        while not self._stop.wait(line_interval(shown, self.on_terminal) if self.interval is None else self.interval):
            text = self.line(time.monotonic() - self.started)
            if text:
                self.log(text)
                shown += 1


PLAIN_FORMAT = "{desc}: {percentage:.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
"""A bar's figures as one plain line (tqdm.format_meter fields): done, share, elapsed, ETA, rate, postfix."""


class PlainProgress:
    """tqdm's interface (update, set_postfix, refresh, close) printing plain lines to `stream` instead of
    redrawing a bar: the same figures, at `line_interval`, and whenever it is refreshed (set_postfix
    refreshes, as tqdm's does); a line only when something changed since the last one."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n, self.postfix = 0, ""
        self.started = time.monotonic()
        self._shown: tuple[int, str] = (0, "")
        self._lines = 0
        self._due = self.started + line_interval(0, False)

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() >= self._due:
            self.refresh()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs) -> None:
        from tqdm import tqdm

        items = {**(ordered_dict or {}), **kwargs}
        shown = {key: tqdm.format_num(value) if isinstance(value, (int, float)) else str(value).strip()
                 for key, value in items.items()}  # as tqdm.set_postfix shows them
        self.postfix = ", ".join(f"{key}={value}" for key, value in shown.items())
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        if (self.n, self.postfix) == self._shown:
            return
        from tqdm import tqdm

        text = tqdm.format_meter(self.n, self.total, time.monotonic() - self.started, prefix=self.desc,
                                 unit=self.unit, postfix=self.postfix or None, bar_format=PLAIN_FORMAT)
        self.stream.write(text + "\n")
        self.stream.flush()
        self._shown, self._lines = (self.n, self.postfix), self._lines + 1
        self._due = time.monotonic() + line_interval(self._lines, False)

    def close(self) -> None:
        self.refresh()


def progress_bar(total: int, desc: str, unit: str = "step", stream: TextIO | None = None, enabled: bool = True):
    """A progress display: tqdm's bar when someone watches `stream` (default stderr) on a terminal, else
    PlainProgress's lines; a disabled tqdm (does nothing) when not `enabled`."""
    stream = sys.stderr if stream is None else stream
    if enabled and not watched(stream):
        return PlainProgress(total, desc, unit, stream)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=not enabled, dynamic_ncols=True, leave=True)


@contextlib.contextmanager
def counted_phase(name: str, total_bytes: int, counter, log: Callable[[str], None],
                  interval: float | None = None) -> Iterator[None]:
    """Log `name`'s progress from the shared `counter` (reset here) while the block runs."""
    with counter.get_lock():
        counter.value = 0

    def line(elapsed: float) -> str:
        done = counter.value
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {fmt_seconds((total_bytes - done) / rate)}" if rate > 0 and done < total_bytes else ""
        share = f" ({100 * done / total_bytes:.0f}%)" if total_bytes else ""
        return (f"{name}: {done / 1e6:,.1f} / {total_bytes / 1e6:,.1f} MB{share}, {rate / 1e6:.1f} MB/s{eta}")

    ticker = Ticker(line, log, interval)
    with ticker:
        yield
    log(f"{name}: done in {fmt_seconds(time.monotonic() - ticker.started)}")


# SentencePiece's log (absl format: "I0000 00:00:17.. 31765 bpe_model_trainer.cc:421] Merged: ...").
_LOG_LINE_RE = re.compile(r"^([IWEF])\d{4} \S+\s+\d+ \S+:\d+\] (.*)$")
_MERGED_RE = re.compile(r"^Merged: freq=\d+ merges=(\d+)\b")  # BPE, every 100 merges
_ALPHABET_RE = re.compile(r"^Alphabet size=(\d+)")
_META_RE = re.compile(r"^Adding meta_piece: ")
# The trainer prints its spec over many lines ("trainer_spec {", "  vocab_size: 8000", "}") and
# absl one line before its logging starts.
_SPEC_DUMP_RE = re.compile(r"^(\s|\w+_spec \{|\}|WARNING: All log messages before absl)")


@contextlib.contextmanager
def sentencepiece_log(vocab_size: int, log: Callable[[str], None], interval: float | None = None) -> Iterator[None]:
    """While the block trains SentencePiece (minloglevel=0), read its log from fd 2 through a pipe:
    progress lines every `interval` seconds (BPE: merges made of the vocabulary minus alphabet and
    meta pieces), its errors passed on; other lines on fd 2 (not SentencePiece's) pass through."""
    on_terminal = watched()  # fd 2 becomes a pipe below
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    state = {"merges": 0, "alphabet": 0, "meta": 0}

    def to_terminal(text: str) -> None:  # fd 2 is the pipe now: write to the saved stderr
        os.write(saved, (text + "\n").encode("utf-8", "replace"))

    def reader() -> None:
        with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as lines:
            for raw in lines:
                text = raw.rstrip("\n")
                match = _LOG_LINE_RE.match(text)
                if match is None:  # ours (progress lines logged meanwhile) or part of SentencePiece's spec dump
                    if not _SPEC_DUMP_RE.match(text):
                        to_terminal(text)
                    continue
                level, message = match.groups()
                for key, regex in (("merges", _MERGED_RE), ("alphabet", _ALPHABET_RE)):
                    found = regex.match(message)
                    if found:
                        state[key] = int(found.group(1))
                state["meta"] += bool(_META_RE.match(message))
                if level in "EF":
                    to_terminal(f"sentencepiece: {message}")

    def line(elapsed: float) -> str:
        merges = state["merges"]
        target = vocab_size - state["alphabet"] - state["meta"]
        if not merges or target <= 0:
            return f"tokenizer: training, {fmt_seconds(elapsed)} elapsed"
        eta = fmt_seconds(max(0, target - merges) * elapsed / merges)
        return f"tokenizer: {merges:,} / ~{target:,} merges ({min(100, 100 * merges // target)}%), ETA {eta}"

    thread = threading.Thread(target=reader, name="sentencepiece-log", daemon=True)
    thread.start()
    # `log` writing to stderr reaches the pipe, and the reader passes it on
    ticker = Ticker(line, log, interval, on_terminal)
    try:
        with ticker:
            yield
    finally:
        os.dup2(saved, 2)  # drops the pipe's last write end: the reader sees EOF
        thread.join(timeout=10)
        os.close(saved)
    log(f"tokenizer: done in {fmt_seconds(time.monotonic() - ticker.started)}")
