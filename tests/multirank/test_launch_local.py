"""`roformer pretrain --num_gpus 2` on this machine (the demo's command) with the real trainer."""
from __future__ import annotations

import json
import re
import signal
import time

from launcher.common.defaults import DEFAULT_MASTER_PORT
from launcher.launch.ports import AUTO_PORT_SPAN
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import read_metrics
from tests.support.helpers import newest_checkpoint, REPO, TINY_TOTAL_STEPS, events, free_port, metrics_steps, \
    roformer, roformer_env, start_roformer, tiny_run_config


def test_local_two_rank_run_through_the_wrapper(tiny_data, tmp_path):
    """The demo's command (no --master_port) with its output to pipes (as in a log file or CI): the console has each
    event once, from rank 0 only, and none of DeepSpeed's launcher lines that do not apply; the run's
    log file (RUN_DIR/logs/launcher.log) has everything."""
    config = tiny_run_config(tmp_path / "config", tiny_data, logging={"progress_every": 4})
    run_dir = tmp_path / "run"
    # No --master_port, as the demo: the job claims a port from 29500 up (launcher/launch/ports.py).
    result = roformer("pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(run_dir),
                      env=roformer_env(ROFORMER_PROBE="seen"), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    log = (run_dir / "logs" / "launcher.log").read_text()
    launched = r"-m launcher[.]launch[.]deepspeed_processes launch --world_info=\S+ --master_addr=127[.]0[.]0[.]1 "
    assert re.search(launched, log)
    port = int(re.search(r"--master_port=(\d+) ", log).group(1))
    assert DEFAULT_MASTER_PORT <= port < DEFAULT_MASTER_PORT + AUTO_PORT_SPAN, port
    for hidden in ("Setting CUDA_VISIBLE_DEVICES", "[INFO] [launch.py", "built successfully"):
        assert hidden not in output, hidden
    assert "Setting CUDA_VISIBLE_DEVICES=0,1" in log
    assert "\r" not in output and "[roformer-progress]" not in output  # nothing redrawn in a pipe
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)), "repeated lines:\n" + "\n".join(l for l in lines if lines.count(l) > 1)
    # Plain progress lines every 4 steps (logging.progress_every), one per step they report.
    progress = [int(m) for m in re.findall(r"^step (\d+)/16 \(\d+%\) \| ", output, flags=re.M)]
    assert progress == [4, 8, 12, 16], output
    # One line per event, numbered as the records are: steps completed.
    valid = [r["step"] for r in read_metrics(run_dir, "valid")]
    assert [int(m) for m in re.findall(r"^validation at step (\d+): loss", output, flags=re.M)] == valid
    starts = re.findall(r"^stage (\d)/3 '(\w+)' after step (\d+) \(steps (\d+)-(\d+)\)", output, flags=re.M)
    assert starts == [("1", "short", "0", "1", "6"), ("2", "long", "6", "7", "10"), ("3", "wide", "10", "11", "16")]
    assert [e["step"] for e in events(run_dir, "stage_start")] == [0, 6, 10]
    assert output.count(f"finished at step {TINY_TOTAL_STEPS};") == 1
    assert not RunDir(run_dir).restarts.exists()  # restarts.json only where a restart happened
    assert json.loads((run_dir / "stages.json").read_text())["world_size"] == 2
    assert metrics_steps(run_dir) == list(range(1, TINY_TOTAL_STEPS + 1))
    forwarded = dict(line.split("=", 1) for line in (run_dir / ".deepspeed_env").read_text().splitlines())
    assert forwarded["DS_ACCELERATOR"] == "cpu" and forwarded["ROFORMER_PROBE"] == "seen"
    assert forwarded["PYTHONPATH"].split(":")[0] == str(REPO)
    assert int(forwarded["OMP_NUM_THREADS"]) >= 1
    # Not forwarded: each rank computes its own environment's op cache (launcher/train/rank_entry.py).
    assert "TORCH_EXTENSIONS_DIR" not in forwarded


def test_ctrl_c_names_the_signal_stops_cleanly_and_says_how_to_resume(tiny_data, tmp_path):
    """Ctrl-C reaches `roformer pretrain` (the terminal's foreground process; DeepSpeed's runner runs
    in its own session): the ranks checkpoint, nothing reads as an error, exit code 130."""
    config = tiny_run_config(tmp_path / "config", tiny_data)
    run_dir, log = tmp_path / "run", tmp_path / "pretrain.out"
    proc = start_roformer("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                          "--run-dir", str(run_dir), env=roformer_env(), log=log)
    try:
        deadline = time.monotonic() + 240
        while max(metrics_steps(run_dir), default=0) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=240) == 128 + signal.SIGINT, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    point = newest_checkpoint(run_dir)
    assert point is not None and 3 <= point.sidecar.step < TINY_TOTAL_STEPS
    assert "roformer pretrain: Ctrl-C (SIGINT) received: the ranks finish their step, write a checkpoint" in output
    assert re.search(r"^stop requested \(SIGTERM\): finishing step \d+, then a checkpoint \(within [\d.]+ s\)$", output, flags=re.M)
    assert output.rstrip().splitlines()[-1] == (
        f"roformer pretrain: stopped by Ctrl-C (SIGINT); the newest complete checkpoint is {point.tag}: run the "
        "same command again to resume from it")
    assert "error" not in output.lower() and "Traceback" not in output, output
    assert "exits with return code = 143" in (run_dir / "logs" / "launcher.log").read_text()  # kept in the log
