"""`roformer finetune EXPORT (--task NAME | --task-spec FILE | --train FILE ...)`: the command line of
launcher.downstream.fine_tuning.

Settings come from, in order of precedence: the command line, the task spec (YAML), the defaults.
The console gets one progress bar per seed (stderr) and a short table (stdout); the JSON report goes
only to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from launcher.common.errors import UserError
from launcher.flag_types import MAX_SEED, open_fraction, seed_int

# FinetuneConfig fields a task spec may set: their command-line default is None ("not given").
SPEC_SETTINGS = ("max_length", "epochs", "lr", "batch_size", "select_metric")
OWN_FILE_FLAGS = ("dev", "test", "dev_fraction", "text_column", "text_pair_column", "label_column", "task_type",
                  "negative_column", "corpus", "corpus_text_column")


def configure(parser: argparse.ArgumentParser) -> None:
    from launcher.downstream.fine_tuning import _HELP, INITS, FinetuneConfig
    from launcher.downstream.tasks import TASKS
    from launcher.outputs.gate import FINETUNE_REPORT, MODEL, PREDICTIONS, add_output

    parser.add_argument("export_dir", type=Path, help="export directory (roformer export --out) or any "
                                                      "transformers RoFormer directory with a tokenizer")
    task = parser.add_argument_group("the task (one of --task, --task-spec, --train)")
    task.add_argument("--task", help=f"a bundled task: {', '.join(TASKS)} (default: none)")
    task.add_argument("--task-data", type=Path, default=None,
                      help="bundled task files root (default: $ROFORMER_DATA_DIR/tasks or ~/.cache/roformer-ds/data/tasks)")
    task.add_argument("--task-spec", type=Path, help="a task spec YAML file (files, columns, task type, settings; "
                                                     "docs/finetune.md; default: none)")
    task.add_argument("--train", type=Path, help="your labelled training file: .csv, .tsv, .jsonl/.json or .parquet (default: none)")
    task.add_argument("--dev", type=Path, help="your dev file (model selection; default: none, then give --dev-fraction)")
    task.add_argument("--test", type=Path, help="your test file (default: none; dev is then the held-out split)")
    task.add_argument("--dev-fraction", type=open_fraction, help="hold out this share of --train as dev, instead of a --dev file (default: none)")
    task.add_argument("--text-column", default=None, help="text column of your files (default: text)")
    task.add_argument("--text-pair-column", default=None, help="second text column: a text-pair task; retrieval: "
                                                               "the relevant passage (default: none, single texts)")
    task.add_argument("--label-column", default=None, help="label column (default: label)")
    task.add_argument("--task-type", choices=("classification", "regression", "retrieval"), default=None,
                      help="default: inferred from train's labels (floating-point numbers: regression); retrieval: "
                           "rows are (query --text-column, relevant passage --text-pair-column) pairs, no labels")
    task.add_argument("--negative-column", default=None,
                      help="retrieval: a hard-negative passage per row (default: none, in-batch negatives only)")
    task.add_argument("--corpus", type=Path, default=None,
                      help="retrieval: a file of extra passages every dev/test query is also ranked against (default: none)")
    task.add_argument("--corpus-text-column", default=None, help="retrieval: the --corpus file's passage column (default: text)")

    defaults = FinetuneConfig.__dataclass_fields__
    for name, help_text in _HELP.items():
        default = defaults[name].default
        kind = float if isinstance(default, float) else int
        shown = f"default: the task spec's, else {default}" if name in SPEC_SETTINGS else f"default: {default}"
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind,
                            default=None if name in SPEC_SETTINGS else default, help=f"{help_text} ({shown})")
    parser.add_argument("--select-metric", default=None,
                        help="dev metric that picks the epoch and the saved model: accuracy, macro_f1, mcc | pearson, "
                             "spearman, mse, mae | ndcg@10, mrr@10, recall@1, recall@10, map@100 (default: macro_f1 "
                             "for classification, pearson for regression, ndcg@10 for retrieval)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", default=None, help="comma-separated seeds, one fine-tune each; the report gives "
                                                    "mean, min, max and n of every metric (default: 0)")
    seeds.add_argument("--seed", type=seed_int, default=None, help="one seed, the same as --seeds N (default: 0)")
    parser.add_argument("--init", choices=INITS, default="pretrained",
                        help="encoder weights: the export's (pretrained) or its random-init twin: same architecture "
                             "and tokenizer, freshly initialised (default: pretrained)")
    parser.add_argument("--compare-random-init", action="store_true",
                        help="also fine-tune the random-init twin with the same settings and seeds, shown side by "
                             "side (the JSON report gets a 'random_init' entry)")
    parser.add_argument("--dropout", type=float, default=None,
                        help="hidden and attention dropout while fine-tuning (default: the export's config)")
    parser.add_argument("--report-to", type=_report_to, default=(), metavar="LIST",
                        help="trackers for this fine-tune: mlflow, wandb (comma-separated; one tracked run per job, "
                             "tagged with the export and the pretraining run it came from; docs/training.md#trackers) "
                             "(default: none)")
    add_output(parser, "--out", FINETUNE_REPORT, default=None,
               help="write the JSON report to this file: a new one, or one finetune wrote before, unchanged "
                    "(default: none; the console shows a table only)")
    add_output(parser, "--save-model", MODEL, default=None,
                        help="save the best model (best seed, best epoch) as a transformers directory with its "
                             "tokenizer, for pipeline('text-classification', model=DIR); retrieval: a sentence-transformers "
                             "directory, for SentenceTransformer(DIR); must not exist yet (default: none)")
    add_output(parser, "--predictions", PREDICTIONS, default=None,
               help="write the held-out predictions (.csv, .tsv or .jsonl: row, prediction, label; retrieval: "
                    "the top 10 passages per query: row, query, rank, passage, score, relevant): a new file, or one "
                    "finetune wrote before, unchanged (default: none)")


def task_spec_from_args(args: argparse.Namespace):
    """The TaskSpec the flags describe; errors name the flag."""
    from launcher.downstream.task_spec import TaskSpec, load_task_spec
    from launcher.downstream.tasks import bundled_spec, get_task

    chosen = [flag for flag, value in (("--task", args.task), ("--task-spec", args.task_spec), ("--train", args.train))
              if value is not None]
    if len(chosen) != 1:
        raise UserError("give exactly one of --task NAME, --task-spec FILE or --train FILE"
                        + (f" (got {' and '.join(chosen)})" if chosen else ""))
    given = [f"--{k.replace('_', '-')}" for k in OWN_FILE_FLAGS if getattr(args, k) is not None]
    if args.train is None and given:
        raise UserError(f"{given[0]}: only with --train (a task spec file names its own files and columns)")
    if args.task is not None:
        get_task(args.task)  # unknown task -> error listing the known ones, before the export is read
        return bundled_spec(args.task, args.task_data)
    if args.task_spec is not None:
        return load_task_spec(args.task_spec)
    return TaskSpec(name=args.train.stem, train=args.train, dev=args.dev, test=args.test,
                    dev_fraction=args.dev_fraction, text_column=args.text_column or "text",
                    text_pair_column=args.text_pair_column, label_column=args.label_column or "label",
                    task_type=args.task_type, negative_column=args.negative_column, corpus=args.corpus,
                    corpus_text_column=args.corpus_text_column or "text")


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--seeds: expected comma-separated integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds: {text!r} repeats a seed")
    if any(not 0 <= seed <= MAX_SEED for seed in seeds):
        raise UserError(f"--seeds: {text!r}: each seed must be an integer in [0, {MAX_SEED:,}]")
    return seeds


def config_from_args(args: argparse.Namespace):
    from launcher.downstream.fine_tuning import FinetuneConfig

    spec = task_spec_from_args(args)
    fields = {k: getattr(args, k) for k in FinetuneConfig.__dataclass_fields__
              if hasattr(args, k) and k not in ("task", "seeds")}
    for key in SPEC_SETTINGS:  # command line > task spec > FinetuneConfig default
        if fields.get(key) is None:
            fields.pop(key, None)
            if key in spec.settings:
                fields[key] = spec.settings[key]
    seeds = parse_seeds(args.seeds) if args.seeds is not None else (args.seed,) if args.seed is not None else (0,)
    return FinetuneConfig(task=spec, seeds=seeds, keep_best_state=args.save_model is not None, **fields)


def _report_to(value: str) -> tuple[str, ...]:
    from launcher.config.report_to import parse_report_to

    try:
        names = parse_report_to(value, "--report-to")
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--report-to: ")) from None
    if "tensorboard" in names:  # accepted before and nothing written: a promise not kept
        raise argparse.ArgumentTypeError("tensorboard: a fine-tune writes no TensorBoard files; its trackers are "
                                         "mlflow and wandb (the JSON report: --out)")
    if "mlflow" in names:  # before any fine-tuning, not after it when the report is sent
        from launcher.tracking.mlflow_backend import check_tracking_uri

        try:
            check_tracking_uri()
        except UserError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return names


def run(args: argparse.Namespace) -> int:
    from launcher.downstream.finetune_report import check_outputs
    from launcher.outputs.output_paths import writer_locks

    cfg = config_from_args(args)
    if args.compare_random_init and cfg.init != "pretrained":
        raise UserError("--compare-random-init compares the pretrained export with its twin: drop --init random")
    check_finetune_paths(args, cfg.task)
    check_outputs(args.save_model, args.predictions)
    check_model_space(args)
    outputs = {"--out": args.out, "--predictions": args.predictions, "--save-model": args.save_model}
    with writer_locks(outputs, "roformer finetune"):  # one writer per output (launcher/outputs/output_paths.py)
        return finetune_and_write(args, cfg)


def finetune_and_write(args: argparse.Namespace, cfg) -> int:
    """Fine-tune (every seed, and the random-init twin if asked), then write the table and the outputs."""
    from launcher.downstream.fine_tuning import run_finetune
    from launcher.downstream.finetune_report import console_table, save_model, write_predictions
    from launcher.common.io import atomic_write_json
    from launcher.outputs.gate import FINETUNE_REPORT, PREDICTIONS
    from launcher.outputs.written import record_written

    report, chosen, data, tokenizer, evals = run_finetune(cfg)
    same = same_file_note(cfg.task)
    if same:
        print(f"finetune: warning: {same}", file=sys.stderr)
    if args.compare_random_init:
        report["random_init"] = run_finetune(dataclasses.replace(cfg, init="random", keep_best_state=False))[0]
    print(console_table(report))
    held_out = "test" if "test" in evals else "dev"
    if cfg.task.task_type == "retrieval":
        _retrieval_outputs(args, cfg, chosen, evals[held_out], held_out)
    elif args.predictions is not None:
        write_predictions(args.predictions, data, evals[held_out], chosen.held_out_predictions)
        print(f"finetune: {held_out} predictions of seed {chosen.report['seed']} -> {args.predictions}", file=sys.stderr)
    if args.save_model is not None and cfg.task.task_type != "retrieval":
        from launcher.export.export_reader import load_classifier

        model = load_classifier(cfg.export_dir, data.num_labels, random_init=cfg.init == "random", dropout=cfg.dropout)
        model.load_state_dict(chosen.best_state)
        save_model(model, cfg.export_dir, tokenizer, data, args.save_model)
        print(f"finetune: model of seed {chosen.report['seed']} (epoch {chosen.report['best_epoch']}) -> "
              f"{args.save_model}", file=sys.stderr)
    if args.report_to:
        from launcher.tracking.finetune_run import report_finetune

        options = {k: str(v) for k, v in vars(args).items() if v is not None and k not in ("func", "report_to")}
        report["trackers"] = report_finetune(args.report_to, cfg.export_dir, options, report, [])
    if args.predictions is not None:
        record_written(args.predictions, PREDICTIONS.name, PREDICTIONS.made_by)
    if args.out is not None:
        atomic_write_json(args.out, report)
        record_written(args.out, FINETUNE_REPORT.name, FINETUNE_REPORT.made_by)
        print(f"finetune: JSON report -> {args.out}", file=sys.stderr)
    else:
        print("finetune: no JSON report written (pass --out FILE for one)", file=sys.stderr)
    return 0


def check_finetune_paths(args: argparse.Namespace, spec) -> None:
    """Every output against the export, the task's files and the other outputs (launcher/outputs/output_paths.py;
    each output's own rule: launcher/outputs/gate.py, run by launcher/cli.py)."""
    from launcher.outputs.output_paths import check_paths

    check_paths({"EXPORT": args.export_dir, "--task-spec": args.task_spec, "--train": spec.train, "--dev": spec.dev,
                 "--test": spec.test, "--corpus": spec.corpus},
                {"--out": args.out, "--predictions": args.predictions, "--save-model": args.save_model})


