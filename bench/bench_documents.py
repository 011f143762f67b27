"""CPU training step of our model with packed documents seen whole (`data.attention: sequence`) or apart
(`document`, with positions restarting too), side by side on a prepared corpus's own packed batches.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_documents.py --data DATA_DIR --label demo [--iters 4]

Per length (128 and 512 by default): the boundaries a sequence holds (documents per row: mean, min, max) and
the median step time (zero_grad, forward, masked-only loss, backward, AdamW; fp32, dropout on) of each
setting, in alternating rounds (the machine is shared; the load average is recorded). The model is
bench_model.py's shape; the batch is the corpus's first training batch at that length, its masked positions
included, as the trainer hands it out. Results go to bench/results/documents.json under --label.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_model import SHAPE  # noqa: E402
from data_pipeline import DocumentView, PretrainBatches, open_corpus  # noqa: E402
from launcher.gpu_check.side_by_side import adamw, medians, round_robin, training_step  # noqa: E402
from launcher.common.io import atomic_write_json  # noqa: E402
from roformer import RoFormerConfig, RoFormerForMaskedLM  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "documents.json"


def packed_batch(corpus, seq_len: int, batch_size: int) -> dict[str, torch.Tensor]:
    reader = PretrainBatches(corpus, seed=0)
    reader.set_document_view(DocumentView("document", "document"))
    return reader.next_batch(seq_len, batch_size)


def run(corpus, seq_len: int, batch_size: int, iters: int) -> dict:
    batch = packed_batch(corpus, seq_len, batch_size)
    documents = (batch["document_ids"].max(dim=1).values + 1 - (batch["attention_mask"] == 0).any(dim=1).long())
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=max(corpus.vocab_size, 8), **{
        k: v for k, v in SHAPE.items() if k != "vocab_size"})).train()
    sequence = {k: v for k, v in batch.items() if k not in ("document_ids", "position_ids")}
    steps = {"sequence": training_step(model, adamw(model), sequence),
             "document": training_step(model, adamw(model), batch)}
    median = medians(round_robin(steps, iters, between={"load_1min": lambda: os.getloadavg()[0]}))
    return {"seq_len": seq_len, "batch_size": batch_size,
            "documents_per_sequence": {"mean": float(documents.float().mean()), "min": int(documents.min()),
                                       "max": int(documents.max())},
            "step_wall_s": {name: median[f"{name}_wall_s"] for name in steps},
            "step_cpu_s": {name: median[f"{name}_cpu_s"] for name in steps},
            "document_over_sequence_wall": median["document_wall_s"] / median["sequence_wall_s"],
            "load_1min": median["load_1min"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir (roformer data prepare --out)")
    parser.add_argument("--label", required=True, help="key of this run in the JSON, e.g. the corpus's name")
    parser.add_argument("--lengths", default="128:16,512:4", help="seq_len:micro_batch pairs, comma-separated")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus = open_corpus(args.data, "train")
    rows = []
    for pair in args.lengths.split(","):
        seq_len, batch_size = (int(x) for x in pair.split(":"))
        row = run(corpus, seq_len, batch_size, args.iters)
        docs = row["documents_per_sequence"]
        print(f"T={seq_len} B={batch_size}: {docs['mean']:.1f} documents per sequence (min {docs['min']}, max "
              f"{docs['max']}); step {row['step_wall_s']['sequence']:.3f} s sequence, "
              f"{row['step_wall_s']['document']:.3f} s document ({row['document_over_sequence_wall']:.2f}x)")
        rows.append(row)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[args.label] = {"data": str(args.data), "threads": args.threads, "shape": SHAPE, "rows": rows,
                           "torch": torch.__version__, "numpy": np.__version__}
    atomic_write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
