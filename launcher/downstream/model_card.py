"""The README.md model card of an export: what was trained, on how much, and how well.

Every figure comes from the run's own records: the checkpoint sidecar and RUN_DIR/stages.json (the
stages the trainer resolved and ran; the schedule file named in config.yaml may have been edited since).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.checkpoint.catalogue import CheckpointSidecar
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import files_in_effect

STAGE_COLUMNS = ("name", "max_seq_len", "global_batch_size", "steps", "first_step")


def render_model_card(sidecar: CheckpointSidecar, stages: list[dict] | None, tag: str, run_dir: Path,
                      max_positions: int, started_from: str | None = None, averaged: list | None = None) -> str:
    """Markdown with a transformers-style YAML header. `max_positions`: config.json's
    max_position_embeddings, the longest input transformers' RoFormer accepts. `started_from`: the model
    a continued run or the run a branch started from (launcher.run_dir.records.describe_start), None for a
    random init.
    `averaged`: the checkpoints whose mean the weights are (launcher.checkpoint.weights.
    AveragedCheckpoint, oldest first; `sidecar` is the newest's), None for one checkpoint's weights."""
    model = sidecar.model_config
    trained = trained_length(sidecar, stages)
    what = (f"the mean of {len(averaged)} checkpoints ({', '.join(f'`{a.tag}`' for a in averaged)})" if averaged
            else f"checkpoint `{tag}`")
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags: [roformer, rope, masked-lm, roformer-ds]",
        "---",
        "",
        f"# RoFormer masked-LM export of `{Path(run_dir).name}` at {what}",
        "",
        "Encoder with Rotary Position Embedding (RoFormer, arXiv 2104.09864), pretrained with masked",
        "language modelling by RoFormer-DS under DeepSpeed ZeRO. Weights are fp32, consolidated from the",
        "ZeRO shards. Load with `transformers.RoFormerForMaskedLM.from_pretrained(dir)` and",
        "`transformers.AutoTokenizer.from_pretrained(dir)`; as an embedding model (mean pooling, cosine) with",
        "`sentence_transformers.SentenceTransformer(dir)`.",
        "",
        "## Input length",
        "",
        f"transformers' `RoFormerForMaskedLM` accepts inputs of up to **{max_positions:,} tokens** ([CLS] and",
        "[SEP] included): it reads each position's rotary angles from a precomputed table of",
        f"`max_position_embeddings` = {max_positions:,} rows (config.json, stored in model.safetensors) and",
        "raises `IndexError: index out of range in self` for a longer input. The rotary encoding itself has",
        "no maximum length: RoFormer-DS's own loader (`roformer eval-mlm`, `roformer finetune`,",
        "`roformer.load_pretrained`) computes the angles for any position and does not need the table. A longer",
        "limit for transformers: export again with `roformer export --max-positions N` (the table costs",
        "N x head size x 4 bytes)." + (f" The checkpoint was trained at up to {trained:,} tokens." if trained else ""),
        "",
        "## Training state",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for label, value in (("optimizer steps", sidecar.step),
                         ("stage at save", sidecar.stage_name),
                         ("stage complete", sidecar.stage_complete),
                         ("tokens seen", sidecar.consumed_tokens),
                         ("sequences seen", sidecar.consumed_samples),
                         ("world size at save", sidecar.world_size),
                         ("ZeRO stage", sidecar.zero_stage),
                         ("training precision", sidecar.precision)):
        lines.append(f"| {label} | {_fmt(value)} |")
    lines.append(f"| architecture | {_architecture(model)} |")
    lines.append(f"| started from | {started_from or 'random initialisation'} |")

    if averaged:
        lines += ["", "## Averaged checkpoints", "",
                  f"The weights are the element-wise mean of these {len(averaged)} checkpoints' fp32 weights "
                  f"(`roformer export --average-last` / `--average`); the training state above is the newest one's.",
                  "", "| tag | step | stage | sidecar.json sha256 |", "|---|---|---|---|"]
        lines += [f"| {a.tag} | {a.step:,} | {a.stage} | `{a.sidecar_sha256}` |" for a in averaged]

    if stages:
        lines += ["", "## Training stages (schedule of the run; steps counted over the whole run)", "",
                  "| stage | max length | global batch | steps | first step | reached by this checkpoint |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['max_seq_len']} | {s['global_batch_size']} | {s['steps']:,} | "
                  f"{s['first_step']:,} | {'yes' if s['reached'] else 'no'} |" for s in stages]

    if sidecar.last_validation:
        lines += ["", "## Validation (held-out shards, at save time)", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in sidecar.last_validation.items()]

    lines += ["", "## Model config", "", "```json", json.dumps(model, indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def trained_length(sidecar: CheckpointSidecar, stages: list[dict] | None) -> int | None:
    """The longest sequence length the checkpoint was trained at: the longest stage it reached
    (`run_stages`), else its last validation's length; None when neither is recorded."""
    reached = [s["max_seq_len"] for s in stages or [] if s["reached"]]
    if reached:
        return max(reached)
    return (sidecar.last_validation or {}).get("max_seq_len")


def _architecture(model: dict) -> str:
    parts = [f"{model['num_hidden_layers']} layers", f"hidden {model['hidden_size']}",
             f"{model['num_attention_heads']} heads", f"vocab {model['vocab_size']}",
             f"positions: {model['position_encoding']}"]
    return ", ".join(parts)


def run_stages(run_dir: RunDir, step: int) -> list[dict] | None:
    """The run's stages (RUN_DIR/stages.json, or the version in effect at `step`) and whether the
    checkpoint at `step` got into each; None when the file is missing or unreadable (the card then
    has no stage table)."""
    try:
        stages = json.loads(files_in_effect(run_dir, step)["stages"].read_text(encoding="utf-8"))["stages"]
        rows = [{key: s[key] for key in STAGE_COLUMNS} for s in stages]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for row in rows:
        row["reached"] = step > row["first_step"]
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
