"""Data preparation speed with a Python-side tokenizer (jieba word segmentation) against SentencePiece.

    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_prepare_tokenizers.py \\
        [--data-cache DIR] [--input FILE ...] [--max-documents N] [--workers 1,2] [--rounds 2] \\
        [--jieba-tokenizer DIR] [--out bench/results/prepare_tokenizers.json]

Input: the bundled Chinese corpus (zh-peoples-daily, set-up step) or --input files. Tokenizers:
  sentencepiece  a BPE SentencePiece trained once on the input (`roformer data prepare`'s own, 8000 pieces;
                 its training time is reported apart), then reused with `--tokenizer` like any other
  jieba          a RoFormerTokenizer directory (vocab.txt, BERT's layout): --jieba-tokenizer DIR (e.g. a
                 download of junnyu/roformer_chinese_base), else one built from the input's characters and
                 its 20,000 most frequent jieba words (tests/support/hf_dirs.py), as the hub model's is
For each tokenizer and each --workers value, `prepare` runs --rounds times (alternating tokenizers, so
shared load hits both alike) and the median is kept: documents/s and tokens/s of the whole preparation
and of its encoding phase (wall and CPU seconds), with the machine's load average at the time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig, TokenizerConfig  # noqa: E402
from data_pipeline.prepare import prepare  # noqa: E402


def _prepare(inputs: list[str], out: Path, workers: int, max_documents: int | None, tokenizer: Path | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    report = prepare(PrepareConfig(input=InputConfig(inputs=inputs), out_dir=out, workers=workers,
                                   existing_tokenizer=tokenizer, tokenizer=TokenizerConfig(vocab_size=8000),
                                   cleaning=CleaningConfig(max_documents=max_documents, valid_fraction=0.01)),
                     log=lambda message: None)
    s = report.stats
    documents, tokens = s["train_documents"] + s["valid_documents"], s["train_tokens"] + s["valid_tokens"]
    encode = s["tokenize_seconds"]
    return {"seconds": round(report.seconds, 3), "documents": documents, "tokens": tokens,
            "documents_per_second": round(documents / report.seconds, 1),
            "tokens_per_second": round(tokens / report.seconds, 1),
            "encode_seconds": encode, "encode_cpu_seconds": s["tokenize_cpu_seconds"],
            "encode_documents_per_second": round(documents / max(encode, 1e-9), 1),
            "encode_tokens_per_second": round(tokens / max(encode, 1e-9), 1),
            "tokenizer_seconds": s["tokenizer_seconds"], "load_average": [round(x, 2) for x in os.getloadavg()]}


def _texts(inputs: list[str], limit: int | None) -> list[str]:
    """Documents of the input (JSONL `text` fields or lines), for building the jieba vocabulary."""
    texts: list[str] = []
    for name in inputs:
        with open(name, encoding="utf-8") as handle:
            for line in handle:
                if limit is not None and len(texts) >= limit:
                    return texts
                line = line.strip()
                if line:
                    texts.append(json.loads(line)["text"] if name.endswith(".jsonl") else line)
    return texts


def _median(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "rounds": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-cache", type=Path, default=Path(os.environ.get(
        "ROFORMER_DATA_DIR", Path.home() / ".cache" / "roformer-ds" / "data")))
    parser.add_argument("--input", nargs="+", default=None, help="text files (default: the bundled Chinese corpus)")
    parser.add_argument("--max-documents", type=int, default=None, help="read at most this many documents")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jieba-tokenizer", type=Path, default=None, help="a RoFormerTokenizer directory")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "prepare_tokenizers.json")
    args = parser.parse_args()
    if args.input:
        inputs = [str(p) for p in args.input]
    else:
        from data_pipeline.sources import default_corpus_files
        inputs = [str(p) for p in default_corpus_files(args.data_cache, ("zh",))]
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-tok-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        trained = _prepare(inputs, work / "spm_data", max(workers), args.max_documents, None)
        print(f"sentencepiece trained in {trained['tokenizer_seconds']:.1f}s", file=sys.stderr)
        tokenizers = {"sentencepiece": work / "spm_data" / "tokenizer" / "spm.model"}
        if args.jieba_tokenizer is not None:
            tokenizers["jieba"] = args.jieba_tokenizer
        else:
            from tests.support.hf_dirs import roformer_chinese_tokenizer_dir
            roformer_chinese_tokenizer_dir(work / "jieba", _texts(inputs, args.max_documents or 200_000), words=20_000)
            tokenizers["jieba"] = work / "jieba"
        results: dict = {name: {} for name in tokenizers}
        for count in workers:
            runs: dict = {name: [] for name in tokenizers}
            for _ in range(args.rounds):
                for name, tokenizer in tokenizers.items():
                    runs[name].append(_prepare(inputs, work / f"{name}_data", count, args.max_documents, tokenizer))
            for name in tokenizers:
                results[name][f"workers_{count}"] = _median(runs[name])
                m = results[name][f"workers_{count}"]
                print(f"{name:13s} workers {count}: {m['documents_per_second']:.0f} docs/s, "
                      f"{m['tokens_per_second']:.0f} tokens/s (encoding {m['encode_tokens_per_second']:.0f} tokens/s)",
                      file=sys.stderr)
        total = time.perf_counter() - started
    out = {"benchmark": "prepare_tokenizers", "inputs": inputs, "max_documents": args.max_documents,
           "jieba_tokenizer": str(args.jieba_tokenizer) if args.jieba_tokenizer else "built from the input",
           "sentencepiece_training_seconds": trained["tokenizer_seconds"], "results": results,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "seconds": round(total, 1), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_name(f".{args.out.name}.tmp")
    tmp_out.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp_out, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
