"""A pytest plugin for tests/unit/test_signals_restored.py (`-p tests.support.stop_probe`): once the tests given
have run, the lane waits as a long test would, after writing the SIGTERM handler it has then to the file named by
ROFORMER_STOP_PROBE_READY; the test sends SIGTERM and expects the lane to end."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

WAIT_SECONDS = 300


def pytest_runtest_logfinish(nodeid, location) -> None:
    ready = Path(os.environ["ROFORMER_STOP_PROBE_READY"])
    ready.write_text(repr(signal.getsignal(signal.SIGTERM)))
    time.sleep(WAIT_SECONDS)
