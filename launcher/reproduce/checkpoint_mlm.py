"""Masked-LM figures per length of a CHECKPOINT, with the RoPE base it was trained at last.

`roformer eval-mlm` reads a transformers export; a checkpoint whose last stage raised RoPE's base
(schedule `rope_theta`) cannot be exported (transformers' RoFormer fixes the base at 10000, see
launcher/export/exporter.py), so the reproduction's `extension` part evaluates checkpoints with
this module instead: the same text, masking and figures as eval-mlm (its helpers are reused), the
model built from the sidecar's model_config with the sidecar's rope_theta.

    python -m launcher.reproduce.checkpoint_mlm RUN_DIR --data DATA_DIR --seq-lens 512,1024 --out F.json
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from launcher.common.errors import UserError
from launcher.checkpoint.catalogue import effective_rope_theta, saved_model_config
from launcher.checkpoint.weights import consolidate_fp32, resolve_checkpoint
from launcher.common.io import atomic_write_json
from launcher.downstream.mlm_evaluation import figures_per_length
from launcher.export.model_card import run_stages, trained_length


def evaluate_checkpoint(run_dir: Path, data_dir: Path, seq_lens: list[int], tokens: int = 32768,
                        tokens_per_batch: int = 8192, seed: int = 0, tag: str | None = None,
                        attention: str = "sequence") -> dict:
    """attention: "document" scores each packed document alone (its own attention and positions), as
    `roformer eval-mlm --attention document` does; "sequence" as packed."""
    from data_pipeline import DocumentView, MaskingConfig, open_corpus
    from roformer import RoFormerForMaskedLM

    if not seq_lens or min(seq_lens) < 2:
        raise UserError(f"--seq-lens: {seq_lens}: need lengths >= 2")
    ref = resolve_checkpoint(run_dir, tag)
    config = saved_model_config(ref.path, ref.sidecar)
    theta = effective_rope_theta(ref.sidecar)
    if theta is not None:
        config = dataclasses.replace(config, rope_theta=theta)
    model = RoFormerForMaskedLM(config)
    model.load_state_dict(consolidate_fp32(ref), strict=True)
    model.eval()
    corpus = open_corpus(Path(data_dir), split="valid", verify=True,
                         expected_tokenizer_sha256=ref.sidecar.tokenizer_sha256)
    trained = trained_length(ref.sidecar, run_stages(ref.run_dir, ref.sidecar.step))
    results = figures_per_length(model, corpus, seq_lens, tokens=tokens, tokens_per_batch=tokens_per_batch, seed=seed,
                                 masking=MaskingConfig(mask_prob=0.15), trained_len=trained,
                                 documents=DocumentView(attention, attention))
    return {"run": Path(run_dir).name, "tag": ref.tag, "step": ref.sidecar.step, "rope_theta": theta,
            "attention": attention,
            "trained_max_seq_len": trained, "tokens": tokens, "seed": seed, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.reproduce.checkpoint_mlm", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir the run trained on")
    parser.add_argument("--seq-lens", required=True, help="comma-separated lengths, [CLS] included")
    parser.add_argument("--tokens", type=int, default=32768, help="token budget per length")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the latest)")
    parser.add_argument("--attention", choices=("sequence", "document"), default="sequence",
                        help="document: each packed document scored alone (attention and positions)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        seq_lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    except ValueError:
        print(f"error: --seq-lens: {args.seq_lens!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    import torch

    from launcher.deepspeed_env.lean_imports import import_deepspeed

    import_deepspeed()  # the checkpoint is read by DeepSpeed's code; its plain import took MLflow along (~2.5 CPU-s)
    torch.set_num_threads(max(1, args.threads))
    try:
        report = evaluate_checkpoint(args.run_dir, args.data, seq_lens, tokens=args.tokens, tag=args.tag,
                                     attention=args.attention)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    atomic_write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
