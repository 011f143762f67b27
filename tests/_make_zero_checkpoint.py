"""Test helper: a real multi-rank DeepSpeed run of our RoFormerForMaskedLM that saves checkpoints in
the run-directory layout the trainer uses (`RUN_DIR/checkpoints/<tag>/` + `sidecar.json`, `latest`).

Started by the tests through DeepSpeed's own runner, e.g.
    python -m deepspeed.launcher.runner --num_gpus 2 --master_port P tests/_make_zero_checkpoint.py \
        --run-dir D --zero-stage 3 --data-dir DATA
It trains a few steps on real packed MLM batches of a prepared data dir (data_pipeline's
PretrainBatches, each rank its share of the global batch) at a short length, saves, and writes the live weights gathered from the engine to `RUN_DIR/reference.safetensors`
so the tests can compare an export against what training actually held, independently of the
zero_to_fp32 consolidation under test.

With `--load-universal TAG_DIR` it instead resumes from a universal checkpoint (made by
`deepspeed.checkpoint.ds_to_universal` from a run with another world size), trains on, and saves.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import deepspeed
import torch
from safetensors.torch import save_file

from data_pipeline import PretrainBatches, open_corpus
from roformer import RoFormerConfig, RoFormerForMaskedLM

TINY_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--data-dir", type=Path, required=True, help="prepared data dir (batches + tokenizer)")
    # Like the trainer, the data dir is found through RUN_DIR/config.yaml (data.data_dir).
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--load-universal", type=Path, default=None,
                        help="checkpoints dir + tag of a universal checkpoint to resume from")
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the DeepSpeed launcher
    args = parser.parse_args()

    torch.manual_seed(1234)
    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    corpus = open_corpus(args.data_dir, split="train")
    config = RoFormerConfig(**{**TINY_MODEL, "vocab_size": corpus.vocab_size})
    model = RoFormerForMaskedLM(config)
    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage},
        "checkpoint": {"load_universal": args.load_universal is not None},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    ckpt_dir = args.run_dir / "checkpoints"
    batches = PretrainBatches(corpus, rank=rank, world_size=world, seed=7)
    if args.load_universal is not None:
        _, client_state = engine.load_checkpoint(str(args.load_universal.parent), tag=args.load_universal.name,
                                                 load_optimizer_states=True, load_lr_scheduler_states=False)
        batches.load_state_dict(client_state["data"])

    for i in range(args.steps):
        batch = batches.next_batch(args.seq_len, args.micro_batch)
        out = engine(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        loss = out.loss_sum / out.num_masked.clamp(min=1)
        engine.backward(loss)
        engine.step()
        if rank == 0 and i % 20 == 0:
            print(f"step {engine.global_steps} loss {float(loss.detach()):.4f}", flush=True)

    step = engine.global_steps
    tag = args.tag or f"step{step}"
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"data": batches.state_dict()})
    reference = _gathered_state(engine, args.zero_stage)
    torch.distributed.barrier()
    if rank == 0:
        (args.run_dir / "config.yaml").write_text(f"data:\n  data_dir: {args.data_dir}\n")
        save_file(reference, str(args.run_dir / "reference.safetensors"))
        # The keys launcher/train/trainer.py writes (the subset export reads), incl. the completion mark.
        sidecar = {
            "tag": tag,
            "step": step,
            "stage_index": 0,
            "stage_name": "only",
            "consumed_tokens": batches.tokens_consumed,
            "consumed_samples": batches.sequences_consumed,
            "last_validation": {"step": step, "max_seq_len": args.seq_len, "loss": float(loss.detach())},
            "model_config": config.to_dict(),
            "world_size": world,
            "zero_stage": args.zero_stage,
            "complete": True,
        }
        (ckpt_dir / tag / "sidecar.json").write_text(json.dumps(sidecar, indent=2))
    torch.distributed.barrier()


def _gathered_state(engine, zero_stage: int) -> dict[str, torch.Tensor]:
    """Full fp32 weights as the engine holds them now (ZeRO-3 params are gathered first)."""
    params = list(engine.module.parameters())
    if zero_stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone().float().contiguous() for k, v in engine.module.state_dict().items()}
    return {k: v.detach().clone().float().contiguous() for k, v in engine.module.state_dict().items()}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
