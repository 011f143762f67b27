"""One tracked run per `roformer finetune --report-to mlflow,wandb` job, linked to the export it started from:
tags name the export, the pretraining run directory, checkpoint and step it came from (export_info.json) and
that run's own tracked run (RUN_DIR/tracking/<tracker>.json). Its local files (MLflow's default SQLite store,
W&B's offline files) go beside the pretraining run's, in RUN_DIR/tracking, when that run directory is here
(known by its own records), else in ./tracking. A tracker that fails is one warning line; the fine-tune's
results stand."""
from __future__ import annotations

import json
from pathlib import Path

from launcher.common.defaults import TRACKERS
from launcher.export.export_reader import EXPORT_INFO
from launcher.common.io import write_line
from launcher.outputs.output_paths import is_run_dir
from launcher.tracking.remote import backend
from launcher.tracking.translate import Item, flatten, run_params


def report_finetune(report_to: tuple[str, ...], export_dir: Path, options: dict, report: dict,
                    files: list[Path]) -> dict[str, str]:
    """Send one fine-tune's options (parameters), results (metrics `finetune/...`) and files; returns
    {tracker: its run id} for the JSON report."""
    info = _export_info(export_dir)
    source = Path(info["run_dir"]) if info.get("run_dir") else None
    # Only into a real run directory (by its own records): export_info.json may name any folder by now.
    home = source / "tracking" if source is not None and is_run_dir(source) else Path.cwd() / "tracking"
    tags = {"export_dir": str(Path(export_dir).resolve()), "kind": "finetune"}
    tags.update({f"source.{k}": str(info[k]) for k in ("run_dir", "tag", "step") if k in info})
    metrics = {k: float(v) for k, v in flatten(report, "finetune", sep="/").items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")}
    run_ids = {}
    for name in (n for n in report_to if n in TRACKERS):
        source_run = _source_run_id(source, name)
        if source_run:
            tags[f"source.{name}_run_id"] = source_run
        try:
            tracker = backend(name, home, f"finetune-{Path(export_dir).name}")
            run_id = tracker.open(None, run_params(options), tags)
            tracker.send([Item(key="finetune", step=0, metrics=metrics)])
            tracker.files([(path, "") for path in files if path.is_file()])
            tracker.close("finished")
            run_ids[name] = run_id
        except Exception as err:  # noqa: BLE001 - the fine-tune's results are written all the same
            write_line(f"tracking: {name} unreachable or refused ({type(err).__name__}: {str(err)[:300]}); "
                       f"the fine-tune's results are in its report only")
    return run_ids


def _export_info(export_dir: Path) -> dict:
    try:
        return json.loads((Path(export_dir) / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _source_run_id(source: Path | None, name: str) -> str | None:
    if source is None:
        return None
    try:
        return json.loads((source / "tracking" / f"{name}.json").read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError):
        return None
