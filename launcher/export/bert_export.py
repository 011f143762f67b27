"""The export of a `position_encoding: learned` run: a transformers BERT directory (`BertForMaskedLM`).

Such a model *is* a BERT (roformer/bert_interop.py), while transformers' RoFormer has no absolute
table; the exporter (launcher/export/exporter.py) asks this module, for each model, which format
it writes, how long its inputs may be, and how transformers is checked to reproduce our logits. The
rest of an export (tokenizer files, model card, checksums, the atomic swap) is the same for both.
"""
from __future__ import annotations

from pathlib import Path

from launcher.common.errors import UserError
from launcher.export.parity import check_logits



def exports_as_bert(model_config) -> bool:
    return model_config.position_encoding == "learned"


def check_export_format(model_config) -> None:
    """The model has a transformers counterpart: RoFormer (RoPE) or BERT (learned); ConfigError else."""
    from roformer.bert_interop import check_bert_exportable
    from roformer.hf_interop import check_exportable

    (check_bert_exportable if exports_as_bert(model_config) else check_exportable)(model_config)


def bert_max_positions(model_config, requested: int | None) -> int:
    """A BERT's inputs end where its learned table does: --max-positions may only repeat that size."""
    table = int(model_config.max_position_embeddings)
    if requested is not None and requested != table:
        raise UserError(f"--max-positions {requested}: a learned-position model exports as a BERT whose position "
                        f"table has {table} rows (model.max_position_embeddings); drop --max-positions")
    return table


def write_weights(model, directory: Path, max_positions: int) -> None:
    """config.json + model.safetensors in the model's transformers format."""
    from roformer.bert_interop import write_bert_files
    from roformer.hf_interop import write_pretrained_files

    if exports_as_bert(model.config):
        write_bert_files(model, directory)
    else:
        write_pretrained_files(model, directory, max_position_embeddings=max_positions)


def bert_model_card(card: str, max_positions: int) -> str:
    """The exporter's model card with its RoFormer introduction replaced by a BERT one (the training
    state, stages, validation and config sections are the same)."""
    _, sep, rest = card.partition("## Training state")
    title = next((line for line in card.splitlines() if line.startswith("# ")), "# export")
    title = title.replace("# RoFormer masked-LM export", "# BERT (learned absolute positions) masked-LM export")
    head = ["---", "library_name: transformers", "pipeline_tag: fill-mask",
            "tags: [bert, learned-positions, masked-lm, roformer-ds]", "---", "", title, "",
            "Encoder with learned absolute position embeddings (BERT; the RoFormer paper's learned-position",
            "baseline), pretrained with masked language modelling by RoFormer-DS under DeepSpeed ZeRO. Weights",
            "are fp32, consolidated from the ZeRO shards. Load with",
            "`transformers.BertForMaskedLM.from_pretrained(dir)` and `transformers.AutoTokenizer.from_pretrained(dir)`;",
            "continue it as RoFormer with `roformer pretrain --init-from DIR` (docs/training.md, \"Starting from a BERT\").",
            "", "## Input length", "",
            f"Inputs of up to **{max_positions:,} tokens** ([CLS] and [SEP] included): the learned position table",
            "has that many rows (config.json `max_position_embeddings`) and no position past it was ever trained.",
            "", ""]
    return "\n".join(head) + sep + rest


def check_bert_parity(export_dir: Path, model) -> float:
    """Reload the export with transformers' own BertForMaskedLM (no missing or unexpected keys) and compare
    logits; returns max |diff|."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    hf, info = transformers.BertForMaskedLM.from_pretrained(str(export_dir), output_loading_info=True)
    hf.eval()
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            raise UserError(f"{export_dir}: transformers' BertForMaskedLM reports {kind.replace('_', ' ')} "
                            f"{sorted(map(str, info[kind]))[:5]}; export aborted, nothing replaced")
    return check_logits(model, hf, export_dir, "transformers' BertForMaskedLM",
                        length=min(24, model.config.max_position_embeddings))
