"""`roformer gpu-check`: one command that proves a CUDA machine runs this project (docs/gpu.md).

Parts (each also an ordinary test in tests/gpu/, marked `gpu`, skipped where CUDA is absent):
  numerics     (a) our model's forward / backward in fp16 and bf16 (where supported) against fp32 and
                   against transformers' RoFormerForMaskedLM on the GPU, within report.TOLERANCES;
  pretraining  (b) a two-stage tiny pretraining on all local GPUs with the V100-style fp16 ZeRO-2
                   config (loss scaling active, an overflow step skipped and counted), a stop, an exact
                   resume, an export loaded by transformers;
  speed        (c) tokens/s and MFU of our training step vs transformers', same GPU, same shape, side
                   by side in one process (side_by_side.py, shared with bench/bench_model.py), at 128 and 512;
  memory       (d) torch.cuda.max_memory_allocated of a real DeepSpeed engine vs `roformer plan`'s
                   estimate for the same stage.
report.py holds what needs no GPU (tolerances, verdicts, the JSON report and the console table) and
is tested in tests/unit/test_gpu_check.py. CUDA is the subject here, so these modules use torch.cuda
directly; everything else in the project goes through DeepSpeed's accelerator.
"""
