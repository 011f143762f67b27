"""Start-up cost of the data checks on a corpus of >= 1 GB, before and after "hash once" (issue 12, 5).

    DS_ACCELERATOR=cpu .venv/bin/python bench/startup.py [--gib 1.0] [--corpus DIR]
        [--before SRC]   # a checkout of the previous main, e.g. `git archive <rev> | tar -x -C SRC`
        [--rounds 2]

The corpus: a real prepared directory (SentencePiece on linux-doc text, `data_pipeline.prepare`)
whose train split is then grown with synthetic shards (random ids of that tokenizer, written by
the pipeline's own ShardWriter, hashed into the manifest as prepare does) to --gib GiB of shards.
Real tokenization of 1 GB would take hours on this machine and is irrelevant to what is measured.

Measured, for each code (`before` = --before, `after` = this checkout) and data state:
  open_corpus   one process running what one rank runs: open_corpus(train) + open_corpus(valid)
                with verify=True (the default of data.verify), seconds; before, every rank pays it
  startup       a real 2-rank `launcher.train.rank_entry` start under DeepSpeed's launcher (one
                training step): rank 0's `startup` event of metrics.jsonl (phases: checks_and_data,
                init_distributed = waiting for the slowest rank, ...)
Data states: "prepared" (shard mtimes as recorded in the manifest) and "copied" (every mtime moved:
a copy without times, or a manifest from before they were recorded; rank 0 then hashes everything).
Plus checksum throughput (sha256 / blake2b / crc32) over the corpus' largest file, for the choice
of sha256 for checkpoint files. Page cache warm (the corpus fits in RAM); the machine's load is
recorded with the figures. Writes bench/results/startup.json.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

SHARD_TOKENS = 32 * 2**20  # 64 MB of uint16 ids per synthetic shard
RANK_ENTRY = "launcher.train.rank_entry"


def build_corpus(directory: Path, gib: float) -> dict:
    """A prepared directory grown to `gib` GiB of shard bytes (kept between runs)."""
    from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig, TokenizerConfig
    from data_pipeline.prepare import prepare
    from data_pipeline.manifest import file_sha256, read_manifest, write_manifest
    from data_pipeline.shards import ShardWriter, token_dtype
    from data_pipeline.sources import default_corpus_files

    if not (directory / "manifest.json").is_file():
        data_cache = Path(os.environ.get("ROFORMER_DATA_DIR", Path.home() / ".cache/roformer-ds/data"))
        files = default_corpus_files(data_cache, languages=("en",))[:1]  # set-up step's corpus
        prepare(PrepareConfig(input=InputConfig(inputs=[str(p) for p in files]), out_dir=directory,
                              tokenizer=TokenizerConfig(vocab_size=2000), workers=1,
                              cleaning=CleaningConfig(valid_fraction=0.02)), log=lambda m: None)
    manifest = read_manifest(directory)
    train = manifest["splits"]["train"]
    vocab = manifest["tokenizer"]["vocab_size"]
    dtype = token_dtype(vocab)
    have = sum(p.stat().st_size for split in ("train", "valid") for p in (directory / split).iterdir())
    if have < gib * 2**30:
        rng = np.random.default_rng(0)
        # A stem no earlier growth used: ShardWriter numbers its shards <stem>_000, <stem>_001, ...
        writer = ShardWriter(directory / "train", f"synthetic{len(train['shards']):05d}", dtype, SHARD_TOKENS)
        while have < gib * 2**30:
            lengths = rng.integers(200, 2000, size=4096)
            ids = rng.integers(5, vocab, size=int(lengths.sum()), dtype=dtype)
            for doc in np.split(ids, np.cumsum(lengths)[:-1]):
                writer.add(doc)
            have += ids.nbytes
        for entry in writer.close():
            base = directory / "train" / entry["name"]
            entry["bin_sha256"] = file_sha256(base.with_suffix(".bin"))
            entry["idx_sha256"] = file_sha256(base.with_suffix(".idx"))
            train["shards"].append(entry)
        train["documents"] = sum(s["documents"] for s in train["shards"])
        train["tokens"] = sum(s["tokens"] for s in train["shards"])
        write_manifest(directory, manifest)
    files = [p for split in ("train", "valid") for p in (directory / split).iterdir()]
    return {"path": str(directory), "shard_bytes": sum(p.stat().st_size for p in files),
            "shards": len(files) // 2, "train_tokens": train["tokens"], "vocab_size": vocab,
            "note": "real tokenizer + real shards of linux-doc text, grown with synthetic ids of that tokenizer"}


def set_data_state(directory: Path, state: str) -> None:
    """'prepared': every shard's mtime as its manifest entry records it; 'copied': all moved."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for split, info in manifest["splits"].items():
        for entry in info["shards"]:
            for ext in ("bin", "idx"):
                path = directory / split / f"{entry['name']}.{ext}"
                recorded = entry.get(f"{ext}_mtime_ns", path.stat().st_mtime_ns)
                mtime = recorded if state == "prepared" else recorded + 10**9
                os.utime(path, ns=(path.stat().st_atime_ns, mtime))


