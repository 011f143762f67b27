"""The reproduction's `schedules` part's numbers: its table in results.json (per variant over seeds: loss per
document at each length, training wall time and token slots per second from the runs' records, validation
loss against wall time, inews, the measured critical batch per stage), the verdict against flat-512 and its
section of report.md (runs: schedules_part.py)."""
from __future__ import annotations

import json
import statistics

from launcher.reproduce.job_runner import is_finished
from launcher.reproduce.run_tables import finetune_table
from launcher.reproduce.schedules_part import BASELINE, VARIANTS
from launcher.reproduce.seed_spread import spread
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import read_metrics

NOISE_KEY = "grad_noise_scale"
"""The train record's smoothed B_simple in sequences (issue 61 item 2), absent at steps without an estimate."""


def run_figures(run_dir) -> dict:
    """One run's training wall time (sum of its steps' step_time_s), token slots per second over it, its
    validation (step, wall seconds, loss) and per stage the batches it ran and its median critical batch."""
    train = read_metrics(run_dir, "train")
    elapsed, wall_at = 0.0, {}
    for record in train:  # every step has a train record (logging.log_every thins the trackers only)
        elapsed += record.get("step_time_s", 0.0)
        wall_at[record["step"]] = elapsed
    slots = sum(r["global_batch_size"] * r["max_seq_len"] for r in train if "global_batch_size" in r)
    curve = [[r["step"], round(wall_at[r["step"]], 3), r["loss"]] for r in read_metrics(run_dir, "valid")
             if r["step"] in wall_at]
    stages_path = RunDir(run_dir).stages
    rows = json.loads(stages_path.read_text(encoding="utf-8"))["stages"] if stages_path.is_file() else []
    stages: dict[int, dict] = {}
    for row in rows:
        stage = stages.setdefault(row["index"], {"name": row["name"], "max_seq_len": row["max_seq_len"], "batches": []})
        stage["batches"].append(row["global_batch_size"])
    for index, stage in stages.items():
        noise = [r[NOISE_KEY] for r in train if r.get("stage") == index and isinstance(r.get(NOISE_KEY), (int, float))]
        stage["critical_batch"] = statistics.median(noise) if noise else None
        stage["estimates"] = len(noise)
    return {"finished": is_finished(run_dir), "steps": len(train), "train_seconds": round(elapsed, 2),
            "token_slots": slots, "tokens_per_s": slots / elapsed if elapsed else None, "wall_curve": curve,
            "stages": [stages[i] for i in sorted(stages)]}


def schedules_table(preset, layout, pretrain: list, finetune: list, evals: list) -> dict:
    """results.json's "schedules": per variant its runs' figures and their spreads, the verdict's inputs."""
    part = preset.schedules
    names = {part.run_name(v, s): v for v in part.schedules for s in part.seeds}
    table: dict = {"budget": part.budget, "compared_len": part.compared_len, "variants": {}, "unfinished": []}

    def cell(variant: str) -> dict:
        return table["variants"].setdefault(variant, {"runs": {}, "loss": {}, "seeds": {}})

    for run in pretrain:
        if run.name not in names:
            continue
        figures = run_figures(layout.run_dir(run))
        if not figures["finished"]:
            table["unfinished"].append(run.name)
            continue
        cell(names[run.name])["runs"][run.name] = figures
    for run in evals:
        path = layout.eval_report(run)
        if path.is_file() and run.pretrain in names:
            report = json.loads(path.read_text(encoding="utf-8"))
            cell(run.variant)["seeds"][str(run.seed)] = {str(r["seq_len"]): r["loss"] for r in report["results"]}
    for figures in table["variants"].values():
        runs = list(figures["runs"].values())
        figures["train_seconds"] = spread([r["train_seconds"] for r in runs])
        figures["tokens_per_s"] = spread([r["tokens_per_s"] for r in runs if r["tokens_per_s"]])
        lengths = sorted({int(n) for seed in figures["seeds"].values() for n in seed})
        figures["loss"] = {str(n): spread([s[str(n)] for s in figures["seeds"].values() if str(n) in s])
                           for n in lengths}
        figures["stages"] = _stage_rows(runs)
    table["finetune"] = finetune_table(finetune, layout, key=lambda r: (r.task, names.get(r.pretrain, r.pretrain)))
    table["verdict"] = verdict(table)
    return table


def _stage_rows(runs: list[dict]) -> list[dict]:
    """Per stage (as the first run's): the batches it ran and the seeds' median critical batch (or none)."""
    if not runs:
        return []
    rows = []
    for index, stage in enumerate(runs[0]["stages"]):
        measured = [r["stages"][index]["critical_batch"] for r in runs
                    if index < len(r["stages"]) and r["stages"][index]["critical_batch"] is not None]
        rows.append({"name": stage["name"], "max_seq_len": stage["max_seq_len"],
                     "batch": " -> ".join(str(b) for b in dict.fromkeys(stage["batches"])),
                     "critical_batch": spread(measured)})
    return rows


