"""`roformer gpu-check`: one command that proves a CUDA machine runs this project (docs/gpu.md).

Parts, each also a test in tests/gpu/: numerics (fp16 / bf16 against fp32 and transformers), pretraining
(a tiny fp16 ZeRO-2 run, a stop, an exact resume, an export), speed (our step against transformers') and
memory (a real engine against `roformer plan`'s estimate); report.py holds what needs no GPU. CUDA is the
subject here, so these modules use torch.cuda directly; the rest of the project goes through DeepSpeed's
accelerator.
"""
