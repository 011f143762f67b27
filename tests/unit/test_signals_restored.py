"""A test that runs a rank entry in this process (rank_entry.main) installs the rank's stop handlers, which only
record SIGTERM / SIGINT for the trainer; tests/conftest.py's autouse `restored_signal_handlers` puts pytest's back,
so a stop of the lane (run_tests.sh's `kill -TERM`, Ctrl-C) still ends it after such a test."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.helpers import REPO

RANK_ENTRY_TEST = ("tests/unit/test_old_run_dir.py::"
                   "test_stored_data_position_is_refused_before_any_compute")  # rank_entry.main in-process


def test_a_sigterm_still_ends_the_lane_after_a_rank_entry_ran_in_process(tmp_path):
    ready = tmp_path / "ready"
    lane = subprocess.Popen([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p",
                             "tests.support.stop_probe", "--basetemp", str(tmp_path / "base"), RANK_ENTRY_TEST],
                            cwd=REPO, env={**os.environ, "ROFORMER_STOP_PROBE_READY": str(ready)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not ready.exists() and lane.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lane.poll() is None, lane.communicate()[0]  # waiting in the probe, after the rank entry's test
        time.sleep(0.2)  # the handler's name is written
        os.kill(lane.pid, signal.SIGTERM)
        out, _ = lane.communicate(timeout=60)
    finally:
        if lane.poll() is None:
            os.killpg(lane.pid, signal.SIGKILL)
            lane.wait()
    assert "test_stored_data_position_is_refused_before_any_compute PASSED" in out, out
    assert ready.read_text() == repr(signal.SIG_DFL)  # pytest's own (the default), not the rank's recorder
    assert lane.returncode == -signal.SIGTERM, out  # ended by the signal, at once
