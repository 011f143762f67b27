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
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from typing import Callable, Iterator

INTERVAL_S = 5.0
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


class Ticker:
    """A thread that logs `line(elapsed)` every `interval` seconds until stopped."""

    def __init__(self, line: Callable[[float], str | None], log: Callable[[str], None], interval: float | None = None):
        self.line, self.log = line, log
        self.interval = INTERVAL_S if interval is None else interval
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
        while not self._stop.wait(self.interval):
            text = self.line(time.monotonic() - self.started)
            if text:
                self.log(text)


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
    ticker = Ticker(line, log, interval)  # `log` writing to stderr reaches the pipe, and the reader passes it on
    try:
        with ticker:
            yield
    finally:
        os.dup2(saved, 2)  # drops the pipe's last write end: the reader sees EOF
        thread.join(timeout=10)
        os.close(saved)
    log(f"tokenizer: done in {fmt_seconds(time.monotonic() - ticker.started)}")
