"""The MLM head gathers the masked positions at fixed slots (issue 48: no host gaps): the training forward and
backward with labels has static shapes (it runs on the 'meta' device, which stands in for a GPU, and calls no
data-dependent op), and its loss, counts and gradients equal the boolean-index path it replaced (1e-6, fp32)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import roformer.cpu_kernels as cpu_kernels
from data_pipeline.masking import masked_positions, masked_slots
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.model import IGNORE_INDEX, masked_positions_from_labels

CONFIG = RoFormerConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# Ops whose output shape or value the host must read off the device before it can go on.
HOST_WAITS = {"aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::item",
              "aten::masked_scatter"}


def batch(seed: int = 0, rows: int = 3, length: int = 24) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, CONFIG.vocab_size, (rows, length), generator=generator)
    labels = torch.full((rows, length), IGNORE_INDEX)
    chosen = torch.rand(rows, length, generator=generator) < 0.15
    chosen[:, 0] = False  # [CLS]
    labels[chosen] = input_ids[chosen]
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[-1, length - 5:] = 0  # one padded row
    labels[-1, length - 5:] = IGNORE_INDEX
    slots = masked_slots(length, 0.15, int(chosen.sum(dim=1).max()))
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels,
            "masked_positions": torch.from_numpy(masked_positions(labels.numpy(), slots))}


def boolean_index_reference(model: RoFormerForMaskedLM, data: dict) -> tuple[torch.Tensor, int, int]:
    """The path before issue 48: hidden[labels != -100], then F.linear + F.cross_entropy + argmax."""
    hidden = model.roformer(data["input_ids"], data["attention_mask"])
    is_masked = data["labels"] != IGNORE_INDEX
    head = model.mlm_head
    logits = F.linear(head.norm(head.activation(head.dense(hidden[is_masked]))),
                      model.roformer.embeddings.word.weight, head.bias)
    targets = data["labels"][is_masked]
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    return loss_sum, int(targets.numel()), int((logits.argmax(-1) == targets).sum())


def loss_and_grads(model, loss_sum) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    loss_sum.backward()
    return loss_sum.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("path", ["cpu", "gpu path on the cpu"])
@pytest.mark.parametrize("given_positions", [True, False], ids=["pipeline positions", "labels only"])
def test_loss_counts_and_gradients_equal_the_boolean_index_path(monkeypatch, path, given_positions):
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(CONFIG).train()
    data = batch()
    expected_loss, expected_masked, expected_correct = boolean_index_reference(model, data)
    expected, expected_grads = loss_and_grads(model, expected_loss)
    if path == "gpu path on the cpu":  # the ops a GPU tensor takes: padding slots scored as -100, no compaction
        monkeypatch.setattr(cpu_kernels, "use_cpu_kernels", lambda tensor: False)
    inputs = data if given_positions else {k: v for k, v in data.items() if k != "masked_positions"}
    out = model(**inputs)
    assert int(out.num_masked) == expected_masked > 0 and int(out.num_correct) == expected_correct
    got, grads = loss_and_grads(model, out.loss_sum)
    assert abs(got - expected) <= 1e-6 * max(1.0, abs(expected))
    for mine, theirs in zip(grads, expected_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


class OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._schema.name)
        if func._schema.name == "aten::index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None):
            self.ops.add("boolean index")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("given_positions", [True, False], ids=["pipeline positions", "labels only"])
def test_training_forward_and_backward_with_labels_has_static_shapes_on_meta(given_positions):
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64)).train().to("meta")
    data = {k: v.to("meta") for k, v in batch().items() if given_positions or k != "masked_positions"}
    with OpRecorder() as recorder:
        out = model(**data)
        (out.loss_sum * 0.5).backward()
    assert out.logits.shape[0] == data["input_ids"].shape[0] * (
        data["masked_positions"].shape[1] if given_positions else data["input_ids"].shape[1])
    assert recorder.ops & (HOST_WAITS | {"boolean index"}) == set()
    assert "aten::gather" in recorder.ops  # the recorder saw the head's gather
    assert all(p.grad is not None for p in model.parameters())


def test_positions_from_labels_are_the_labelled_positions_ascending_then_padding():
    labels = torch.tensor([[-100, 4, -100, 7, 9], [-100, -100, -100, -100, -100]])
    assert masked_positions_from_labels(labels).tolist() == [[1, 3, 4, -1, -1], [-1] * 5]
    assert masked_positions(labels.numpy(), 8).tolist() == [[1, 3, 4] + [-1] * 5, [-1] * 8]


def test_slots_are_one_shape_per_length_and_rate_and_never_too_few():
    assert masked_slots(128, 0.15) == masked_slots(128, 0.15, 20) == 24  # floor(127 * 0.15) + 1 = 20 -> 24
    assert masked_slots(512, 0.15) == 80 and masked_slots(512, 0.3) == 160
    assert masked_slots(128, 0.15, 25) == 32  # a whole word past the bound widens that batch, never drops
