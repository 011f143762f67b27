"""Part (b) of `roformer gpu-check`: the real commands on all local GPUs, as a user runs them.

`roformer data prepare` of a slice of the English corpus; `roformer pretrain --num_gpus N` of a tiny
two-stage fp16 ZeRO-2 run whose initial loss scale (2^24) makes the first steps overflow (skipped,
counted, the scale halved); the same run stopped by SIGTERM and resumed, matching the uninterrupted run
step by step; `roformer export` loaded by transformers. Output in WORK/*.log.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from launcher.gpu_check.check_report import Check, overflow_check, resume_checks

REPO = Path(__file__).resolve().parents[2]
STAGES = ({"name": "short", "max_seq_len": 64, "steps": 240}, {"name": "long", "max_seq_len": 128, "steps": 80})
STOP_AFTER_STEP = 40  # SIGTERM once the run has logged this step: well inside the first stage
VOCAB_SIZE = 1000


class CommandFailed(Exception):
    """A command of the check failed; the message names it and ends with its output's last lines."""


def roformer(args: list[str], log: Path, env: dict[str, str], timeout: float = 1800) -> int:
    """Run `python -m launcher.cli ARGS` to the end, output to `log`; its exit code."""
    with log.open("a", encoding="utf-8") as out:
        return subprocess.run([sys.executable, "-m", "launcher.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                              cwd=REPO, env=env, timeout=timeout, stdin=subprocess.DEVNULL).returncode


def expect(code: int, wanted: int, what: str, log: Path) -> None:
    if code != wanted:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise CommandFailed(f"{what}: exit {code} (expected {wanted}); last lines of {log}:\n{tail}")


def cuda_environment() -> dict[str, str]:
    """This environment, with DeepSpeed choosing CUDA (the Makefile exports DS_ACCELERATOR=cpu for tests)."""
    return {**os.environ, "DS_ACCELERATOR": "cuda", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def write_config(work: Path, data_dir: Path, gpus: int) -> Path:
    schedule = [{**stage, "global_batch_size": per_gpu * gpus}
                for stage, per_gpu in zip(STAGES, (8, 4))]
    (work / "schedule.yaml").write_text(yaml.safe_dump({"stages": schedule}, sort_keys=False))
    config = {
        "seed": 7,
        "model": {"vocab_size": VOCAB_SIZE, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 512, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
        "data": {"data_dir": str(data_dir)},
        "optimizer": {"lr": 5e-4, "warmup_steps": 20},
        "schedule": {"file": str(work / "schedule.yaml"), "max_tokens_per_micro_batch": 512},
        "checkpoint": {"every_steps": 100, "keep_last": 3},
        "logging": {"valid_batches": 1, "progress_bar": False},
        "deepspeed": {"config": str(REPO / "ds_configs" / "v100_fp16_zero2.json"),
                      "overrides": {"fp16": {"initial_scale_power": 24, "hysteresis": 1}}},
    }
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def train_records(run_dir: Path) -> tuple[list[dict], list[dict], int | None]:
    """(train rows, train rows after the last resume, the step it resumed from) of RUN_DIR/metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    resumes = [i for i, row in enumerate(rows) if row.get("kind") == "event" and row.get("event") == "resume"]
    train = [row for row in rows if row.get("kind") == "train"]
    if not resumes:
        return train, [], None
    after = [row for row in rows[resumes[-1]:] if row.get("kind") == "train"]
    return train, after, int(rows[resumes[-1]]["step"])


def stop_after(config: Path, run_dir: Path, gpus: int, step: int, log: Path, env: dict[str, str],
               timeout: float = 1800) -> int:
    """Start the run, SIGTERM `roformer pretrain` once metrics.jsonl shows `step`; its exit code."""
    with log.open("a", encoding="utf-8") as out:
        process = subprocess.Popen([sys.executable, "-m", "launcher.cli", "pretrain", "--num_gpus", str(gpus),
                                    "--config", str(config), "--run-dir", str(run_dir)], stdout=out,
                                   stderr=subprocess.STDOUT, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        metrics = run_dir / "metrics.jsonl"
        while process.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and any(json.loads(line).get("kind") == "train" and json.loads(line)["step"] >= step
                                        for line in metrics.read_text().splitlines() if line.strip()):
                process.send_signal(signal.SIGTERM)
                break
            time.sleep(0.1)
        try:
            return process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


def check_pretraining(work: Path, gpus: int) -> list[Check]:
    work.mkdir(parents=True, exist_ok=True)
    env = cuda_environment()
    data = work / "data"
    if not (data / "manifest.json").is_file():
        log = work / "data.log"
        expect(roformer(["data", "prepare", "--default-corpus", "en", "--max-documents", "400", "--vocab-size",
                         str(VOCAB_SIZE), "--out", str(data), "--overwrite"], log, env), 0, "roformer data prepare", log)
    config = write_config(work, data, gpus)
    whole, stopped = work / "uninterrupted", work / "stopped"
    for run_dir in (whole, stopped):  # every check starts from nothing
        subprocess.run(["rm", "-rf", "--", str(run_dir)], check=True)
    log = work / "uninterrupted.log"
    expect(roformer(["pretrain", "--num_gpus", str(gpus), "--config", str(config), "--run-dir", str(whole)], log, env),
           0, "roformer pretrain (uninterrupted)", log)
    log = work / "stopped.log"
    expect(stop_after(config, stopped, gpus, STOP_AFTER_STEP, log, env), 143, "roformer pretrain stopped by SIGTERM", log)
    expect(roformer(["pretrain", "--num_gpus", str(gpus), "--config", str(config), "--run-dir", str(stopped)], log,
                    env), 0, "roformer pretrain (resume)", log)
    records, _, _ = train_records(whole)
    _, resumed, stop_step = train_records(stopped)
    checks = [overflow_check(records)]
    checks += resume_checks(records, resumed, stop_step if stop_step is not None else -1)
    checks.append(check_export(whole, work / "export", env))
    return checks


def check_export(run_dir: Path, out: Path, env: dict[str, str]) -> Check:
    import torch
    import transformers

    log = out.parent / "export.log"
    subprocess.run(["rm", "-rf", "--", str(out)], check=True)
    expect(roformer(["export", str(run_dir), "--out", str(out)], log, env), 0, "roformer export", log)
    model = transformers.RoFormerForMaskedLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        logits = model(**tokenizer(["The kernel schedules tasks."], return_tensors="pt")).logits
    return Check("pretraining", "export loaded by transformers (finite logits)", bool(torch.isfinite(logits).all()),
                 None, "", f"logits {tuple(logits.shape)}")
