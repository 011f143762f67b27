"""The sentence-transformers files every export carries, so `SentenceTransformer(export)` loads it as
an embedding model without guessing: transformers' RoFormerModel + mean pooling over the tokens.

transformers itself ignores these files (it reads config.json, model.safetensors and the tokenizer),
so `RoFormerForMaskedLM.from_pretrained(export)` is unchanged. Written in the classic layout
(module types `sentence_transformers.models.*`), which every sentence-transformers release from 2.x on
reads; tests/unit/test_retrieval_export.py loads an export with the installed release and checks
the embeddings are transformers' hidden states mean-pooled over the real tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

POOLING_DIR = "1_Pooling"
FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", f"{POOLING_DIR}/config.json")


def write_sentence_transformers_files(directory: Path, hidden_size: int, max_seq_length: int) -> list[Path]:
    """Write FILES into the export being built at `directory`; returns their paths. `max_seq_length`:
    where SentenceTransformer.encode truncates its inputs (tokens, [CLS]/[SEP] included)."""
    directory = Path(directory)
    (directory / POOLING_DIR).mkdir(exist_ok=True)
    contents = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
        ],
        "sentence_bert_config.json": {"max_seq_length": int(max_seq_length), "do_lower_case": False},
        "config_sentence_transformers.json": {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
        f"{POOLING_DIR}/config.json": {
            "word_embedding_dimension": int(hidden_size), "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False, "include_prompt": True},
    }
    paths = []
    for name, content in contents.items():
        path = directory / name
        path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
