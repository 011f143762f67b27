"""The stage-end eval job: exports a stage-end checkpoint and evaluates it beside training.

Rank 0 starts it as one detached, lowered-priority process (launcher.stage_evals.start) once the stage-end
checkpoint `tag` is complete. It exports to RUN_DIR/exports/<tag>/ and runs the evals of
`logging.stage_end_evals` one after another (mlm, a bundled task or a task spec YAML, `:field=value`
overrides); results go to RUN_DIR/evals/<tag>.<eval>.json and TensorBoard's RUN_DIR/tb/evals. The jobs of
a run take turns (a lock file), so short stages never stack them on the training machine.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
from pathlib import Path

from launcher.checkpoint.catalogue import read_sidecar
from launcher.common.defaults import BAD_INPUT_EXIT_CODE
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json
from launcher.deepspeed_env.lean_imports import summary_writer_class
from launcher.run_dir.layout import RunDir
from data_pipeline.remote.client import RemoteOptions
from launcher.downstream.fine_tuning import FinetuneConfig, finetune
from launcher.downstream.labelled_files import load_task
from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm
from launcher.downstream.retrieval_data import load_retrieval_task
from launcher.downstream.task_metrics import METRICS
from launcher.downstream.task_spec import load_task_spec
from launcher.downstream.tasks import TASKS, bundled_spec
from launcher.export.export_reader import trained_max_seq_len
from launcher.export.exporter import export_checkpoint, run_data_section

MLM_EVAL = "mlm"
# A stage-end fine-tune is a progress signal, not the final number: small and bounded in time.
QUICK_FINETUNE = dict(max_train_examples=2000, epochs=2, max_eval_examples=500, max_length=128)


def known_evals() -> list[str]:
    return [MLM_EVAL, *TASKS]


SPEC_SUFFIXES = (".yaml", ".yml")
FIXED_FIELDS = ("export_dir", "task", "seeds", "keep_best_state", "select_metric")


def is_spec_file(name: str) -> bool:
    return name.lower().endswith(SPEC_SUFFIXES)


def parse_eval(spec: str, where: str = "logging.stage_end_evals") -> tuple[str, dict]:
    """`name[:field=value...]` -> (name, fine-tune overrides); errors name the entry and the field.
    `name` is `mlm`, a bundled task or a task spec file (.yaml / .yml)."""
    name, *options = spec.split(":")
    if name not in known_evals() and not is_spec_file(name):
        raise UserError(f"{where}: unknown eval {name!r} (known: {', '.join(known_evals())}, or a task spec "
                        "file ending in .yaml)")
    overrides = {}
    allowed = {k: f.default for k, f in FinetuneConfig.__dataclass_fields__.items() if k not in FIXED_FIELDS}
    for option in options:
        key, sep, value = option.partition("=")
        if name == MLM_EVAL or not sep or key not in allowed:
            raise UserError(f"{where}: {spec!r}: bad option {option!r} (fine-tune tasks take "
                            f"field=value with field in {', '.join(allowed)})")
        kind = float if isinstance(QUICK_FINETUNE.get(key, allowed[key]), float) or key in ("lr", "dropout") else int
        try:
            overrides[key] = kind(value)
        except ValueError:
            raise UserError(f"{where}: {spec!r}: {key} must be a number, got {value!r}") from None
    return name, overrides


def validate_eval_names(names: list[str], where: str = "logging.stage_end_evals") -> None:
    """Every entry a known eval with valid options, and every task spec file with readable, consistent
    labelled files; errors name `where` and the entry."""
    for spec in names:
        name, _ = parse_eval(spec, where)
        if is_spec_file(name):
            try:
                task = _task_spec(name)
                (load_retrieval_task if task.task_type == "retrieval" else load_task)(task)
            except UserError as err:
                raise UserError(f"{where}: {spec!r}: {err}") from None


def _task_spec(name: str):
    return load_task_spec(Path(name)) if is_spec_file(name) else bundled_spec(name)


def _result_name(name: str) -> str:
    """What `<tag>.<eval>.json` and TensorBoard call an eval: a spec file by its task name."""
    return _task_spec(name).name if is_spec_file(name) else name


# --------------------------------------------------------------------------- the detached job


def run_stage_evals(run_dir: Path, tag: str, stage: str, specs: list[str], snapshot: Path | None = None
                    ) -> dict[str, Path]:
    """Export `tag` (from `snapshot` when given, see launcher.checkpoint.weights.snapshot_checkpoint), run each eval, write JSON +
    TensorBoard; one failing eval does not stop the rest. The snapshot is removed at the end."""
    layout = RunDir(Path(run_dir))
    evals_dir = layout.evals
    evals_dir.mkdir(parents=True, exist_ok=True)
    with open(evals_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one eval job per run at a time
        source = RunDir(Path(snapshot or run_dir))
        try:
            step = read_sidecar(source.checkpoint(tag)).step
            export_dir = export_checkpoint(source.root, layout.export(tag), tag=tag)
            data = run_data_section(source.root)
        finally:
            if snapshot is not None:
                shutil.rmtree(snapshot.parent, ignore_errors=True)
        written = {}
        for spec in specs:
            name, overrides = parse_eval(spec, where="--eval")
            try:
                report = _run_one(name, overrides, export_dir, data)
                name = _result_name(name)
            except (UserError, ValueError, OSError, RuntimeError) as err:
                report = {"error": f"{type(err).__name__}: {err}"}
                name = Path(name).stem if is_spec_file(name) else name
            report.update(eval=name, tag=tag, stage=stage, step=step)
            path = evals_dir / f"{tag}.{name}.json"
            atomic_write_json(path, report)
            _to_tensorboard(layout.eval_tensorboard, name, report, step)
            written[name] = path
            print(f"stage-evals: {name} -> {path}", flush=True)
    return written


def _run_one(name: str, overrides: dict, export_dir: Path, data: dict) -> dict:
    """One eval; `data` is the run config's data section (the held-out split and, for s3://, the run's cache)."""
    if name == MLM_EVAL:
        if not data.get("data_dir"):
            raise UserError("config.yaml: no data.data_dir, so there is no held-out split to evaluate on")
        trained = trained_max_seq_len(export_dir) or 128
        return evaluate_mlm(MLMEvalConfig(export_dir=export_dir, data_dir=Path(data["data_dir"]),
                                          seq_lens=[trained, 2 * trained], tokens=16384,
                                          remote_options=RemoteOptions.from_data_section(data)))

    task = _task_spec(name)
    options = {**QUICK_FINETUNE, **task.settings, **overrides}
    return finetune(FinetuneConfig(export_dir=export_dir, task=task, **options), log=lambda msg: print(msg, flush=True),
                    progress=False)


def _to_tensorboard(tb_dir: Path, name: str, report: dict, step: int) -> None:
    writer = summary_writer_class()(log_dir=str(tb_dir))
    try:
        if "error" in report:
            writer.add_text(f"eval/{name}/error", report["error"], step)
        elif name == MLM_EVAL:
            for row in report["results"]:
                for metric in ("loss", "accuracy", "perplexity"):
                    writer.add_scalar(f"eval/mlm/{metric}_len{row['seq_len']}", row[metric], step)
        else:
            held_out, metrics = report["held_out"], METRICS[report["task_type"]]  # not the example counts
            for split in ("dev", "test"):
                for metric, value in (report[split] or {}).items():
                    if metric in metrics and value is not None:
                        writer.add_scalar(f"eval/{name}/{split}_{metric}", value, step)
            for metric, value in report["baseline"][held_out].items():
                if metric in metrics and value is not None:
                    writer.add_scalar(f"eval/{name}/{held_out}_baseline_{metric}", value, step)
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stage-end export + evals (started by start_stage_end_job)")
    parser.add_argument("--check", action="store_true", help="only validate the --eval specs (exit code 2 if bad)")
    parser.add_argument("--where", default="--eval", help="what to name in a --check error")
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--snapshot", type=Path, default=None, help="hard-linked copy of the run dir to read")
    parser.add_argument("--tag")
    parser.add_argument("--stage", default="")
    parser.add_argument("--eval", action="append", required=True, dest="evals", help="eval spec (repeatable)")
    args = parser.parse_args(argv)
    try:
        validate_eval_names(args.evals, where=args.where)
    except UserError as err:
        print(err if args.check else f"stage-evals: error: {err}", file=sys.stderr)
        return BAD_INPUT_EXIT_CODE
    if args.check:
        return 0
    if args.run_dir is None or args.tag is None:
        parser.error("--run-dir and --tag are required to run the evals")
    try:
        os.nice(10)  # training keeps priority on a shared machine
    except OSError:
        pass
    try:
        run_stage_evals(args.run_dir, args.tag, args.stage, args.evals, snapshot=args.snapshot)
    except UserError as err:
        print(f"stage-evals: error: {err}", file=sys.stderr)
        return BAD_INPUT_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
