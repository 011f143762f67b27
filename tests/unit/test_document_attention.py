"""Packed documents that do not see each other (issue 50): the batches carry document_ids read off the [SEP]s
(and position_ids restarting per document), and under document attention a token's output and gradients do
not depend on the other documents of its sequence; one long document gives exactly today's results."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data_pipeline import DataError, DocumentView, PretrainBatches, open_corpus
from data_pipeline.config import CLS_ID, PAD_ID, SEP_ID
from data_pipeline.documents import document_positions
from launcher.config.run_config import load_run_config
from launcher.common.errors import UserError
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.model import IGNORE_INDEX
from tests.support.corpus_files import prepared_dir
from tests.support.helpers import run_config_dict, write_yaml

CONFIG = RoFormerConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FIRST = slice(0, 7)  # [CLS] + the first document's 5 tokens + its [SEP]


def packed(second_document: list[int]) -> dict[str, torch.Tensor]:
    """One sequence [CLS] a a a a a [SEP] b b b b [SEP] + 2 padding, labels on both documents."""
    ids = [CLS_ID, 11, 12, 13, 14, 15, SEP_ID, *second_document, SEP_ID, PAD_ID, PAD_ID]
    input_ids = torch.tensor([ids])
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, [2, 4, 8, 9]] = input_ids[0, [2, 4, 8, 9]]
    document_ids = torch.tensor([[0] * 7 + [1] * 5 + [2] * 2])
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD_ID).long(), "labels": labels,
            "document_ids": document_ids, "position_ids": torch.from_numpy(document_positions(document_ids.numpy()))}


def first_document_output(model, batch: dict, attention: str, positions: str):
    """(hidden states of the first document, gradients of a loss on them) under the given settings."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    if attention == "document":
        inputs["document_ids"] = batch["document_ids"]
    if positions == "document":
        inputs["position_ids"] = batch["position_ids"]
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks for both batches
    hidden = model.roformer(**inputs)[0, FIRST]
    hidden.square().sum().backward()
    return hidden.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no dropout", "dropout (the CPU kernel, per document)"])
@pytest.mark.parametrize("positions", ["sequence", "document"])
@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_a_token_sees_only_its_own_document_under_document_attention(positions, encoding, dropout):
    torch.manual_seed(0)
    config = RoFormerConfig(**{**CONFIG.to_dict(), "position_encoding": encoding,
                               "max_position_embeddings": None if encoding == "rope" else 32,
                               "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout})
    model = RoFormerForMaskedLM(config).train()
    one, other = packed([21, 22, 23, 24]), packed([31, 32, 33, 34])
    hidden, grads = first_document_output(model, one, "document", positions)
    hidden_other, grads_other = first_document_output(model, other, "document", positions)
    torch.testing.assert_close(hidden_other, hidden, atol=1e-6, rtol=0)
    for mine, theirs in zip(grads_other, grads):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    # under sequence attention the other document is seen
    seen, _ = first_document_output(model, one, "sequence", positions)
    seen_other, _ = first_document_output(model, other, "sequence", positions)
    assert (seen - seen_other).abs().max() > 1e-3


def test_restarted_positions_make_a_document_score_as_if_it_stood_alone():
    """With document attention and positions, the second document's hidden states equal those of the same
    tokens in a sequence of their own ([CLS] joins only the first document, so it is left out here)."""
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(CONFIG).eval()
    batch = packed([21, 22, 23, 24])
    with torch.no_grad():
        packed_hidden = model.roformer(batch["input_ids"], batch["attention_mask"], document_ids=batch["document_ids"],
                                       position_ids=batch["position_ids"])[0, 7:12]
        alone = model.roformer(batch["input_ids"][:, 7:12])[0]
    torch.testing.assert_close(packed_hidden, alone, atol=1e-6, rtol=0)


def test_one_document_per_row_gives_exactly_todays_results():
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(CONFIG).train()
    input_ids = torch.randint(5, CONFIG.vocab_size, (2, 12))
    labels = torch.where(torch.rand(2, 12) < 0.3, input_ids, IGNORE_INDEX)
    today = model(input_ids, labels=labels)
    one_document = model(input_ids, labels=labels, document_ids=torch.zeros_like(input_ids))
    assert torch.equal(today.loss_sum, one_document.loss_sum) and torch.equal(today.logits, one_document.logits)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return open_corpus(prepared_dir(tmp_path_factory), "train")


def test_batches_carry_document_ids_from_the_seps_and_nothing_else_changes(corpus):
    plain = PretrainBatches(corpus, seed=3)
    viewed = PretrainBatches(corpus, seed=3)
    viewed.set_document_view(DocumentView("document", "document"))
    for _ in range(3):
        a, b = plain.next_batch(64, 4), viewed.next_batch(64, 4)
        assert set(a) == {"input_ids", "attention_mask", "labels", "masked_positions"}
        for key, value in a.items():
            assert torch.equal(value, b[key])
        ids, documents, positions = a["input_ids"].numpy(), b["document_ids"].numpy(), b["position_ids"].numpy()
        for row in range(ids.shape[0]):
            real = int(a["attention_mask"][row].sum())
            seps_before = np.concatenate([[0], np.cumsum(ids[row, :real] == SEP_ID)[:-1]])
            assert documents[row, :real].tolist() == seps_before.tolist()  # [CLS] in document 0
            starts = np.flatnonzero(np.diff(documents[row], prepend=-1))
            assert (positions[row, starts] == 0).all() and positions[row].max() < 64
        assert (documents != documents[:, :1]).any()  # the demo corpus packs several documents per row
    assert plain.state_dict() == viewed.state_dict()


def test_an_unknown_document_view_is_refused_in_one_line():
    with pytest.raises(DataError, match=r"^data.attention: 'tokens' is not one of sequence, document$"):
        DocumentView("tokens")


def test_the_run_config_takes_the_document_settings_and_records_them_only_when_set(tmp_path):
    default = load_run_config(write_yaml(tmp_path / "run.yaml", run_config_dict()))
    assert default.data.document_view == DocumentView()
    assert "attention" not in default.to_dict()["data"]  # the config of a sequence run is what it always was
    chosen = load_run_config(tmp_path / "run.yaml", ["data.attention=document", "data.positions=document"])
    assert chosen.data.document_view == DocumentView("document", "document")
    assert chosen.to_dict()["data"]["attention"] == "document"


@pytest.mark.parametrize("overrides, message", [
    (["data.attention=documents"], "data.attention: must be one of sequence, document, got 'documents'"),
    (["data.positions=doc"], "data.positions: must be one of sequence, document, got 'doc'"),
    (["data.attention=document", "model.attention=linear"], "data.attention: 'document' needs model.attention"),
])
def test_bad_document_settings_are_named_with_the_file(tmp_path, overrides, message):
    with pytest.raises(UserError, match=r"bad\.yaml: " + message.replace("(", r"\(")):
        load_run_config(write_yaml(tmp_path / "bad.yaml", run_config_dict()), overrides)
