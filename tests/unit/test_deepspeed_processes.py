"""DeepSpeed's per-node launcher as `roformer pretrain` runs it (launcher/launch/deepspeed_processes.py): it looks at
its ranks every LAUNCH_LOOK_SECONDS, not every second (DeepSpeed's sleep after each look, the last included, ended
every job up to 2 s after its ranks), and it ends as sys.exit would, without the interpreter's finalization
(launcher/common/process_exit.py, which the ranks' end uses too)."""
from __future__ import annotations

import subprocess
import sys
import time

from launcher.launch import deepspeed_processes
from tests.support.helpers import REPO, roformer_env


def test_deepspeeds_launcher_sleeps_at_most_the_look_interval_and_keeps_the_rest_of_time(monkeypatch):
    main = deepspeed_processes.deepspeed_main("launch")
    launch = sys.modules[deepspeed_processes.MODULES["launch"]]
    assert main is launch.main
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    launch.time.sleep(1)  # what its loop over the ranks does after every look
    launch.time.sleep(0.05)
    assert slept == [deepspeed_processes.LAUNCH_LOOK_SECONDS, 0.05]
    assert launch.time.strftime is time.strftime and launch.time.localtime is time.localtime  # its log file names


def test_the_runner_keeps_its_own_clock():
    deepspeed_processes.deepspeed_main("runner")
    assert sys.modules[deepspeed_processes.MODULES["runner"]].time is time


ENDS = """
import atexit, sys
from launcher.common.process_exit import exit_without_finalizing

atexit.register(lambda: print("atexit ran", flush=True))
class Finalized:
    def __del__(self):
        print("finalized", flush=True)
kept = Finalized()  # a module global: collected only by the interpreter's finalization
print("partial line", end="")
exit_without_finalizing(lambda: sys.exit({code}))
"""


def test_the_launcher_process_ends_with_its_code_and_atexit_handlers_without_finalizing():
    for code, expected in (("3", 3), ("None", 0), ("'error text'", 1)):
        result = subprocess.run([sys.executable, "-c", ENDS.format(code=code)], cwd=REPO, env=roformer_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expected, result.stderr
        assert result.stdout == "partial lineatexit ran\n", result.stdout  # flushed; no finalizer ran
        assert ("error text" in result.stderr) == (expected == 1), result.stderr
