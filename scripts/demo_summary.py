"""The demo's closing summary: what its eval-mlm and finetune reports say, in a few lines.

    python scripts/demo_summary.py EVAL_MLM_JSON FINETUNE_JSON REPORT_MD

scripts/demo.sh runs `roformer eval-mlm` and `roformer finetune` with --out; this reads the two JSON
reports they wrote and prints the masked-LM loss / accuracy per length, the fine-tuned export's test
accuracy and macro-F1 next to its random-init twin and the majority baseline, then the paths of the
full reports. It reads only the keys it shows (a report that gains a key prints the same), and a
missing report or key is one line naming the file and the key, exit code 2. Standard library only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


class SummaryError(Exception):
    """A report file is missing, is not JSON, or lacks a key this summary shows."""


def read_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such report") from None
    except json.JSONDecodeError as err:
        raise SummaryError(f"{path}: not JSON ({err})") from None


def field(report: dict, path: Path, *keys: str | int):
    """report[k1][k2]...; a missing one is a SummaryError naming the file and the dotted key."""
    value = report
    for i, key in enumerate(keys):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise SummaryError(f"{path}: no {'.'.join(map(str, keys[:i + 1]))}") from None
    return value


def mlm_lines(report: dict, path: Path) -> list[str]:
    trained = report.get("trained_max_seq_len")
    lines = [f"masked-LM, {report.get('split', 'valid')} split (trained up to {trained or '?'} tokens):",
             f"  {'length':>6} {'loss':>7} {'accuracy':>9} {'perplexity':>11}"]
    for i, row in enumerate(field(report, path, "results")):
        loss, acc, ppl, length = (field(report, path, "results", i, k)
                                  for k in ("loss", "accuracy", "perplexity", "seq_len"))
        longer = "  (longer than trained)" if row.get("longer_than_trained") else ""
        lines.append(f"  {length:>6} {loss:>7.3f} {acc:>9.4f} {ppl:>11.1f}{longer}")
    return lines


def finetune_lines(report: dict, path: Path) -> list[str]:
    rows = [("pretrained export", ("test",))]
    if "random_init" in report:
        rows.append(("random-init twin", ("random_init", "test")))
    rows.append(("majority baseline", ("majority_baseline", "test")))
    lines = [f"finetune {field(report, path, 'task')} ({field(report, path, 'train_examples')} training examples), "
             "test split:", f"  {'':<18} {'accuracy':>9} {'macro-F1':>9}"]
    for name, keys in rows:
        lines.append(f"  {name:<18} {field(report, path, *keys, 'accuracy'):>9.4f} "
                     f"{field(report, path, *keys, 'macro_f1'):>9.4f}")
    if "random_init" in report:
        gain = field(report, path, "test", "accuracy") - field(report, path, "random_init", "test", "accuracy")
        lines.append(f"  pretraining changed test accuracy by {gain * 100:+.1f} points")
    return lines


def summary(eval_mlm: Path, finetune: Path, report_md: Path) -> str:
    lines = [*mlm_lines(read_report(eval_mlm), eval_mlm), "", *finetune_lines(read_report(finetune), finetune), "",
             "full reports:", f"  {eval_mlm}", f"  {finetune}", f"  {report_md}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python scripts/demo_summary.py EVAL_MLM_JSON FINETUNE_JSON REPORT_MD", file=sys.stderr)
        return 2
    try:
        print(summary(*map(Path, argv)))
    except SummaryError as err:
        print(f"demo summary: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
