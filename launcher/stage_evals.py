"""Stage-end exports and evaluation jobs that run beside training without blocking it.

The trainer calls `on_stage_end(run_dir, tag, stage, run_config)` on rank 0 after the stage-end
checkpoint `tag` is complete. When `logging.stage_end_evals` lists evals, one detached process
(`python -m launcher.stage_evals ...`, own session, lowered priority) exports the checkpoint to
`RUN_DIR/exports/<tag>/` and runs the evals one after another; results land in
`RUN_DIR/evals/<tag>.<eval>.json` and as scalars in TensorBoard under `RUN_DIR/tb/evals`
(step = the checkpoint's optimizer step). Jobs of one run take turns (a lock file), so a short
stage never stacks several eval jobs on the training machine. The log is `RUN_DIR/evals/<tag>.log`.

Evals: `mlm` (eval-mlm on the run's held-out split at the longest trained length and twice it) and
any task of launcher.tasks (`movie-reviews`, `inews`: a quick fine-tune, QUICK_FINETUNE). A task may
override fine-tune fields after colons, e.g. `movie-reviews:max_train_examples=500:epochs=1`.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.errors import UserError

MLM_EVAL = "mlm"
# A stage-end fine-tune is a progress signal, not the final number: small and bounded in time.
QUICK_FINETUNE = dict(max_train_examples=2000, epochs=2, max_eval_examples=500, max_length=128)


def known_evals() -> list[str]:
    from launcher.tasks import TASKS

    return [MLM_EVAL, *TASKS]


def parse_eval(spec: str, where: str = "logging.stage_end_evals") -> tuple[str, dict]:
    """`name[:field=value...]` -> (name, fine-tune overrides); errors name the entry and the field."""
    from launcher.finetune import FinetuneConfig

    name, *options = spec.split(":")
    if name not in known_evals():
        raise UserError(f"{where}: unknown eval {name!r} (known: {', '.join(known_evals())})")
    overrides = {}
    allowed = {k: f.default for k, f in FinetuneConfig.__dataclass_fields__.items()
               if k not in ("export_dir", "task", "task_data")}
    for option in options:
        key, sep, value = option.partition("=")
        if name == MLM_EVAL or not sep or key not in allowed:
            raise UserError(f"{where}: {spec!r}: bad option {option!r} (fine-tune tasks take "
                            f"field=value with field in {', '.join(allowed)})")
        kind = float if isinstance(QUICK_FINETUNE.get(key, allowed[key]), float) else int
        try:
            overrides[key] = kind(value)
        except ValueError:
            raise UserError(f"{where}: {spec!r}: {key} must be a number, got {value!r}") from None
    return name, overrides


def validate_eval_names(names: list[str], where: str = "logging.stage_end_evals") -> None:
    """Call at config load time so a typo fails before training starts, naming the field."""
    for spec in names:
        parse_eval(spec, where)


def on_stage_end(run_dir, tag: str, stage, run_config) -> subprocess.Popen | None:
    """Start the configured evals for checkpoint `tag` in the background; returns at once."""
    names = _configured_evals(run_config)
    if not names:
        return None
    validate_eval_names(names)
    run_dir = Path(run_dir)
    evals_dir = run_dir / "evals"
    evals_dir.mkdir(parents=True, exist_ok=True)
    stage_name = getattr(stage, "name", stage)  # the trainer passes its ResolvedStage
    snapshot = snapshot_checkpoint(run_dir, tag)
    cmd = [sys.executable, "-m", "launcher.stage_evals", "--run-dir", str(run_dir), "--snapshot", str(snapshot),
           "--tag", str(tag),
           "--stage", str(stage_name), *[arg for spec in names for arg in ("--eval", spec)]]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(evals_dir / f"{tag}.log", "ab") as log:
        # Own session: a Ctrl-C or a signal to the training job's process group does not reach it.
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)


def snapshot_checkpoint(run_dir: Path, tag: str) -> Path:
    """Hard links to the checkpoint's files (instant, no copy) in a run-dir-shaped folder under
    RUN_DIR/evals/: the eval job reads those, so the trainer's retention may delete the original
    while the job is queued or running. Returns the snapshot's run directory."""
    source = Path(run_dir) / "checkpoints" / tag
    snapshot = Path(run_dir) / "evals" / f".snapshot-{tag}" / Path(run_dir).name
    shutil.rmtree(snapshot.parent, ignore_errors=True)
    (snapshot / "checkpoints" / tag).mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            _link_or_copy(path, snapshot / "checkpoints" / tag / path.name)
    for name in ("config.yaml", "stages.json"):
        if (Path(run_dir) / name).is_file():
            shutil.copy2(Path(run_dir) / name, snapshot / name)
    return snapshot


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, dest)


