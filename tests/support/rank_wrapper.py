"""TEST-ONLY per-rank entry: launcher.train.rank_entry plus faults chosen by environment variables.

    ROFORMER_TEST_FP16_CPU=1                 CPU accelerator reports fp16 support (tests/support/fp16_cpu.py)
    ROFORMER_TEST_SIGTERM_LAUNCHER_AT=N      rank 0 sends SIGTERM to its launcher (launch.py) before step N
    ROFORMER_TEST_SIGKILL_AT=RANK:N          that rank SIGKILLs itself before step N
    ROFORMER_TEST_SIGKILL_ONCE_AT=RANK:N     as SIGKILL_AT, but once per run directory (a marker file
                                             RUN_DIR/test-fault-<rank>-<N> remembers it): the fault of
                                             one start, which a restart does not meet again
    ROFORMER_TEST_DAMAGE_NEWEST_AT=RANK:N    that rank truncates the model-state file of the newest checkpoint
                                             before step N (before a SIGKILL_AT of the same step), once per
                                             run directory (marker RUN_DIR/test-damage-<rank>-<N>)
    ROFORMER_TEST_SIGKILL_IN_SAVE_AT=RANK:N  that rank SIGKILLs itself while writing the checkpoint of
                                             step N (after DeepSpeed's files, before the sidecar)
    ROFORMER_TEST_SAVE_LIVE_WEIGHTS=1        after training, the weights the engine holds (gathered
                                             under ZeRO-3) go to RUN_DIR/reference.safetensors, so an
                                             export can be compared with them, independently of the
                                             zero_to_fp32 consolidation under test
    ROFORMER_TEST_SAVE_LOADED_WEIGHTS=1      right after a resume loaded its checkpoint, the engine's fp32
                                             master weights ("master/<name>") and the module's weights in
                                             the training precision ("module/<name>") go to
                                             RUN_DIR/loaded-<tag>.safetensors
    ROFORMER_TEST_POISON_SEQUENCES=FIRST:COUNT  global training sequences FIRST .. FIRST+COUNT-1 of the data
                                             stream are poisoned: every label of a micro-batch holding one
                                             of them becomes the vocabulary's last id (a data-caused loss
                                             spike, met again only if the stream hands them out again)
    ROFORMER_TEST_SKIP_AT=N:BATCHES          before step N the data position skips BATCHES global batches of
                                             that step's stage (as the numerics guard's rewind does; the
                                             uninterrupted run a rewound one is compared with)
    ROFORMER_TEST_GUARD_TRACE=1              rank 0 appends the numerics guard's state to RUN_DIR/guard-trace.jsonl
                                             after its restore at start-up and after every step: flagged,
                                             began, the decision, both spike windows, the rewinds counted
Steps are 0-based global steps (the index of the step about to be taken).
"""
from __future__ import annotations

import os
import signal
import sys
import time


def _rank_step(var: str) -> tuple[int, int] | None:
    value = os.environ.get(var)
    if not value:
        return None
    rank, step = value.split(":")
    return int(rank), int(step)


