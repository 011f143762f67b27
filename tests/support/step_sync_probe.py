"""TEST-ONLY rank program: the ops one training step of the real trainer dispatches between the start of each
micro-batch's forward and the end of its backward (issue 48: a GPU step must queue its work without waiting).

    python -m tests.support.step_sync_probe RUN_CONFIG [--compiled] [--cpu-kernels]   (one rank: RANK=0 WORLD_SIZE=1)

The GPU path on this CPU: the CPU kernels are switched off as on a GPU tensor (`roformer.cpu_kernels.use_cpu_kernels`,
as tests/unit/test_gpu_paths.py), the engine is launcher/train/engine.py's build_engine under DeepSpeed (ZeRO-2,
gloo) and the step is Trainer.train_step itself, its engine wrapped so that a TorchDispatchMode records from the
call `engine(**batch)` to the return of `engine.backward(...)`. Each op that makes a GPU's host wait for the device
(HOST_WAITS) is printed with where it was called. --compiled: `model.compile: true` with the aot_eager backend (what
build_engine compiles, traced and decomposed as inductor would see it, without inductor's C++ build), one step to
compile first. --cpu-kernels: the CPU path as it runs here (which reads the device: the recorder's control).
Prints one JSON line: {"waits": {op: [call site, ...]}, "ops": n, "losses": [...], "compiled": bool,
"trainer_reads": the trainer's own tensor reads (tolist / item) in the whole step}.
"""
from __future__ import annotations

import json
import sys
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_WAITS = frozenset({"aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::item",
                        "aten::masked_scatter", "aten::is_nonzero", "aten::equal", "aten::allclose",
                        "aten::unique", "aten::_unique2", "aten::repeat_interleave.Tensor"})
"""Ops whose output value or shape the host reads off the device before it can queue more work."""


class HostWaitRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.waits: dict[str, list[str]] = {}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name + ("" if func._overloadname in ("default", "") else f".{func._overloadname}")
        self.count += 1
        is_boolean_index = func._schema.name == "aten::index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        if func._schema.name in HOST_WAITS or name in HOST_WAITS or is_boolean_index:
            frames = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}"
                      for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
            self.waits.setdefault("boolean index" if is_boolean_index else name, []).append(
                " <- ".join(reversed(frames[-3:])))
        return func(*args, **(kwargs or {}))


class TrainerReads:
    """Counts the trainer's own reads of tensor values (`tolist`, `item`) while active: on a GPU each is a wait for
    the device (issue 48: one per optimizer step)."""

    def __init__(self):
        self.count = 0

    def __enter__(self):
        self.originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item")}
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, self._counting(original))
        return self

    def _counting(self, original):
        def read(tensor, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename.endswith("launcher/train/trainer.py"):
                self.count += 1
            return original(tensor, *args, **kwargs)
        return read

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, original)


class RecordedEngine:
    """The engine as the trainer sees it; `recorder` is active from each `engine(**batch)` to the end of the
    `engine.backward(...)` after it."""

    def __init__(self, engine, recorder: HostWaitRecorder | None):
        self._engine, self.recorder, self.losses = engine, recorder, []

    def __call__(self, **batch):
        if self.recorder is not None:
            self.recorder.__enter__()
        return self._engine(**batch)

    def backward(self, loss, **kwargs):
        try:
            return self._engine.backward(loss, **kwargs)
        finally:
            if self.recorder is not None:
                self.recorder.__exit__(None, None, None)
            self.losses.append(float(loss.detach()))  # after the recorded span: the probe's own read

    def __getattr__(self, name):
        return getattr(self._engine, name)


class HostBatches:
    """Micro-batches as data_pipeline/batches.py builds them (input_ids, attention_mask, labels, masked_positions)."""

    def __init__(self, vocab_size: int):
        self.vocab_size, self.calls = vocab_size, 0

    def set_document_view(self, view) -> None:
        self.view = view

    def state_dict(self) -> dict:  # the position, as PretrainBatches' (the trainer reads a step ahead)
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def next_batches(self, seq_len: int, micro_batch_size: int, grad_accum_steps: int):
        from data_pipeline.masking import IGNORE_INDEX, masked_positions, masked_slots

        generator = torch.Generator().manual_seed(self.calls)
        self.calls += 1
        batches = []
        for _ in range(grad_accum_steps):
            input_ids = torch.randint(5, self.vocab_size, (micro_batch_size, seq_len), generator=generator)
            chosen = torch.rand(micro_batch_size, seq_len, generator=generator) < 0.15
            chosen[:, 0] = False  # [CLS]
            mask = torch.ones(micro_batch_size, seq_len, dtype=torch.long)
            mask[-1, seq_len - 3:] = 0  # a padded row
            chosen &= mask.bool()
            labels = torch.where(chosen, input_ids, IGNORE_INDEX)
            slots = masked_slots(seq_len, 0.15, int(chosen.sum(dim=1).max()))
            batches.append({"input_ids": input_ids, "attention_mask": mask, "labels": labels,
                            "masked_positions": torch.from_numpy(masked_positions(labels.numpy(), slots))})
        return batches, {}


class NoGuard:
    def restore(self, step: int) -> None:
        pass


def main(config_path: str, compiled: bool, cpu_kernels: bool) -> None:
    from launcher.deepspeed_env.lean_imports import answer_not_muon, import_deepspeed

    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    import roformer.cpu_kernels
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.resolved.stage_configs import resolve_stage_configs
    from launcher.config.run_config import load_run_config
    from launcher.config.stages import resolve_stages
    from launcher.deepspeed_env.process_group import init_distributed
    from launcher.train.engine import build_engine
    from launcher.train.read_ahead import ReadAhead
    from launcher.train.trainer import Trainer, TrainParts, TrainState

    if not cpu_kernels:
        roformer.cpu_kernels.use_cpu_kernels = lambda tensor: False  # the ops a GPU tensor takes
    overrides = ["model.compile=true"] if compiled else []
    cfg = load_run_config(config_path, overrides)
    accelerator = get_accelerator()
    if compiled:  # inductor on a CPU builds C++ for minutes; aot_eager traces and decomposes the same graph
        accelerator.get_compile_backend = lambda: "aot_eager"
    init_distributed()
    stages = resolve_stages(cfg, world_size=1)
    stage = next(s for s in stages if s.grad_accum_steps > 1)  # two micro-batches: the boundary and the one before
    ds_config = resolve_stage_configs(cfg, [stage], 1, DeepSpeedJson.of(cfg))[0][0]
    answer_not_muon(str(ds_config.get("optimizer", {}).get("type", "")))
    engine = build_engine(cfg, ds_config, rank=0)
    layers_compiled = all(layer._compiled_call_impl is not None for layer in engine.module.roformer.layers)
    batches = HostBatches(cfg.model.vocab_size)
    losses = []
    for recorder in ([None] if compiled else []) + [HostWaitRecorder()]:  # compiled: a first step compiles
        wrapped = RecordedEngine(engine, recorder)
        parts = TrainParts(engine=wrapped, state=TrainState(), checkpointer=None, metrics=None, guard=NoGuard())
        trainer = Trainer(cfg, stages, ReadAhead(batches), batches, parts)
        with TrainerReads() as reads:
            record = trainer.train_step(stage)
        losses.append(record["loss"])
    print(json.dumps({"waits": recorder.waits, "ops": recorder.count, "losses": losses, "micro_losses": wrapped.losses,
                      "compiled": layers_compiled, "trainer_reads": reads.count}), flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    main(args[0], "--compiled" in args, "--cpu-kernels" in args)
