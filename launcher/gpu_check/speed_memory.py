"""Parts (c) and (d) of `roformer gpu-check`, in this process on GPU 0.

(c) speed: our training step vs transformers' RoFormerForMaskedLM, same weights and batch, under autocast
    in the GPU's best half precision, side by side at lengths 128 and 512: tokens/s and MFU.
(d) memory: a single-rank DeepSpeed engine with ds_configs/v100_fp16_zero2.json; max_memory_allocated
    against `roformer plan`'s estimate of the same stage without the runtime allowance (the CUDA context,
    which max_memory_allocated does not count).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from launcher.common.defaults import DEFAULT_MASTER_PORT
from launcher.gpu_check.check_report import Check, SpeedRow, memory_check
from launcher.gpu_check.side_by_side import adamw, make_batch, medians, round_robin, training_step
from launcher.launch.ports import claim_default_port
from launcher.common.mfu import table_peak_tflops
from roformer import IGNORE_INDEX, RoFormerConfig, RoFormerForMaskedLM, save_pretrained
from roformer.flops import training_flops
from launcher.pricing.estimate import estimate_memory, setup_from_configs

# BERT-base sized, as configs/reference_v100.yaml (dropout as in training).
REFERENCE_MODEL = RoFormerConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                 intermediate_size=3072, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
TOKENS_PER_STEP = 8192  # 64 x 128 and 16 x 512: the reference schedule's micro-batches
REPO = Path(__file__).resolve().parents[2]


def half_precision() -> tuple[str, torch.dtype]:
    return ("bf16", torch.bfloat16) if torch.cuda.is_bf16_supported(including_emulation=False) else \
        ("fp16", torch.float16)


def check_speed(device: torch.device, lengths=(128, 512), iters: int = 10) -> list[SpeedRow]:
    import transformers

    precision, dtype = half_precision()
    peak = table_peak_tflops(torch.cuda.get_device_name(device), precision)
    rows = []
    torch.manual_seed(0)
    ours = RoFormerForMaskedLM(REFERENCE_MODEL).train()
    with tempfile.TemporaryDirectory() as tmp:
        theirs = transformers.RoFormerForMaskedLM.from_pretrained(save_pretrained(ours, Path(tmp) / "e")).train()
    ours, theirs = ours.to(device), theirs.to(device)
    for seq_len in lengths:
        batch = make_batch(REFERENCE_MODEL.vocab_size, TOKENS_PER_STEP // seq_len, seq_len, device=device)
        masked = int((batch["labels"] != IGNORE_INDEX).sum())
        steps = {"ours": training_step(ours, adamw(ours), batch, dtype),
                 "transformers": training_step(theirs, adamw(theirs), batch, dtype)}
        times = medians(round_robin(steps, iters, synchronize=torch.cuda.synchronize))
        rows.append(SpeedRow(seq_len, TOKENS_PER_STEP // seq_len, precision, times["ours_wall_s"],
                             times["transformers_wall_s"],
                             training_flops(REFERENCE_MODEL, TOKENS_PER_STEP // seq_len, seq_len, masked), peak))
    return rows


def init_single_rank(device: torch.device) -> None:
    """A process group of this process alone, on `device` (DeepSpeed's engine needs one): NCCL on a GPU, gloo
    on a CPU (the parts' logic tested there)."""
    from launcher.deepspeed_env.process_group import init_distributed

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(claim_default_port(DEFAULT_MASTER_PORT))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        init_distributed("nccl" if device.type == "cuda" else "gloo", auto_mpi_discovery=False)


def check_memory(device: torch.device, micro_batch: int = 16, seq_len: int = 512, steps: int = 3) -> Check:
    """Part (d): one rank, fp16 ZeRO-2 (the reference DeepSpeed config), the reference model at micro x len."""
    import deepspeed

    ds_config = json.loads((REPO / "ds_configs" / "v100_fp16_zero2.json").read_text())
    ds_config.update(train_batch_size=micro_batch, train_micro_batch_size_per_gpu=micro_batch,
                     gradient_accumulation_steps=1, steps_per_print=10 ** 9)
    ds_config["optimizer"]["params"]["lr"] = 1e-4
    init_single_rank(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)  # what this process held before (other parts' leftovers)
    model = RoFormerForMaskedLM(REFERENCE_MODEL)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    batch = make_batch(REFERENCE_MODEL.vocab_size, micro_batch, seq_len, device=device)
    for _ in range(steps):
        out = engine(**batch)
        engine.backward(out.loss)
        engine.step()
    torch.cuda.synchronize(device)
    measured = torch.cuda.max_memory_allocated(device) - base
    from launcher.config.deepspeed_json import DeepSpeedJson

    setup = setup_from_configs(REFERENCE_MODEL, DeepSpeedJson.from_config(ds_config), 1, activation_checkpointing=False,
                               cpu_ranks=False)
    estimate = estimate_memory(setup, micro_batch, seq_len).model_dependent
    del engine
    torch.cuda.empty_cache()
    return memory_check(f"{micro_batch} x {seq_len}, ZeRO-2 fp16, 1 rank", measured, estimate)
