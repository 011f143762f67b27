"""Document attention as one variable-length FlashAttention call (issue 50), checked on a CPU machine: the
documents' offsets worked out on the host, the flattened token layout they index, and the call itself on the
'meta' device (torch's varlen op has a shape function there; the kernel is CUDA's). The kernel's numbers against
the masked path: tests/gpu/test_varlen_cuda.py, where a GPU is lent."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_pipeline import DocumentView, PretrainBatches, open_corpus
from data_pipeline.documents import document_offsets
from launcher.train.device_batches import to_device
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.attention import (additive_padding_mask, document_mask, document_varlen_attention, flatten_tokens,
                                unflatten_tokens, varlen_usable)
from tests.support.corpus_files import prepared_dir
from tests.support.helpers import REPO


@pytest.fixture(scope="module")
def packed_batch(tmp_path_factory) -> dict:
    """A real packed, masked batch (English and Chinese paragraphs) with document attention, its last row
    padded after its first half (a stream's end is padded so; the pipeline gives padding a document id of its own,
    this one does not)."""
    reader = PretrainBatches(open_corpus(prepared_dir(tmp_path_factory), "train"), seed=0)
    reader.set_document_view(DocumentView("document", "sequence"))
    batch = reader.next_batch(128, 4)
    half = batch["input_ids"].shape[1] // 2
    batch["attention_mask"][-1, half:] = 0
    return batch  # its padding shares the last document's id: the offsets cut at the mask too


def test_the_offsets_cut_the_flattened_batch_at_each_document_row_and_padding(packed_batch):
    document_ids, mask = packed_batch["document_ids"].numpy(), packed_batch["attention_mask"].numpy()
    offsets = document_offsets(document_ids, mask)
    assert offsets.dtype == np.int32 and offsets[0] == 0 and offsets[-1] == document_ids.size
    assert (np.diff(offsets) > 0).all()
    flat, real, length = document_ids.reshape(-1), mask.reshape(-1), document_ids.shape[1]
    for start, end in zip(offsets[:-1], offsets[1:]):
        assert len(set(flat[start:end])) == 1 and len(set(real[start:end])) == 1  # one document, real or padding
        assert start // length == (end - 1) // length  # inside one row
    # every change of document or of padding, and every row start, begins a segment
    starts = set(offsets[:-1].tolist())
    assert {i for i in range(1, flat.size) if flat[i] != flat[i - 1] or real[i] != real[i - 1] or i % length == 0
            } <= starts
    assert len(offsets) == len(document_offsets(document_ids)) + 1  # the padding's cut
    assert len(offsets) - 1 > document_ids.shape[0]  # the batch holds more documents than rows


def reference_varlen(query, key, value, cu_seqlens):
    """The varlen kernel's meaning, written out: softmax attention inside each segment of the (N, H, D) tokens."""
    out = torch.empty_like(query)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        segment = [x[start:end].transpose(0, 1) for x in (query, key, value)]  # (H, n, D)
        out[start:end] = F.scaled_dot_product_attention(*segment).transpose(0, 1)
    return out


def test_attention_inside_the_offsets_segments_is_the_document_masks_attention(packed_batch):
    """flatten_tokens -> each segment alone -> unflatten_tokens equals SDPA under the (B, 1, T, T) document mask
    for every real token: the layout and offsets that document_varlen_attention hands the kernel."""
    batch = packed_batch
    batch_size, length = batch["input_ids"].shape
    torch.manual_seed(0)
    query, key, value = (torch.randn(batch_size, 2, length, 8, dtype=torch.float64) for _ in range(3))
    cu_seqlens = torch.from_numpy(document_offsets(batch["document_ids"].numpy(), batch["attention_mask"].numpy()))
    varlen = unflatten_tokens(reference_varlen(*map(flatten_tokens, (query, key, value)), cu_seqlens), batch_size)
    mask = additive_padding_mask(document_mask(batch["document_ids"], batch["attention_mask"]), query.dtype)
    masked = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    real = batch["attention_mask"].bool()[:, None, :, None].expand_as(masked)
    assert torch.allclose(varlen[real], masked[real], atol=1e-12)
    assert torch.equal(unflatten_tokens(flatten_tokens(query), batch_size), query)


def test_the_varlen_call_takes_the_models_layout_on_a_device_that_is_not_the_cpu(packed_batch):
    """On 'meta' (a stand-in for the GPU) the batch goes to the device with its offsets, and torch's varlen op
    accepts the model's (B, H, T, D) bf16 tensors and int32 offsets, returning the same shape."""
    batch = packed_batch
    moved = to_device(batch, "meta")
    assert moved["cu_seqlens"].dtype == torch.int32 and moved["cu_seqlens"].device.type == "meta"
    assert "cu_seqlens" not in batch and "cu_seqlens" not in to_device(batch, "cpu")  # the host batch, the CPU: as is
    query = torch.empty(*batch["input_ids"].shape[:1], 2, batch["input_ids"].shape[1], 16, dtype=torch.bfloat16,
                        device="meta")
    context = document_varlen_attention(query, query, query, moved["cu_seqlens"])
    assert context.shape == query.shape and context.dtype == torch.bfloat16


def test_the_kernel_is_chosen_only_where_it_runs():
    half = torch.empty(1, 1, 4, 64, dtype=torch.bfloat16)
    assert not varlen_usable(half, 0.0)  # the CPU: the block kernel (roformer/cpu_kernels/attention.py)
    if torch.cuda.is_available():
        assert varlen_usable(half.cuda(), 0.0) and not varlen_usable(half.cuda(), 0.1)
        assert not varlen_usable(half.float().cuda(), 0.0)


def test_offsets_without_document_ids_are_refused():
    model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        model(torch.ones(1, 4, dtype=torch.long), cu_seqlens=torch.tensor([0, 4], dtype=torch.int32))


def test_the_model_with_offsets_on_the_cpu_equals_the_masked_model(packed_batch):
    """Offsets are a GPU kernel's input: on the CPU the model keeps its document kernel, same numbers."""
    batch = packed_batch
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=max(int(batch["input_ids"].max()) + 1, 8), hidden_size=32,
                                               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)).eval()
    cu_seqlens = torch.from_numpy(document_offsets(batch["document_ids"].numpy()))
    with torch.no_grad():
        plain, with_offsets = model(**batch), model(**batch, cu_seqlens=cu_seqlens)
    assert torch.equal(plain.loss_sum, with_offsets.loss_sum)


def test_the_model_is_imported_and_run_without_loading_torch_dynamo():
    """Exports, evaluations and CPU fine-tunes import the model: torch.nn.attention.varlen would bring torch._dynamo
    (2.4 s here) with it, so only the CUDA path that runs the kernel imports it."""
    code = ("import sys, torch; from roformer import RoFormerConfig, RoFormerForMaskedLM; "
            "model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, "
            "num_attention_heads=2, intermediate_size=32)); model(torch.ones(1, 4, dtype=torch.long)); "
            "print(sorted(m for m in ('torch._dynamo', 'torch.nn.attention.varlen') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
