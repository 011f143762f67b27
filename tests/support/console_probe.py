"""TEST-ONLY program whose console goes away under it (tests/unit/test_console_gone.py).

    python -m tests.support.console_probe MODE LOG

It waits for EOF on stdin (the test closes the pipes it reads, then stdin), then writes the way a rank
or `roformer pretrain` does after its console went away, and exits with EXIT_CODE. MODE:
  rank      LOG is the console log (launcher.common.io.keep_console; "-" for none): write_line, a write_line
            from a signal handler, print() flushed and unflushed, a large buffered write, then the
            interpreter's own final flush
  launcher  LOG is RUN_DIR: as `roformer pretrain` (keep_console without a log), a note by print(), its
            Console (logging to RUN_DIR/logs/launcher.log): job lines, its own notes, then the restart
            loop's line
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

EXIT_CODE = 7


def rank() -> None:
    from launcher.common.io import write_line

    write_line("a rank's line after the close")
    signal.signal(signal.SIGUSR1, lambda *_: write_line("stop requested (SIGUSR1): a line from a signal handler"))
    os.kill(os.getpid(), signal.SIGUSR1)
    print("a print() after the close", flush=True)
    print("an unflushed print", end="")
    sys.stdout.write("x" * 10000 + "\n")
    print("to stderr", file=sys.stderr)


def launcher(run_dir: Path) -> None:
    from launcher.commands.pretrain import say
    from launcher.launch.console import Console
    from launcher.run_dir.layout import RunDir

    console = Console(sys.stdout, RunDir(run_dir).launcher_log, status=False)
    console.job_line("a job line after the close\n")
    console.note("roformer pretrain: a note after the close")
    console.close()
    say(SimpleNamespace(run_dir=run_dir), "roformer pretrain: the restart loop's line")


if __name__ == "__main__":
    mode, path = sys.argv[1:3]
    if mode == "rank":
        from launcher.common.io import keep_console

        keep_console(None if path == "-" else Path(path))
        sys.stdin.read()
        rank()
    else:  # `roformer pretrain` sets no console log: its Console logs every line itself
        from launcher.common.io import keep_console

        keep_console()
        sys.stdin.read()
        print("roformer pretrain: note: a note by print()", file=sys.stderr, flush=True)
        launcher(Path(path))
    sys.exit(EXIT_CODE)