def verdict(table: dict) -> dict:
    """Which schedule reached flat-512's loss at the compared length in the least training wall time.

    A variant reaches it when its seeds' loss there is not above flat's beyond the seed spread (its lowest seed
    at or below flat's highest); it saves time beyond the spread when its slowest seed trained in less time
    than flat's fastest. The winner is the reaching variant with the lowest mean wall time that saves time
    beyond the spread; "none" when no variant does. Computed from the numbers, never written by hand."""
    length = str(table["compared_len"])
    variants = table["variants"]
    flat = variants.get(BASELINE, {})
    flat_loss, flat_time = flat.get("loss", {}).get(length, {"n": 0}), flat.get("train_seconds", {"n": 0})
    if not (flat_loss.get("n") and flat_time.get("n")):
        return {"winner": None, "reason": f"{BASELINE} has no finished run with a loss at {length} yet", "rows": []}
    rows = []
    for name, cell in variants.items():
        loss, time = cell.get("loss", {}).get(length, {"n": 0}), cell.get("train_seconds", {"n": 0})
        if name == BASELINE or not (loss.get("n") and time.get("n")):
            continue
        rows.append({"variant": name, "loss": loss["mean"], "flat_loss": flat_loss["mean"],
                     "reached": loss["min"] <= flat_loss["max"], "lower_beyond_spread": loss["max"] < flat_loss["min"],
                     "seconds": time["mean"], "flat_seconds": flat_time["mean"],
                     "saved_seconds": flat_time["mean"] - time["mean"],
                     "faster_beyond_spread": time["max"] < flat_time["min"],
                     "one_seed": min(loss["n"], flat_loss["n"]) < 2})
    winners = sorted((r for r in rows if r["reached"] and r["faster_beyond_spread"]), key=lambda r: r["seconds"])
    return {"winner": winners[0]["variant"] if winners else None, "length": int(length), "rows": rows}


def verdict_lines(result: dict) -> list[str]:
    if not result.get("rows"):
        return [f"- Verdict: not yet: {result.get('reason', 'no variant finished beside ' + BASELINE)}."]
    lines = []
    for r in result["rows"]:
        reached = ("below it beyond the seed spread" if r.get("lower_beyond_spread") else
                   "reached it within the seed spread" if r["reached"] else "did NOT reach it within the seed spread")
        spread_text = ("one seed: no spread measured" if r["one_seed"] else
                       "beyond the seed spread" if r["faster_beyond_spread"] else "within the seed spread")
        lines.append(f"- {r['variant']}: loss at {result['length']} {r['loss']:.3f} vs {BASELINE} {r['flat_loss']:.3f} "
                     f"({reached}), training {r['seconds']:.1f} s vs {r['flat_seconds']:.1f} s "
                     f"({r['saved_seconds']:+.1f} s saved; {spread_text}).")
    winner = next((r for r in result["rows"] if r["variant"] == result["winner"]), None)
    if winner is None:
        lines.append(f"- Verdict: no schedule reached {BASELINE}'s loss at {result['length']} in less training time "
                     f"beyond the seed spread.")
    else:
        lines.append(f"- Verdict: {winner['variant']} reached {BASELINE}'s loss at {result['length']} first, saving "
                     f"{winner['saved_seconds']:.0f} s of training ({100 * winner['saved_seconds'] / winner['flat_seconds']:.0f}% "
                     f"of {BASELINE}'s {winner['flat_seconds']:.0f} s).")
    return lines


def schedules_section(table: dict, fmt) -> list[str]:
    lines = ["## Does the stage schedule pay? Staged against flat training at equal tokens (issue 61)", "",
             "The RoPE ablation model and corpus under four schedules at equal token slots, the same data order "
             "and pretraining seeds: flat (one stage at the longest length), staged (the ablation schedule), short "
             "then long (90% / 10% of the tokens) and staged with a batch ramp over its first stage and the LR scaled "
             "by sqrt(batch / reference). Masked-LM loss of the last checkpoint with every document scored alone, "
             "training wall time (the sum of the steps' times in the run's records; the runs one after another, "
             "see the header for the machine) and token slots per second; mean (min-max, n) over pretraining seeds.",
             "", "![schedules](schedules.png)", ""]
    lengths = sorted({int(n) for cell in table["variants"].values() for n in cell["loss"]})
    if table["variants"]:
        lines += ["| variant | " + " | ".join(f"loss at {n}" for n in lengths)
                  + " | training wall time (s) | token slots/s | inews accuracy |",
                  "|---|" + "---|" * (len(lengths) + 3)]
        inews = table["finetune"].get("inews", {})
        for variant, label in VARIANTS.items():
            cell = table["variants"].get(variant)
            if cell:
                lines.append(f"| {label} | " + " | ".join(fmt(cell["loss"].get(str(n), {"n": 0})) for n in lengths)
                             + f" | {fmt(cell['train_seconds'], digits=0)} | {fmt(cell['tokens_per_s'], digits=0)} | "
                             f"{fmt(inews.get(variant, {}).get('accuracy', {'n': 0}))} |")
        lines += ["", f"inews fine-tuned at {table['budget']} labels (the downstream part's protocol), test accuracy "
                  "over (pretraining seed, fine-tuning seed) pairs.", "",
                  "Measured critical batch (median `grad_noise_scale` of the stage, sequences) beside the batch used:",
                  "", "| variant | stage | length | batch used | measured critical batch |", "|---|---|---|---|---|"]
        for variant in VARIANTS:
            for stage in table["variants"].get(variant, {}).get("stages", []):
                measured = stage["critical_batch"]
                lines.append(f"| {variant} | {stage['name']} | {stage['max_seq_len']} | {stage['batch']} | "
                             + (f"~{fmt(measured, digits=0)}" if measured.get("n") else "not measured") + " |")
        lines.append("")
    if table["unfinished"]:
        lines += [f"Not finished yet (left out above): {', '.join(table['unfinished'])}.", ""]
    return lines + verdict_lines(table["verdict"]) + [""]