def install_faults() -> None:
    from launcher.run_dir.layout import tag_for_step
    from launcher.checkpoint import checkpointer
    from launcher.train import trainer

    rank = int(os.environ["RANK"])
    original_step = trainer.Trainer.train_step
    sigterm_at = os.environ.get("ROFORMER_TEST_SIGTERM_LAUNCHER_AT")
    kill_at = _rank_step("ROFORMER_TEST_SIGKILL_AT")
    kill_once_at = _rank_step("ROFORMER_TEST_SIGKILL_ONCE_AT")
    damage_at = _rank_step("ROFORMER_TEST_DAMAGE_NEWEST_AT")

    def train_step(self, stage):
        step = self.state.step
        if damage_at and damage_at == (rank, step):
            damage_newest_checkpoint(self.checkpointer.run_dir, f"test-damage-{rank}-{step}")
        if sigterm_at and rank == 0 and step == int(sigterm_at):
            os.kill(os.getppid(), signal.SIGTERM)  # the parent is DeepSpeed's per-node launcher
        if kill_at and kill_at == (rank, step):
            os.kill(os.getpid(), signal.SIGKILL)
        if kill_once_at and kill_once_at == (rank, step):
            marker = self.checkpointer.run_dir.root / f"test-fault-{rank}-{step}"
            if not marker.exists():
                marker.write_text(f"{time.time()}\n")  # when it fired (bench/bench_restart.py: detection time)
                os.kill(os.getpid(), signal.SIGKILL)
        return original_step(self, stage)

    trainer.Trainer.train_step = train_step
    _install_data_faults(rank)

    kill_in_save = _rank_step("ROFORMER_TEST_SIGKILL_IN_SAVE_AT")
    original_save_rng = checkpointer.save_rng

    def save_rng(directory, this_rank):
        if kill_in_save and kill_in_save[0] == this_rank and directory.name == tag_for_step(kill_in_save[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        original_save_rng(directory, this_rank)

    checkpointer.save_rng = save_rng  # the name the Checkpointer calls

    if os.environ.get("ROFORMER_TEST_GUARD_TRACE") == "1" and rank == 0:
        _install_guard_trace()

    if os.environ.get("ROFORMER_TEST_SAVE_LIVE_WEIGHTS") == "1":
        original_run = trainer.Trainer.run

        def run_then_save_weights(self):
            outcome = original_run(self)
            save_live_weights(self.engine, self.checkpointer.run_dir.root / "reference.safetensors", rank)
            return outcome

        trainer.Trainer.run = run_then_save_weights

    if os.environ.get("ROFORMER_TEST_SAVE_LOADED_WEIGHTS") == "1":
        original_load = checkpointer.Checkpointer.load

        def load_then_save_weights(self, source, seed, universal_folder=None):
            original_load(self, source, seed, universal_folder)
            save_loaded_weights(self.engine, self.run_dir.root / f"loaded-{source.tag}.safetensors", rank)

        checkpointer.Checkpointer.load = load_then_save_weights


def _install_data_faults(rank: int) -> None:
    from data_pipeline.batches import PretrainBatches
    from launcher.train import trainer

    poison = _rank_step("ROFORMER_TEST_POISON_SEQUENCES")  # (first, count), parsed as a pair
    if poison:
        first, count = poison
        original_next = PretrainBatches.next_batch

        def next_batch(self, seq_len, micro_batch_size):
            start = self.sequences_consumed + self.rank * micro_batch_size
            batch = original_next(self, seq_len, micro_batch_size)
            if batch is not None and start < first + count and first < start + micro_batch_size:
                labels = batch["labels"]
                labels[labels != -100] = self.corpus.vocab_size - 1
            return batch

        PretrainBatches.next_batch = next_batch

    skip_at = _rank_step("ROFORMER_TEST_SKIP_AT")  # (step, batches)
    if skip_at:
        original_step = trainer.Trainer.train_step

        def train_step(self, stage):
            if self.state.step == skip_at[0] and not getattr(self, "_test_skipped", False):
                self._test_skipped = True
                self.batches.skip(stage.max_seq_len, skip_at[1] * stage.global_batch_size)
            return original_step(self, stage)

        trainer.Trainer.train_step = train_step


def _install_guard_trace() -> None:
    import json

    from launcher.train.guard_actions import GuardActions

    def trace(actions, step, decision):
        d = actions.detector
        line = {"step": step, "flagged": d.flagged, "began": d.began, "decision": decision if isinstance(decision, str) else type(decision).__name__,
                "loss_window": list(d.loss.history), "grad_norm_window": list(d.grad_norm.history),
                "stage_switched_at": d.stage_switched_at, "rewinds": len(actions.rewinds)}
        with open(actions.run_dir.root / "guard-trace.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    original_restore, original_after_step = GuardActions.restore, GuardActions.after_step

    def restore(self, step):
        original_restore(self, step)
        trace(self, step, "restore")

    def after_step(self, record, skipped_before):
        decision = original_after_step(self, record, skipped_before)
        trace(self, record["step"], decision)
        return decision

    GuardActions.restore, GuardActions.after_step = restore, after_step


def damage_newest_checkpoint(run_dir, marker_name: str) -> None:
    """Truncate the newest complete checkpoint's model-state file, once per run directory."""
    from tests.support.helpers import newest_checkpoint

    marker = run_dir.root / marker_name
    if marker.exists():
        return
    model = newest_checkpoint(run_dir.root).path / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:4096])
    marker.write_text(f"{model}\n")


def save_loaded_weights(engine, path, rank: int) -> None:
    """The fp32 master weights the optimizer holds and the module's (all ranks take part in the gathers)."""
    import deepspeed
    import torch.distributed
    from deepspeed.utils import safe_get_full_fp32_param
    from safetensors.torch import save_file

    state = {f"master/{name}": safe_get_full_fp32_param(param).detach().clone().contiguous()
             for name, param in engine.module.named_parameters()}
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None,
                                           enabled=engine.zero_optimization_stage() == 3):
        state.update({f"module/{name}": param.detach().clone().contiguous()
                      for name, param in engine.module.named_parameters()})
    if rank == 0:
        save_file(state, str(path))
    torch.distributed.barrier()


def save_live_weights(engine, path, rank: int) -> None:
    """Full fp32 weights as the engine holds them now (all ranks take part in the ZeRO-3 gather)."""
    import deepspeed
    import torch.distributed
    from safetensors.torch import save_file

    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None,
                                           enabled=engine.zero_optimization_stage() == 3):
        state = {k: v.detach().clone().float().contiguous() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        save_file(state, str(path))
    torch.distributed.barrier()


if __name__ == "__main__":
    if os.environ.get("ROFORMER_TEST_FP16_CPU") == "1":
        from tests.support.fp16_cpu import enable_fp16_on_cpu

        enable_fp16_on_cpu()
    install_faults()
    from launcher.train.rank_entry import main
    from launcher.train.teardown import exit_rank_process

    exit_rank_process(lambda: main(sys.argv[1:]))
