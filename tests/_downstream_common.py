"""Shared builders of the export / eval / fine-tune tests (no tests here).

Real parts only: a prepared data dir (data_pipeline, real SentencePiece on linux-doc text, shared
with the data tests through tests.test_data_common), real 2-rank DeepSpeed runs of our model under
ZeRO-2 and ZeRO-3 (tests/_make_zero_checkpoint.py), a universal-checkpoint 2 -> 1 rank resume, and
exports of them. Everything is built once per pytest process and shared by the test modules.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.test_data_common import prepared_dir

REPO = Path(__file__).resolve().parents[1]
HELPER = "tests._make_zero_checkpoint"
TRAIN_SEQ_LEN = 32
# Enough steps that the weights move far from their init (the tiny model stays near a unigram
# guess: its quality is not under test here, the export of it is).
STEPS = {2: 60, 3: 30}
RESUME_STEPS = 5
_CACHE: dict[str, Path] = {}


def data_dir(tmp_path_factory) -> Path:
    return prepared_dir(tmp_path_factory)


def ds_env() -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/roformer-ds/torch_extensions"))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_ranks: int, args: list[str], log: Path, timeout: float = 240) -> None:
    """DeepSpeed's per-node launcher, started directly: its process group is ours to stop, and the
    runner's machine-wide pkill on SIGTERM is never involved."""
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "--module", HELPER, *args]
    with open(log, "ab") as handle:
        proc = subprocess.Popen(cmd, cwd=REPO, env=ds_env(), stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            raise
    if rc != 0:
        raise RuntimeError(f"DeepSpeed run failed (rc {rc}); log {log}:\n{log.read_text()[-3000:]}")


def zero_run(tmp_path_factory, stage: int) -> Path:
    """Run dir of a 2-rank ZeRO-`stage` run of STEPS[stage] steps (tag step<N>) on real packed MLM batches."""
    key = f"zero{stage}"
    if key not in _CACHE:
        run_dir = tmp_path_factory.mktemp(f"run_zero{stage}")
        launch(2, ["--run-dir", str(run_dir), "--zero-stage", str(stage), "--data-dir", str(data_dir(tmp_path_factory)),
                   "--steps", str(STEPS[stage]), "--seq-len", str(TRAIN_SEQ_LEN)], run_dir.parent / f"{run_dir.name}.log")
        _CACHE[key] = run_dir
    return _CACHE[key]


def resumed_run(tmp_path_factory) -> Path:
    """The ZeRO-2 2-rank checkpoint converted to a universal checkpoint and resumed on ONE rank for
    RESUME_STEPS more steps (DeepSpeed refuses a plain ZeRO checkpoint at another data-parallel size)."""
    if "resumed" not in _CACHE:
        source = zero_run(tmp_path_factory, 2)
        run_dir = tmp_path_factory.mktemp("run_resumed")
        tag = f"step{STEPS[2]}"
        universal = run_dir / "universal" / tag
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", str(source / "checkpoints" / tag), "--output_folder", str(universal),
                        "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                       cwd=REPO, env=ds_env(), check=True, capture_output=True)
        launch(1, ["--run-dir", str(run_dir), "--zero-stage", "2", "--data-dir", str(data_dir(tmp_path_factory)),
                   "--steps", str(RESUME_STEPS), "--seq-len", str(TRAIN_SEQ_LEN), "--load-universal", str(universal)],
               run_dir.parent / f"{run_dir.name}.log")
        _CACHE["resumed"] = run_dir
    return _CACHE["resumed"]


def exported(tmp_path_factory, stage: int = 2) -> Path:
    """A pristine export of the ZeRO-`stage` run (tests that damage files copy it first)."""
    key = f"export{stage}"
    if key not in _CACHE:
        from launcher.downstream.export import export_checkpoint

        out = tmp_path_factory.mktemp(f"export_parent{stage}") / "export"
        export_checkpoint(zero_run(tmp_path_factory, stage), out)
        _CACHE[key] = out
    return _CACHE[key]


def hf_isolated_logits(export_dirs: list[Path], texts: list[str], work: Path) -> list[dict]:
    """Tokenizer ids + MLM logits from transformers alone, in ONE process with project imports blocked."""
    from safetensors.torch import load_file

    (work / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "_hf_isolated.py"), str(work / "texts.json"),
                           str(work), *map(str, export_dirs)], cwd=work, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    infos = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(infos) == len(export_dirs), proc.stdout
    return [{**load_file(str(work / f"hf_out_{i}.safetensors")), "info": info} for i, info in enumerate(infos)]
