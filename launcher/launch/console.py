"""What `roformer pretrain` shows of its job's output, and the log that keeps all of it.

Every line the job prints goes to RUN_DIR/logs/launcher.log as it arrives; the console gets the same lines
less DeepSpeed's launcher bookkeeping and warnings that do not apply to the user (HIDDEN, each with its
reason). In "status" mode (a terminal) rank 0's STATUS_MARKER lines become one status line at the bottom,
redrawn in place and not logged; in "lines" mode rank 0 prints plain lines (launcher/train/progress_line.py).
"""
from __future__ import annotations

import re
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from launcher.common.defaults import ORDERLY_STOP_EXIT_CODE, STATUS_MARKER
from launcher.common.io import write_text

_PREFIX_RE = re.compile(r"^([A-Za-z0-9_.-]+): (.*)$")  # pdsh's "host: " prefix
_DS_LOG_RE = re.compile(r"^\[[^\]]+\] \[(?P<level>[A-Z]+)\] \[(?P<file>[\w.]+):\d+:(?P<func>\w+)\] (?P<msg>.*)$")
_DS_LAUNCHER_FILES = ("runner.py", "launch.py", "multinode_runner.py")
_OP_BUILT_RE = re.compile(r"^DeepSpeed \S+ built successfully$")
_CLEAR = "\r\x1b[K"  # carriage return + erase to end of line


def hidden(text: str) -> str | None:
    """Why a line of the job's output stays off the console (None: show it). `text` without pdsh's
    host prefix."""
    if _OP_BUILT_RE.match(text):
        return "op build finished (announced before the start)"
    match = _DS_LOG_RE.match(text)
    if match is None or match["file"] not in _DS_LAUNCHER_FILES:
        return None
    level, msg = match["level"], match["msg"]
    if level == "INFO":
        return "DeepSpeed launcher bookkeeping"
    if level == "ERROR" and msg.endswith(f"exits with return code = {ORDERLY_STOP_EXIT_CODE}"):
        return "a rank stopped on request after a checkpoint"
    return None


class Console:
    """The console and the log of one `roformer pretrain`. Thread-safe: the runner's output arrives
    on a reader thread while the main thread prints its own lines."""

    def __init__(self, out: TextIO, log_path: Path | None, *, status: bool, hosts=()):
        self.out, self.status_mode = out, status
        self.hosts = set(hosts)  # names pdsh prefixes lines with
        self.lock = threading.Lock()
        self.status_text: str | None = None  # shown at the bottom in status mode
        self.echo = True  # False once our stdout is gone (a closed pipe): keep logging, stop echoing
        self.log: TextIO | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(log_path, "a", encoding="utf-8", errors="replace")
            self._log_line(f"=== {time.strftime('%Y-%m-%d %H:%M:%S %z')}: roformer {shlex.join(sys.argv[1:])}")

    def job_line(self, line: str) -> None:
        """A line of the job's output (with its newline)."""
        text = line.rstrip("\n")
        bare = text
        match = _PREFIX_RE.match(text)
        if match and match.group(1) in self.hosts:
            bare = match.group(2)
        with self.lock:
            if bare.startswith(STATUS_MARKER):
                if self.status_mode:
                    self._show_status(bare[len(STATUS_MARKER):])
                else:  # a rank told to draw a status line we cannot show: a plain line, logged
                    self._log_line(text)
                    self._print(self.out, bare[len(STATUS_MARKER):])
                return
            self._log_line(text)
            if hidden(bare) is None:
                self._print(self.out, text)

    def note(self, text: str, stream: TextIO | None = None) -> None:
        """One of `roformer pretrain`'s own lines (stderr unless `stream`), logged too."""
        with self.lock:
            self._log_line(text)
            self._print(stream or sys.stderr, text)

    def log_only(self, text: str) -> None:
        with self.lock:
            self._log_line(text)

    def close(self) -> None:
        with self.lock:
            if self.status_text is not None and self.echo:
                self._write(self.out, "\n")  # leave the last status line on screen
            self.status_text = None
            if self.log is not None:
                self.log.close()
                self.log = None

    # ----------------------------------------------------------------------------------- internals

    def _show_status(self, text: str) -> None:
        width = max(20, shutil.get_terminal_size((120, 24)).columns - 1)
        self.status_text = text if len(text) <= width else text[:width - 1] + "…"
        self._write(self.out, _CLEAR + self.status_text)

    def _print(self, stream: TextIO, text: str) -> None:
        if self.status_text is None:
            self._write(stream, text + "\n")
            return
        self._write(self.out, _CLEAR)  # the line goes above the status line, which is drawn again
        self._write(stream, text + "\n")
        self._write(self.out, self.status_text)

    def _write(self, stream: TextIO, text: str) -> None:
        if not self.echo and stream is self.out:
            return
        # Our stdout gone (launcher/common/io.py redirects it): keep draining, keep monitoring, keep logging.
        if not write_text(text, stream) and stream is self.out:
            self.echo = False

    def _log_line(self, text: str) -> None:
        if self.log is not None:
            try:
                self.log.write(text + "\n")
                self.log.flush()
            except OSError:  # a full disk must not stop the job: the console still has everything
                self.log = None
