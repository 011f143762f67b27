"""The DeepSpeed engine of a rank, built from the run config. What DeepSpeed is and says lives in
launcher/deepspeed_env/: the process group (process_group.py), the optimizer a node builds (optimizer_check.py),
how the engine stands (loss scale and its floor, seeding: engine_state.py); its shape: the RunShape in RunSetup."""
from __future__ import annotations

import deepspeed
from deepspeed.accelerator import get_accelerator

from launcher.config.run_config import RunConfig
from launcher.deepspeed_env.engine_state import seed_everything
from launcher.deepspeed_env.lean_imports import answer_not_muon, optimizers_without_dynamo
from launcher.deepspeed_env.optimizer_check import node_optimizer
from launcher.train.init_weights import InitialWeights
from roformer import RoFormerForMaskedLM


def build_model(cfg: RunConfig, initial: InitialWeights | None = None) -> RoFormerForMaskedLM:
    """The model of the run config, with its initial weights (the same on every rank: from the seed, or
    `initial`'s, loaded here so that deepspeed.initialize partitions them) and memory settings."""
    seed_everything(cfg.seed)
    model = RoFormerForMaskedLM(cfg.model)
    model.enable_gradient_checkpointing(cfg.schedule.activation_checkpointing)
    if initial is not None:
        initial.load_into(model)
    return model


COMPILE_MEASURED_FASTER_ON: tuple[str, ...] = ()
"""Accelerators where compiled layers measured faster than eager, so `auto` compiles there. Not the CPU (the eager
step with roformer/cpu_kernels measured faster: bench/results/compile_cpu.json); CUDA joins once a lent GPU has
measured it (`roformer gpu-check`, tests/gpu/test_compile_cuda.py): until then a GPU run compiles only when asked."""


def compile_layers(setting: bool | str, device_name: str) -> bool:
    """Whether `model.compile` (true | false | auto) compiles the encoder layers on an accelerator named
    `device_name` (get_accelerator().device_name()): auto where COMPILE_MEASURED_FASTER_ON says it pays."""
    return device_name in COMPILE_MEASURED_FASTER_ON if setting == "auto" else bool(setting)


RECOMPILE_LIMIT = 64
"""Graphs Dynamo may keep for the layers' one shared forward: train / eval x with / without a padding mask x each new
shape until it marks the changing sizes dynamic. Its default, 8, ran out within two stages, past which the layers
run eager with one warning on stderr (tests/unit/test_model_compile.py)."""


def compile_model_layers(model: RoFormerForMaskedLM, backend: str) -> None:
    """model.compile_layers with the Dynamo recompile limit raised to RECOMPILE_LIMIT (a process-wide setting)."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    model.compile_layers(backend=backend)


def build_engine(cfg: RunConfig, ds_config: dict, rank: int, initial: InitialWeights | None = None):
    model = build_model(cfg, initial)
    accelerator = get_accelerator()
    if compile_layers(cfg.model_compile, accelerator.device_name()):  # before DeepSpeed wraps the model
        compile_model_layers(model, accelerator.get_compile_backend())
    seed_everything(cfg.seed * 1009 + rank)  # independent dropout per rank
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]  # biases and LayerNorm: no weight decay
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    ds_config = node_optimizer(ds_config, accelerator.device_name())  # torch's AdamW where FusedAdam cannot build
    answer_not_muon(str(ds_config.get("optimizer", {}).get("type", "")))
    optimizers_without_dynamo()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config)
    return engine