def check_model_space(args: argparse.Namespace) -> None:
    """--save-model: room for the model (about the export's weights and tokenizer files) before the compute,
    not a full disk after it."""
    from launcher.common.size_checks import check_free_space

    if args.save_model is None:
        return
    export = Path(args.export_dir)
    need = sum(f.stat().st_size for f in export.iterdir() if f.is_file()) if export.is_dir() else 0
    check_free_space("--save-model", args.save_model, need, "the model (about the size of the export's files)")


def same_file_note(spec) -> str | None:
    """Dev (or test) read from the train file measures training examples, not held-out ones."""
    train = Path(spec.train).resolve()
    for flag, path in (("--dev", spec.dev), ("--test", spec.test)):
        if path is not None and Path(path).resolve() == train:
            return (f"{flag} {path} is the --train file: its scores are on training examples, not held-out "
                    f"ones (give another file, or --dev-fraction)")
    return None


def _retrieval_outputs(args: argparse.Namespace, cfg, chosen, held_out_split, held_out: str) -> None:
    from launcher.downstream.retrieval import save_sentence_model, write_rankings

    seed = chosen.report["seed"]
    if args.predictions is not None:
        write_rankings(args.predictions, held_out_split, chosen.held_out_predictions)
        print(f"finetune: {held_out} top-10 passages per query of seed {seed} -> {args.predictions}", file=sys.stderr)
    if args.save_model is not None:
        save_sentence_model(cfg, chosen, args.save_model)
        print(f"finetune: sentence-transformers model of seed {seed} (epoch {chosen.report['best_epoch']}) -> "
              f"{args.save_model}", file=sys.stderr)
