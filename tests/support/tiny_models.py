"""Small trained models for the tests that continue one, and the random-init twin they are measured against.

They run on one torch thread (`one_thread`): a tiny model's matrices gain nothing from a second, and with the CI's
four lanes on two cores torch's default (one thread a core) spins waiting for a core: train_tiny_mlm took 64 CPU-s
and 200 s at a load of 9 with two threads, 5.5 CPU-s and 27 s with one.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from tests.support.helpers import NO_DROPOUT, TINY_MODEL


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread inside the block, its setting before restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@one_thread()
def train_tiny_mlm(data_dir: Path, **config):
    """A TINY_MODEL RoFormer without dropout (plus `config`) trained 150 steps of 16 x 32 tokens on the train split."""
    from data_pipeline import MaskingConfig, PretrainBatches, open_corpus
    from roformer import RoFormerConfig, RoFormerForMaskedLM

    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(**{**TINY_MODEL, **NO_DROPOUT}, **config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    batches = PretrainBatches(open_corpus(data_dir, "train"), seed=3, masking=MaskingConfig())
    for _ in range(150):
        model(**batches.next_batch(32, 16)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@one_thread()
def eval_mlm_with_random_twin(model_dir: Path, twin_config, data_dir: Path, work: Path, seq_len: int,
                              tokens: int) -> tuple[float, float]:
    """eval-mlm loss on the train split of model_dir and of a random-init twin (twin_config, fresh weights,
    the data's tokenizer)."""
    from data_pipeline import copy_hf_tokenizer_files
    from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm
    from roformer import RoFormerForMaskedLM
    from roformer.hf_interop import save_pretrained

    torch.manual_seed(0)
    twin = save_pretrained(RoFormerForMaskedLM(twin_config), work / "twin")
    copy_hf_tokenizer_files(data_dir, twin)
    model_loss, twin_loss = (evaluate_mlm(MLMEvalConfig(export_dir=path, data_dir=data_dir, split="train",
                                                        seq_lens=[seq_len], tokens=tokens))["results"][0]["loss"]
                             for path in (model_dir, twin))
    return model_loss, twin_loss
