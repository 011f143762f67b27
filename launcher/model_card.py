"""The README.md model card of an export: what was trained, on how much, and how well (from the sidecar)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any



def render_model_card(sidecar: dict, stages: list[dict] | None, tag: str, run_dir: Path) -> str:
    """Markdown with a transformers-style YAML header; every figure comes from the run's own files."""
    model = sidecar.get("model_config", {})
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags: [roformer, rope, masked-lm, roformer-ds]",
        "---",
        "",
        f"# RoFormer masked-LM export of `{run_dir.name}` at checkpoint `{tag}`",
        "",
        "Encoder with Rotary Position Embedding (RoFormer, arXiv 2104.09864), pretrained with masked",
        "language modelling by RoFormer-DS under DeepSpeed ZeRO. Weights are fp32, consolidated from the",
        "ZeRO shards. Load with `transformers.RoFormerForMaskedLM.from_pretrained(dir)` and",
        "`transformers.AutoTokenizer.from_pretrained(dir)`; RoPE has no maximum length.",
        "",
        "## Training state",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for label, keys in (("optimizer steps", ("step", "global_step")),
                        ("stage at save", ("stage_name", "stage", "stage_index")),
                        ("stage complete", ("stage_complete",)),
                        ("tokens seen", ("consumed_tokens", "tokens_consumed", "tokens_seen")),
                        ("sequences seen", ("consumed_samples", "sequences_consumed")),
                        ("world size at save", ("world_size",)),
                        ("ZeRO stage", ("zero_stage",)),
                        ("training precision", ("precision",))):
        value = _first(sidecar, keys)
        if value is not None:
            lines.append(f"| {label} | {_fmt(value)} |")
    lines.append(f"| architecture | {_architecture(model)} |")

    if stages:
        lines += ["", "## Training stages (schedule of the run; steps counted over the whole run)", "",
                  "| stage | max length | global batch | steps | first step | reached by this checkpoint |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['max_seq_len']} | {s['global_batch_size']} | {s['steps']:,} | "
                  f"{s['first_step']:,} | {'yes' if s['reached'] else 'no'} |" for s in stages]

    validation = _first(sidecar, ("last_validation", "validation"))
    if validation:
        lines += ["", "## Validation (held-out shards, at save time)", ""]
        if isinstance(validation, dict):
            lines += ["| metric | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in _flatten(validation)]
        else:
            lines.append(f"```json\n{json.dumps(validation, indent=2)}\n```")

    lines += ["", "## Model config", "", "```json", json.dumps(model, indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def _architecture(model: dict) -> str:
    parts = [f"{model.get('num_hidden_layers', '?')} layers", f"hidden {model.get('hidden_size', '?')}",
             f"{model.get('num_attention_heads', '?')} heads", f"vocab {model.get('vocab_size', '?')}",
             f"positions: {model.get('position_encoding', 'rope')}"]
    return ", ".join(parts)


def schedule_stages(run_dir: Path, run_config: dict | None, step: int | None) -> list[dict] | None:
    """The run's stages with their first step, and whether the checkpoint at `step` got to them.

    RUN_DIR/stages.json (the trainer's resolved stages) is the record of what ran; the schedule
    file named in config.yaml is only a fallback, as it may have been edited since."""
    rows = _stages_json(Path(run_dir) / "stages.json")
    if rows is None:
        schedule_file = ((run_config or {}).get("schedule") or {}).get("file")
        if not schedule_file or not Path(schedule_file).is_file():
            return None
        from launcher.schedule import load_schedule

        rows, first_step = [], 0
        for stage in load_schedule(schedule_file):
            rows.append({"name": stage.name, "max_seq_len": stage.max_seq_len,
                         "global_batch_size": stage.global_batch_size, "steps": stage.steps, "first_step": first_step})
            first_step += stage.steps
    for row in rows:
        row["reached"] = step is not None and step > row["first_step"]
    return rows


def _stages_json(path: Path) -> list[dict] | None:
    try:
        stages = json.loads(path.read_text(encoding="utf-8"))["stages"]
        return [{key: s[key] for key in ("name", "max_seq_len", "global_batch_size", "steps", "first_step")}
                for s in stages]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _first(d: dict, keys: tuple[str, ...]) -> Any:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _flatten(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
