"""Data pipeline speed: corpus preparation rate, batch production rate with memory over time, mixing.

    HF_DATASETS_OFFLINE=1 .venv/bin/python bench/data_pipeline.py [--data-cache DIR]
        [--baseline-src DIR]   # e.g. `git archive <rev> data_pipeline | tar -x -C DIR`: A/B against it
        [--data-dir DIR]       # reuse a prepared en+zh directory instead of preparing (no prepare figures)

Uses the bundled default corpus (set-up step; installed on demand). Writes bench/results/data.json:
  prepare   full English linux-doc set (+ the Chinese set) with --workers 1 and 2: MB/s, phase times,
            and the rate extrapolated to the paper's ~34 GB corpus
  batches   tokens/s of next_batch at the demo shape (seq 128 x 16) and a long-sequence shape, RSS
            (anonymous and file-backed) sampled while streaming several epochs; each shape measured
            in fresh processes, alternating with the baseline reader when one is given (shared load
            hits both alike), median of the rounds
  mixing    English/Chinese token share of each of the first global batches against the corpus share
  scale     a synthetic split of 10^7 documents (the reference scale): open, first batch (builds the
            epoch order), seek to a far step, tokens/s, anonymous RSS
  model     fwd+bwd time of the default demo model at seq 128 x 16, as the rate batches must beat 10x
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A worker process measuring a baseline reader imports `data_pipeline` from that copy instead.
sys.path.insert(0, os.environ.get("BENCH_DATA_PIPELINE_SRC") or str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402

from data_pipeline import MaskingConfig, PretrainBatches, open_corpus  # noqa: E402
from data_pipeline.config import InputConfig, PrepareConfig, TokenizerConfig  # noqa: E402
from data_pipeline.prepare import prepare  # noqa: E402
from data_pipeline.worker_pool import progress_counter, worker_init  # noqa: E402
from data_pipeline.sources import corpus_dir, default_corpus_files, install_corpus_sources  # noqa: E402

PAPER_CORPUS_BYTES = 34e9
DEMO_MODEL = dict(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=1024)


def memory_mb() -> dict:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile", "VmHWM")):
                key, value = line.split(":")
                fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def worker_startup_seconds() -> float:
    """Time for a fresh spawned worker to import `datasets` and open its first file: a fixed cost
    per worker (paid once per `prepare`, in parallel), which small corpora cannot amortize."""
    import multiprocessing

    start = time.perf_counter()
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=worker_init, initargs=(progress_counter(),))
    try:
        pool.apply(_open_tiny_dataset)
    finally:
        pool.close()
        pool.join()
    return round(time.perf_counter() - start, 2)


def _open_tiny_dataset() -> None:
    from data_pipeline.config import InputConfig
    from data_pipeline.inputs import _stream_with_datasets

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "one.jsonl"
        path.write_text('{"text": "hello"}\n')
        list(_stream_with_datasets(path, "jsonl", InputConfig(inputs=[str(path)])))


def bench_prepare(files: list[Path], workers: int, workdir: Path, languages: str) -> dict:
    out = workdir / f"prepared-{languages}-w{workers}"
    cfg = PrepareConfig(input=InputConfig(inputs=[str(p) for p in files]), out_dir=out,
                        tokenizer=TokenizerConfig(vocab_size=8000), workers=workers, overwrite=True)
    report = prepare(cfg, log=lambda msg: None)
    s = report.stats
    mb = s["input_bytes"] / 1e6
    # Scan + tokenize grow with the corpus; tokenizer training (bounded sample) does not, so it is
    # left out of the extrapolation. The one-off worker start-up stays in: conservative.
    streaming_s = s["scan_seconds"] + s["tokenize_seconds"]
    rate = mb / streaming_s
    cpu_per_mb = (s["scan_cpu_seconds"] + s["tokenize_cpu_seconds"]) / mb
    return {"corpus": languages, "workers": workers, "input_mb": round(mb, 2), "files": s["input_files"],
            "documents": s["documents_read"], "train_tokens": s["train_tokens"],
            "total_seconds": round(report.seconds, 2), "scan_seconds": s["scan_seconds"],
            "tokenizer_seconds": s["tokenizer_seconds"], "tokenize_seconds": s["tokenize_seconds"],
            "mb_per_s_end_to_end": round(mb / report.seconds, 2),
            "mb_per_s_streaming_passes": round(rate, 2),
            "extrapolated_34GB_hours": round(PAPER_CORPUS_BYTES / 1e6 / rate / 3600, 1),
            # CPU time in the workers per MB: what the corpus costs on dedicated cores, whatever else runs.
            "worker_cpu_seconds_per_mb": round(cpu_per_mb, 3),
            "extrapolated_34GB_hours_on_2_dedicated_cores": round(PAPER_CORPUS_BYTES / 1e6 * cpu_per_mb / 2 / 3600, 1),
            "data_dir": str(out)}


def bench_batches(data_dir: Path, seq_len: int, micro_batch: int, whole_word: bool, seconds: float) -> dict:
    corpus = open_corpus(data_dir, "train")
    reader = PretrainBatches(corpus, rank=0, world_size=1, seed=0, masking=MaskingConfig(whole_word=whole_word))
    timeline, tokens, batches = [], 0, 0
    start, cpu_start = time.perf_counter(), time.process_time()
    next_sample = 0.0
    while (elapsed := time.perf_counter() - start) < seconds:
        b = reader.next_batch(seq_len, micro_batch)
        tokens += b["input_ids"].numel()
        batches += 1
        if elapsed >= next_sample:
            timeline.append({"t_s": round(elapsed, 2), "epoch": reader.epoch, **memory_mb()})
            next_sample += seconds / 10
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    anon = [p["RssAnon"] for p in timeline[1:]]
    # CPU seconds hide most of what other jobs on a shared machine do to wall time.
    return {"seq_len": seq_len, "micro_batch": micro_batch, "whole_word": whole_word,
            "tokens_per_s": round(tokens / elapsed), "tokens_per_cpu_s": round(tokens / cpu),
            "batches": batches, "epochs_streamed": reader.epoch,
            "corpus_tokens": corpus.tokens, "rss_anon_growth_mb": round(max(anon) - min(anon), 1) if anon else 0.0,
            "rss_timeline": timeline}


def bench_mixing(data_dir: Path, seq_len: int, global_batch: int, steps: int) -> dict:
    """Chinese share of the tokens of each of the first `steps` global batches vs the corpus share."""
    corpus = open_corpus(data_dir, "train")
    is_zh, is_en = _script_tables(corpus)
    shard_zh = sum(int(is_zh[np.asarray(s.token_ids)].sum()) for s in corpus.shards)
    shard_en = sum(int(is_en[np.asarray(s.token_ids)].sum()) for s in corpus.shards)
    share = shard_zh / (shard_zh + shard_en)
    reader = PretrainBatches(corpus, rank=0, world_size=1, seed=0)
    shares = []
    for _ in range(steps):
        b = reader.next_batch(seq_len, global_batch)
        ids = np.where(b["labels"].numpy() != -100, b["labels"].numpy(), b["input_ids"].numpy())
        zh, en = int(is_zh[ids].sum()), int(is_en[ids].sum())
        shares.append(zh / max(zh + en, 1))
    deviation = np.abs(np.array(shares) - share)
    return {"seq_len": seq_len, "global_batch": global_batch, "steps": steps, "corpus_zh_share": round(share, 3),
            "mean_abs_deviation": round(float(deviation.mean()), 3),
            "worst_deviation": round(float(deviation.max()), 3),
            "steps_over_90pct_one_language": int(sum(x < 0.1 or x > 0.9 for x in shares)),
            "zh_share_first_20_steps": [round(x, 2) for x in shares[:20]]}


def _script_tables(corpus) -> tuple[np.ndarray, np.ndarray]:
    """(V,) bool: the piece holds a CJK ideograph / holds an ASCII letter (and no ideograph)."""
    from data_pipeline.tokenizer import load_sentencepiece

    sp = load_sentencepiece(corpus.data_dir / "tokenizer" / "spm.model")
    pieces = [sp.id_to_piece(i) for i in range(corpus.vocab_size)]
    zh = np.array([any("\u4e00" <= c <= "\u9fff" for c in p) for p in pieces])
    en = np.array([any(c.isascii() and c.isalpha() for c in p) for p in pieces]) & ~zh
    zh[:5] = en[:5] = False
    return zh, en


SCALE_DOCUMENTS = 10_000_000
SCALE_SHARDS = 40


def write_scale_corpus(directory: Path, documents: int = SCALE_DOCUMENTS, shards: int = SCALE_SHARDS) -> Path:
    """Synthetic shards of `documents` short documents (1-15 tokens): the reference document count."""
    rng = np.random.default_rng(0)
    entries = []
    for k, count in enumerate(np.diff(np.linspace(0, documents, shards + 1).astype(np.int64))):
        lengths = rng.integers(1, 16, size=count)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        name = f"shard_{k:05d}"
        rng.integers(5, 8000, size=int(offsets[-1]), dtype=np.uint16).tofile(directory / f"{name}.bin")
        offsets.tofile(directory / f"{name}.idx")
        entries.append({"name": name, "documents": int(count), "tokens": int(offsets[-1])})
    (directory / "shards.json").write_text(json.dumps(entries))
    return directory


def bench_scale(directory: Path, seconds: float) -> dict:
    """Open, first batch, far seek, rate and anonymous RSS of a reader over the synthetic split."""
    from data_pipeline.shards import Corpus, Shard

    entries = json.loads((directory / "shards.json").read_text())
    shards = [Shard(directory / e["name"], e["documents"], e["tokens"], np.dtype(np.uint16)) for e in entries]
    corpus = Corpus(directory, "train", shards, 8000, "synthetic", {})
    figures = {"documents": corpus.documents, "tokens": corpus.tokens, "rss_anon_mb_before": memory_mb()["RssAnon"]}
    start = time.perf_counter()
    reader = PretrainBatches(corpus, seed=0)
    figures["open_seconds"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    reader.next_batch(128, 16)
    figures["first_batch_seconds"] = round(time.perf_counter() - start, 2)
    state, sequences = reader.state_dict(), 10**8 + 7  # about epoch 12
    if "spans" in state:
        far = dict(state, spans=[[0, 127]], sequences_consumed=sequences, tokens_consumed=sequences * 128)
    else:  # format 1: a stream position
        far = dict(state, position=sequences * 127, sequences_consumed=sequences, tokens_consumed=sequences * 128)
    start = time.perf_counter()
    reader.load_state_dict(far)
    reader.next_batch(128, 16)
    figures["seek_far_and_batch_seconds"] = round(time.perf_counter() - start, 2)
    figures["epoch_after_seek"] = reader.epoch
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += reader.next_batch(128, 16)["input_ids"].numel()
    figures["tokens_per_s"] = round(tokens / (time.perf_counter() - start))
    figures["rss_anon_mb_after"] = memory_mb()["RssAnon"]
    figures["rss_anon_mb_reader"] = round(figures["rss_anon_mb_after"] - figures["rss_anon_mb_before"], 1)
    return figures


def run_worker(task: dict, src: str | None) -> dict:
    """Run one measurement in a fresh process importing `data_pipeline` from `src` (None: this tree)."""
    env = dict(os.environ, BENCH_DATA_PIPELINE_SRC=src or "")
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(task)], env=env, check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker_main(task: dict) -> dict:
    kind = task.pop("kind")
    if kind == "batches":
        return bench_batches(Path(task["data_dir"]), task["seq_len"], task["micro_batch"], task["whole_word"],
                             task["seconds"])
    if kind == "mixing":
        return bench_mixing(Path(task["data_dir"]), task["seq_len"], task["global_batch"], task["steps"])
    if kind == "scale":
        return bench_scale(Path(task["directory"]), task["seconds"])
    raise ValueError(kind)


def compare(tasks: list[dict], baseline: str | None, rounds: int, keys: tuple[str, ...] = ()) -> list[dict]:
    """Each task `rounds` times, alternating current and baseline; median of each of `keys`."""
    out = []
    for task in tasks:
        runs = {"current": [], "baseline": []}
        for _ in range(rounds):
            for name, src in (("current", None), ("baseline", baseline)):
                if name == "current" or baseline:
                    runs[name].append(run_worker(dict(task), src))
        entry = _summary(runs["current"], keys)
        if baseline:
            entry["baseline"] = _summary(runs["baseline"], keys)
            entry["baseline"].pop("rss_timeline", None)
            for key in keys:
                entry[f"{key}_over_baseline"] = round(entry[key] / entry["baseline"][key], 3)
        out.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "rss_timeline"}), file=sys.stderr)
    return out


def _summary(runs: list[dict], keys: tuple[str, ...]) -> dict:
    entry = dict(runs[0])
    for key in keys:
        entry[key] = round(statistics.median(r[key] for r in runs))
        entry[f"{key}_rounds"] = [r[key] for r in runs]
    return entry


def bench_model(iters: int = 6) -> dict:
    import torch

    from roformer import RoFormerConfig, RoFormerForMaskedLM

    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(**DEMO_MODEL)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, 8000, (16, 128))
    labels = torch.where(torch.rand(16, 128) < 0.15, ids, torch.full_like(ids, -100))
    times = []
    for i in range(iters + 2):
        t = time.perf_counter()
        out = model(ids, attention_mask=torch.ones_like(ids), labels=labels)
        (out.loss_sum / out.num_masked).backward()
        opt.step()
        opt.zero_grad()
        if i >= 2:
            times.append(time.perf_counter() - t)
    step = sorted(times)[len(times) // 2]
    return {"shape": "seq 128 x batch 16, hidden 256, 4 layers, vocab 8000", "step_seconds_median": round(step, 3),
            "tokens_per_s": round(16 * 128 / step), "torch_threads": torch.get_num_threads()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-cache", type=Path,
                        default=Path(os.environ.get("ROFORMER_DATA_DIR", Path.home() / ".cache/roformer-ds/data")))
    parser.add_argument("--batch-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="fresh-process runs per batch shape (median)")
    parser.add_argument("--baseline-src", type=Path, help="directory holding another data_pipeline to compare")
    parser.add_argument("--baseline-name", default="baseline", help="what the baseline is, for the JSON")
    parser.add_argument("--data-dir", type=Path, help="prepared en+zh directory to reuse (skips prepare)")
    parser.add_argument("--keep-prepare-from", type=Path, help="with --data-dir: results file whose prepare "
                        "figures to carry over, marked as such (for a change that does not touch preparation)")
    parser.add_argument("--previous", type=Path, help="results of an earlier run (e.g. before a change) to "
                        "show beside this one; its batch figures are copied under previous_run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "data.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker_main(json.loads(args.worker))))
        return 0
    baseline = str(args.baseline_src.resolve()) if args.baseline_src else None
    if baseline and not (Path(baseline) / "data_pipeline" / "batches.py").is_file():
        parser.error(f"--baseline-src {baseline}: no data_pipeline/batches.py inside")
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_average_at_start": os.getloadavg(),
                           "note": "machine shared with other jobs; load average > cpus inflates every time"},
               "baseline": args.baseline_name if baseline else None, "prepare": [], "batches": []}
    results["model"] = bench_model()  # first: a broken model import fails the run before the long parts
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(tmp)
        data_dir = args.data_dir
        if data_dir is None:
            install_corpus_sources(corpus_dir(args.data_cache))
            results["worker_startup_seconds"] = worker_startup_seconds()
            english = default_corpus_files(args.data_cache, ("en",))
            for workers in (1, 2):
                results["prepare"].append(bench_prepare(english, workers, work, "en"))
                print(json.dumps(results["prepare"][-1]), file=sys.stderr)
            both = bench_prepare(default_corpus_files(args.data_cache), 2, work, "en+zh")
            results["prepare"].append(both)
            print(json.dumps(both), file=sys.stderr)
            data_dir = Path(both["data_dir"])
        shapes = [{"kind": "batches", "data_dir": str(data_dir), "seq_len": seq_len, "micro_batch": mb,
                   "whole_word": wwm, "seconds": args.batch_seconds}
                  for seq_len, mb, wwm in ((128, 16, False), (128, 16, True), (512, 4, True))]
        results["batches"] = compare(shapes, baseline, args.rounds, ("tokens_per_s", "tokens_per_cpu_s"))
        results["mixing"] = compare([{"kind": "mixing", "data_dir": str(data_dir), "seq_len": 128,
                                      "global_batch": 16, "steps": 400}], baseline, 1)[0]
        scale_dir = work / "scale"
        scale_dir.mkdir()
        write_scale_corpus(scale_dir)
        results["scale"] = compare([{"kind": "scale", "directory": str(scale_dir), "seconds": args.batch_seconds}],
                                   baseline, 1)[0]
    for p in results["prepare"]:
        p.pop("data_dir")
    if args.data_dir and args.keep_prepare_from:
        kept = json.loads(args.keep_prepare_from.read_text())
        results["prepare"] = kept["prepare"]
        results["worker_startup_seconds"] = kept.get("worker_startup_seconds")
        results["prepare_measured_in"] = {"file": str(args.keep_prepare_from), "machine": kept.get("machine"),
                                          "note": "carried over, not re-measured in this run"}
    slowest = min(b["tokens_per_s"] for b in results["batches"] if b["seq_len"] == 128)
    results["batch_rate_over_model_rate"] = round(slowest / results["model"]["tokens_per_s"], 1)
    # The same model step measured on a quiet machine (issue brief: ~0.35 s per step).
    results["model_quiet_reference"] = {"step_seconds": 0.35, "tokens_per_s": round(16 * 128 / 0.35)}
    results["batch_rate_over_quiet_model_rate"] = round(slowest / results["model_quiet_reference"]["tokens_per_s"], 1)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    if args.previous:
        earlier = json.loads(args.previous.read_text())
        keys = ("seq_len", "micro_batch", "whole_word", "tokens_per_s", "rss_anon_growth_mb")
        results["previous_run"] = {"file": str(args.previous), "machine": earlier.get("machine"),
                                   "batches": [{k: b.get(k) for k in keys} for b in earlier.get("batches", [])],
                                   "model": earlier.get("model")}
    results["target"] = ("batch production >= 10x the demo model's training token rate and within 20% of the "
                         "baseline reader's (tokens_per_cpu_s: wall time on a shared machine follows the load), "
                         "flat RSS")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