def _configured_evals(run_config) -> list[str]:
    logging = getattr(run_config, "logging", None)
    if logging is None and isinstance(run_config, dict):
        logging = run_config.get("logging") or {}
    names = logging.get("stage_end_evals") if isinstance(logging, dict) else getattr(logging, "stage_end_evals", None)
    return list(names or [])


# --------------------------------------------------------------------------- the detached job


def run_stage_evals(run_dir: Path, tag: str, stage: str, specs: list[str], snapshot: Path | None = None
                    ) -> dict[str, Path]:
    """Export `tag` (from `snapshot` when given, see snapshot_checkpoint), run each eval, write JSON +
    TensorBoard; one failing eval does not stop the rest. The snapshot is removed at the end."""
    from launcher.checkpoint_reader import resolve_checkpoint
    from launcher.eval_mlm import write_json_atomic
    from launcher.export import export_checkpoint, run_data_dir

    evals_dir = run_dir / "evals"
    evals_dir.mkdir(parents=True, exist_ok=True)
    with open(evals_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one eval job per run at a time
        source = snapshot or run_dir
        try:
            ref = resolve_checkpoint(source, tag)
            step = int(ref.sidecar.get("step", 0))
            export_dir = export_checkpoint(source, run_dir / "exports" / tag, tag=tag)
            data_dir = run_data_dir(ref)
        finally:
            if snapshot is not None:
                shutil.rmtree(snapshot.parent, ignore_errors=True)
        written = {}
        for spec in specs:
            name, overrides = parse_eval(spec, where="--eval")
            try:
                report = _run_one(name, overrides, export_dir, data_dir)
            except (UserError, ValueError, OSError, RuntimeError) as err:
                report = {"error": f"{type(err).__name__}: {err}"}
            report.update(eval=name, tag=tag, stage=stage, step=step)
            path = evals_dir / f"{tag}.{name}.json"
            write_json_atomic(path, report)
            _to_tensorboard(run_dir / "tb" / "evals", name, report, step)
            written[name] = path
            print(f"stage-evals: {name} -> {path}", flush=True)
    return written


def _run_one(name: str, overrides: dict, export_dir: Path, data_dir: str | None) -> dict:
    from launcher.export_dir import trained_max_seq_len

    if name == MLM_EVAL:
        from launcher.eval_mlm import MLMEvalConfig, evaluate_mlm

        if not data_dir:
            raise UserError("config.yaml: no data.data_dir, so there is no held-out split to evaluate on")
        trained = trained_max_seq_len(export_dir) or 128
        return evaluate_mlm(MLMEvalConfig(export_dir=export_dir, data_dir=Path(data_dir),
                                          seq_lens=[trained, 2 * trained], tokens=16384))
    from launcher.finetune import FinetuneConfig, finetune

    options = {**QUICK_FINETUNE, **overrides}
    return finetune(FinetuneConfig(export_dir=export_dir, task=name, **options), log=lambda msg: print(msg, flush=True))


def _to_tensorboard(tb_dir: Path, name: str, report: dict, step: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tb_dir))
    try:
        if "error" in report:
            writer.add_text(f"eval/{name}/error", report["error"], step)
        elif name == MLM_EVAL:
            for row in report["results"]:
                for metric in ("loss", "accuracy", "perplexity"):
                    writer.add_scalar(f"eval/mlm/{metric}_len{row['seq_len']}", row[metric], step)
        else:
            for split in ("dev", "test"):
                for metric in ("accuracy", "macro_f1"):
                    writer.add_scalar(f"eval/{name}/{split}_{metric}", report[split][metric], step)
            writer.add_scalar(f"eval/{name}/test_majority_accuracy", report["majority_baseline"]["test"]["accuracy"], step)
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stage-end export + evals (started by on_stage_end)")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--snapshot", type=Path, default=None, help="hard-linked copy of the run dir to read")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--stage", default="")
    parser.add_argument("--eval", action="append", required=True, dest="evals", help="eval spec (repeatable)")
    args = parser.parse_args(argv)
    try:
        os.nice(10)  # training keeps priority on a shared machine
    except OSError:
        pass
    try:
        validate_eval_names(args.evals, where="--eval")
        run_stage_evals(args.run_dir, args.tag, args.stage, args.evals, snapshot=args.snapshot)
    except UserError as err:
        print(f"stage-evals: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
