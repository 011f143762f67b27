"""Every export carries the sentence-transformers files: `SentenceTransformer(export)` loads it as
written (not "no modules.json found, initializing a new model" with guessed pooling), its embeddings are transformers' hidden
states mean-pooled over the real tokens, it truncates at the longest trained length, the files are
covered by export_info.json's checksums, and transformers alone loads the export as before."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from launcher.export.export_reader import check_export_dir
from launcher.export.sentence_transformers_files import FILES
from launcher.common.errors import UserError


def test_sentence_transformers_loads_an_export_without_guessing(stored_export, caplog):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, RoFormerForMaskedLM, RoFormerModel

    info = json.loads((stored_export / "export_info.json").read_text())
    assert set(FILES) <= set(info["sha256"])
    assert "`sentence_transformers.SentenceTransformer(dir)`" in (stored_export / "README.md").read_text()  # model card
    with caplog.at_level(logging.INFO, logger="sentence_transformers"):
        model = SentenceTransformer(str(stored_export), device="cpu")
    # A directory without modules.json is logged as "No modules.json found ..., initializing a new ... model".
    assert "modules.json" not in caplog.text and "Loading SentenceTransformer model from" in caplog.text, caplog.text
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling"]
    assert model[1].get_config_dict()["pooling_mode"] == "mean" and model.similarity_fn_name == "cosine"
    assert model.max_seq_length == info["max_seq_len_trained"]

    texts = ["Patches go to the mailing list.", "The kernel boots.", "补丁"]
    embeddings = model.encode(texts, convert_to_tensor=True)
    tokenizer = AutoTokenizer.from_pretrained(str(stored_export))
    encoder = RoFormerModel.from_pretrained(str(stored_export)).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state  # (B, T, H)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
    assert torch.allclose(embeddings, (hidden * mask).sum(1) / mask.sum(1), atol=1e-5)

    _, loading = RoFormerForMaskedLM.from_pretrained(str(stored_export), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]


def test_a_damaged_pooling_config_is_caught_by_the_recorded_checksum(stored_export, copy_of):
    export = copy_of(stored_export)
    config = export / "1_Pooling" / "config.json"
    config.write_text(config.read_text().replace('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true'))
    with pytest.raises(UserError, match="1_Pooling/config.json: corrupt"):
        check_export_dir(export)
