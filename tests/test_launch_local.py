"""`roformer pretrain --num_gpus 2` on this machine (the demo's command) with the real trainer."""
from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, TINY_TOTAL_STEPS, free_port, metrics_steps, roformer, roformer_env, tiny_run_config

pytestmark = pytest.mark.multiprocess


def test_local_two_rank_run_through_the_wrapper(tiny_data, tmp_path):
    config = tiny_run_config(tmp_path / "config", tiny_data)
    run_dir = tmp_path / "run"
    result = roformer("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                      "--run-dir", str(run_dir), env=roformer_env(ROFORMER_PROBE="seen"), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "-m deepspeed.launcher.runner --hostfile /dev/null --num_gpus 2" in output
    assert json.loads((run_dir / "stages.json").read_text())["world_size"] == 2
    assert metrics_steps(run_dir) == list(range(TINY_TOTAL_STEPS))
    forwarded = dict(line.split("=", 1) for line in (run_dir / ".deepspeed_env").read_text().splitlines())
    assert forwarded["DS_ACCELERATOR"] == "cpu" and forwarded["ROFORMER_PROBE"] == "seen"
    assert forwarded["PYTHONPATH"].split(":")[0] == str(REPO)
    assert int(forwarded["OMP_NUM_THREADS"]) >= 1