def code_env(src: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(src), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")


def time_open_corpus(src: Path, directory: Path) -> float:
    """Seconds for what one rank runs on the data, in a fresh process of the code at `src`."""
    script = ("import sys, time; from data_pipeline import open_corpus; t = time.perf_counter(); "
              f"[open_corpus({str(directory)!r}, split=s, verify=True) for s in ('train', 'valid')]; "
              "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", script], cwd=src, env=code_env(src), capture_output=True,
                         text=True, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 3)


def time_rank_startup(src: Path, directory: Path, work: Path, vocab: int) -> dict:
    """Rank 0's `startup` event of a real 2-rank start (one step) with the code at `src`."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    schedule = work / "schedule.yaml"
    schedule.write_text(yaml.safe_dump({"stages": [{"name": "one", "max_seq_len": 32, "global_batch_size": 8,
                                                    "steps": 1}]}))
    config = work / "run.yaml"
    config.write_text(yaml.safe_dump({
        "seed": 1, "data": {"data_dir": str(directory), "seed": 1},
        "model": {"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "intermediate_size": 64},
        "optimizer": {"lr": 1e-3, "warmup_steps": 0},
        "schedule": {"file": str(schedule), "max_tokens_per_micro_batch": 256},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "logging": {"log_every": 1, "valid_every": 0, "valid_batches": 1, "progress_bar": False},
        "deepspeed": {"config": str(src / "ds_configs" / "cpu_fp32_zero2.json")}}, sort_keys=False))
    run_dir = work / f"run-{time.time_ns()}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--node_rank=0",
           "--master_addr=127.0.0.1", f"--master_port={port}", "--module", RANK_ENTRY,
           "--config", str(config), "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=src, env=code_env(src), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"rank start-up failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    event = next(r for r in records if r.get("event") == "startup")
    return {"seconds": round(event["seconds"], 3), "phases": event["phases"]}


def summarize(results: list[dict]) -> dict:
    """Medians per (code, data state); bytes each rank hashes at start-up in a 2-rank run."""
    summary = {}
    for code in ("before", "after"):
        for state in ("prepared", "copied"):
            rows = [r for r in results if r["code"] == code and r["data"] == state]
            if rows:
                summary[f"{code}/{state}"] = {
                    "open_corpus_s": statistics.median(r["open_corpus_s"] for r in rows),
                    "rank0_checks_and_data_s": statistics.median(r["rank_startup"]["phases"]["checks_and_data"]
                                                                 for r in rows),
                    "rank0_startup_s": statistics.median(r["rank_startup"]["seconds"] for r in rows),
                    "ranks_hashing_the_corpus": {"before": "every rank", "after": {"prepared": "none",
                                                                                  "copied": "rank 0"}[state]}[code]}
    return summary


def checksum_rates(path: Path) -> dict:
    """MB/s of each checksum over one file (read from the page cache)."""
    data = path.read_bytes()
    rates = {}
    for name, run in (("sha256", lambda: hashlib.sha256(data).digest()),
                      ("blake2b", lambda: hashlib.blake2b(data).digest()),
                      ("crc32", lambda: zlib.crc32(data))):
        start = time.perf_counter()
        run()
        rates[name] = round(len(data) / 1e6 / (time.perf_counter() - start), 1)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="shard bytes of the corpus, in GiB")
    parser.add_argument("--corpus", type=Path, default=Path.home() / ".cache/roformer-ds/bench/startup_corpus")
    parser.add_argument("--before", type=Path, default=None, help="source tree of the previous main")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/roformer-bench-startup"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "startup.json")
    args = parser.parse_args()

    corpus = build_corpus(args.corpus, args.gib)
    codes = [("after", REPO)] + ([("before", args.before.resolve())] if args.before else [])
    results = []
    for state in ("prepared", "copied"):
        set_data_state(args.corpus, state)
        for round_ in range(args.rounds):
            for label, src in codes:  # alternating: shared load hits both alike
                row = {"code": label, "data": state, "round": round_, "load_avg_1m": os.getloadavg()[0],
                       "open_corpus_s": time_open_corpus(src, args.corpus)}
                row["rank_startup"] = time_rank_startup(src, args.corpus, args.work / label, corpus["vocab_size"])
                print(json.dumps(row), flush=True)
                results.append(row)
    set_data_state(args.corpus, "prepared")
    largest = max((args.corpus / "train").glob("*.bin"), key=lambda p: p.stat().st_size)
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "note": "2 cores shared with other jobs; load_avg_1m recorded per row"},
              "corpus": corpus, "summary": summarize(results), "runs": results,
              "checksum_MB_per_s": checksum_rates(largest), "checksum_file_bytes": largest.stat().st_size}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
