"""Every check of a run's input that needs no process group, used by `roformer plan`, `roformer pretrain`
(also with --dry-run, before anything starts) and every rank at start-up (before the engine exists): what plan
passes, a rank accepts. The checks return findings (notes, the branch point) and keep no data stream: a rank
opens its own (open_streams, from launcher/train/rank.py) and hands it to check_data.

  1. the DeepSpeed config of every stage, parsed by DeepSpeed's own `DeepSpeedConfig` (its pydantic
     models reject e.g. `zero_optimization.stage: 7`), and its precision against the accelerator
     (`get_accelerator().is_fp16_supported()` / `is_bf16_supported()`): resolving the run checks it
     (launcher/resolved/run_setup.py resolve_setup, which check_run calls);
  2. the prepared data: manifest, both splits and the tokenizer, each read once (`data_pipeline.open_corpora`);
     `model.vocab_size` must equal the tokenizer's vocabulary, `model.pad_token_id` its pad id (manifest);
  3. one epoch of the train split holds at least one global batch of every stage;
  4. every stage's `mixture` names sources of the prepared data (and only ones with train documents);
  5. with `init_from`, the data was tokenized with that model's tokenizer (launcher/resolved/init_from.py);
  6. with `branch_from`, the source checkpoint's model, tokenizer, data and schedule up to its step
     (launcher/checkpoint/resume.py; the key parsed in launcher/config/branch_from.py).

The schedule's own rules (e.g. `max_seq_len >= 2`) are checked when the run config is loaded
(launcher/config/schedule.py). Each failure is one line naming the file and the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from data_pipeline import DataError, PretrainBatches, open_corpora
from launcher.checkpoint.resume import BranchPoint, ScannedCheckpoints, check_branch, find_branch_point
from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage
from launcher.common.errors import UserError
from launcher.resolved.init_from import InitSource
from launcher.resolved.run_setup import RunSetup, resolve_setup
from data_pipeline.remote.url import format_size
from data_pipeline.stream import window_cache_need

@dataclass
class Findings:
    """What the checks found beyond a pass."""

    notes: list[str] = field(default_factory=list)
    """What could not be decided on this machine (one line each), for the caller to print."""
    branch: BranchPoint | None = None
    """The branch point, checked (None: no branch, or a branch with checkpoints of its own); rank 0 verifies
    its files at start-up (launcher/checkpoint/resume.py)."""
    own_checkpoints: ScannedCheckpoints | None = None
    """A branch's own checkpoints as scanned here (rank 0's resume decision reuses the scan while unchanged)."""
    setup: RunSetup | None = None
    """What check_run resolved (the ranks resolve the same: launcher/train/rank.py check_inputs)."""
    manifest: dict | None = None
    """The prepared data's manifest.json as check_run read it (`roformer plan`'s tokens per source)."""


def check_run(cfg: RunConfig, stages: list[ResolvedStage], world_size: int, *, ds_json: DeepSpeedJson,
              init: InitSource | None = None, verify_data: bool = False, accelerator_is_the_ranks: bool = True,
              run_dir: Path | None = None) -> Findings:
    """All checks above, on rank 0's view of the data (the launching side: `roformer plan`, `pretrain`);
    UserError / DataError (one line) on the first failure.

    init: the init_from directory as the run config's load read it (init_from.load_config_and_init).
    verify_data: also hash shards changed since they were prepared.
    accelerator_is_the_ranks: this process sees the accelerator the ranks will have (a local run;
    DS_ACCELERATOR set, which the ranks inherit). Otherwise an unsupported precision is a note:
    a login node without GPUs may plan a GPU run.
    run_dir: the run directory, when there is one (a branch that has started keeps its recorded branch point,
    and one with checkpoints of its own resumes from those: branch_from.find_branch_point).
    ds_json: the run's DeepSpeed JSON as the caller read it, once (DeepSpeedJson.of).
    """
    if "mlflow" in cfg.logging.report_to:  # the tracker's address as the ranks will get it (forwarded)
        from launcher.tracking.mlflow_backend import check_tracking_uri

        check_tracking_uri()
    setup, notes = resolve_setup(cfg, init, stages, world_size, ds_json, accelerator_is_the_ranks)
    notes += [note] if (note := warmup_note(cfg)) else []
    train, valid = open_streams(cfg, 0, world_size, verify_data)
    findings = check_data(setup, train, run_dir)
    notes += [line] if (line := cache_line(cfg, train.corpus, valid.corpus)) else []
    findings.notes[:0] = notes
    findings.setup, findings.manifest = setup, train.corpus.manifest
    return findings


def check_data(setup: RunSetup, train: PretrainBatches, run_dir: Path | None = None) -> Findings:
    """Checks 3 to 6 on a training stream (a rank's own, or the launching side's rank 0 view), which is left
    as it was found (no mixture set)."""
    cfg, stages, notes = setup.cfg, setup.stages, []
    for stage in stages:
        train.check_min_size(stage.max_seq_len, stage.global_batch_size)
    check_mixtures(cfg, stages, train)
    if setup.init is not None:  # the data must be tokenized with the starting model's tokenizer
        notes += [note] if (note := check_init_tokenizer(setup.init, train.corpus, cfg.source)) else []
        notes += [note] if (note := init_source_note(setup.init, cfg.model)) else []
    own = ScannedCheckpoints.scan(run_dir) if cfg.branch_from and run_dir is not None else None
    point = find_branch_point(cfg, run_dir, own)  # None: no branch, or a branch with checkpoints of its own
    if point is not None:  # the source's model, data and schedule up to the branch step
        check_branch(cfg, stages, train.corpus, point)
        notes.append(f"a branch of {point.source.run_dir} at {point.tag} (step {point.step:,}, stage "
                     f"'{point.sidecar.stage_name}'): the schedule agrees up to there; this run starts there")
    return Findings(notes, point, own_checkpoints=own)


def check_init_tokenizer(init: InitSource, corpus, source: str) -> str | None:
    """UserError when the data was tokenized with another tokenizer than init_from's; a note (returned)
    when DIR has no tokenizer to compare with (then only model.vocab_size is checked)."""
    if init.tokenizer is None:
        return (f"init_from {init.directory} has no tokenizer (spm.model / tokenizer.json / vocab.txt): cannot "
                f"check that {corpus.data_dir} was tokenized with the model's vocabulary, only its size")
    path, sha = init.tokenizer
    if sha != corpus.tokenizer_sha256:
        raise UserError(f"{source}: data.data_dir {corpus.data_dir} was tokenized with tokenizer "
                        f"{corpus.tokenizer_sha256[:12]} ({corpus.data_dir / 'manifest.json'}), not init_from's "
                        f"{path} ({sha[:12]}): prepare it with `roformer data prepare --tokenizer {init.directory} ...`")
    return None


def init_source_note(init: InitSource, model) -> str | None:
    """The start-up line of a BERT source: what it is continued as (None for a RoFormer source)."""
    if not init.pretrained.is_bert:
        return None
    if model.position_encoding == "rope":
        return (f"init_from {init.directory} is a BERT: continued as RoPE (the default for a BERT), its absolute "
                f"position table of {init.pretrained.raw.get('max_position_embeddings', 512)} rows dropped; "
                f"model.position_encoding: learned keeps it")
    return (f"init_from {init.directory} is a BERT: continued as it is (model.position_encoding: learned, "
            f"{model.max_position_embeddings} positions)")


def warmup_note(cfg: RunConfig) -> str | None:
    """Warm-up as long as the run: the learning rate never reaches its peak nor decays (not refused: the
    tiny test schedules are shorter than a usual warm-up on purpose)."""
    warmup, total = cfg.optimizer.warmup_steps, cfg.schedule.total_steps
    if warmup >= total > 0:
        return (f"{cfg.source}: optimizer.warmup_steps {warmup} is not shorter than the run ({total} steps): the whole "
                f"run is warm-up, the learning rate never reaches optimizer.lr {cfg.optimizer.lr:g} nor decays; "
                f"set optimizer.warmup_steps below {total}")
    return None


def check_mixtures(cfg: RunConfig, stages: list[ResolvedStage], train: PretrainBatches) -> None:
    """Each stage's mixture against the data's named sources (one line naming file, stage and field)."""
    names = train.source_names
    for stage in stages:
        if stage.mixture is None:
            continue
        where = f"{cfg.schedule.file}: stage {stage.index + 1} ({stage.name}): mixture"
        unknown = [source for source, _ in stage.mixture if source not in names]
        if unknown:
            known = (f"it has one source, {names[0]!r} (prepared without --source: name {names[0]!r} or prepare "
                     f"with `roformer data prepare --source NAME=PATH ...`)" if len(names) == 1
                     else f"its sources: {', '.join(names)}")
            raise UserError(f"{where}.{unknown[0]}: no source {unknown[0]!r} in {cfg.data.data_dir}; {known}")
        try:
            train.set_mixture(stage.mixture)
        except DataError as err:
            raise UserError(f"{where}: {err}") from None
    train.set_mixture(None)  # the trainer sets each stage's at its switch


def open_streams(cfg: RunConfig, rank: int, world_size: int, verify: bool = False) -> tuple[PretrainBatches, PretrainBatches]:
    """Rank `rank`'s training and validation streams over data.data_dir (open_data's checks on opening; `verify`:
    also re-hash shards changed since they were prepared). A rank opens and keeps its own; the checks only read."""
    return tuple(PretrainBatches(corpus, rank=rank, world_size=world_size, seed=cfg.data.seed, masking=cfg.data.masking,
                                 order=cfg.data.order, shard_window=cfg.data.shard_window)
                 for corpus in open_data(cfg, verify))


def open_data(cfg: RunConfig, verify: bool):
    """The train and valid splits of data.data_dir (manifest, shards, tokenizer; DataError names the
    file) and model.vocab_size against the tokenizer's vocabulary."""
    data_dir = cfg.data.data_dir if cfg.data.is_remote else Path(cfg.data.data_dir)
    if not cfg.data.is_remote and not data_dir.is_dir():
        raise UserError(f"{cfg.source}: data.data_dir: {data_dir} is not a directory "
                        f"(make it with `roformer data prepare --out {data_dir}`)")
    options = cfg.data.remote_options() if cfg.data.is_remote else None
    train, valid = open_corpora(data_dir, ("train", "valid"), verify=verify, remote_options=options)
    check_vocab_size(cfg, train)
    check_pad_id(cfg, train)
    check_cache_limit(cfg, train, valid)
    return train, valid


def cache_line(cfg: RunConfig, train, valid) -> str | None:
    """`roformer plan`'s line on remote data: the corpus against the cache limit, and the order that needs."""
    if not cfg.data.is_remote:
        return None

    corpus, limit = train.token_bytes + valid.token_bytes, cfg.data.cache_limit_bytes
    fits = not limit or corpus <= limit
    return (f"data: {cfg.data.data_dir}: corpus {format_size(corpus)} (train {format_size(train.token_bytes)}, valid "
            f"{format_size(valid.token_bytes)}) against data.cache_limit "
            f"{format_size(limit) if limit else 'none'} in {cfg.data.remote_options().cache_root}: "
            + ("the cache holds the whole corpus, data.order global reads it bit for bit as a local copy" if fits else
               f"the cache holds part of it: data.order shard_window (windows of {cfg.data.shard_window} shards)"))


def check_cache_limit(cfg: RunConfig, train, valid) -> None:
    """Remote data in global order touches every shard every few steps: the cache must hold the whole corpus;
    in shard_window order it holds two windows per stream at once (data_pipeline.stream.window_cache_need)."""
    limit = cfg.data.cache_limit_bytes
    if not cfg.data.is_remote or not limit:
        return
    if cfg.data.order == "shard_window":
        need = window_cache_need(train, valid, cfg.data.shard_window)
        if need > limit:
            raise UserError(f"{cfg.source}: data.cache_limit {limit:,} bytes is smaller than what data.order shard_window "
                            f"holds at once at {cfg.data.data_dir}: two windows of data.shard_window "
                            f"{cfg.data.shard_window} shards for each source and for validation, {need:,} bytes: raise "
                            f"data.cache_limit or lower data.shard_window")
        return
    corpus = train.token_bytes + valid.token_bytes
    if corpus > limit:
        raise UserError(f"{cfg.source}: data.cache_limit {limit:,} bytes is smaller than the corpus at "
                        f"{cfg.data.data_dir} ({corpus:,} bytes of shards) and data.order is global, which reads every "
                        f"shard every few steps: set data.order: shard_window, or a cache_limit of at least {corpus:,}")


def check_vocab_size(cfg: RunConfig, corpus) -> None:
    """The embedding must have exactly one row per tokenizer piece: fewer rows cannot embed every id;
    more rows are never fed, yet the MLM softmax spreads probability over them and the export's
    model and tokenizer would disagree."""
    model_size, tokenizer_size = cfg.model.vocab_size, corpus.vocab_size
    if model_size == tokenizer_size:
        return
    spm = corpus.data_dir / corpus.manifest["tokenizer"]["path"]
    relation = "smaller" if model_size < tokenizer_size else "larger"
    if cfg.init_from:  # the size is the starting model's (its weights): the data is what must change
        raise UserError(f"{cfg.source}: data.data_dir {corpus.data_dir} was tokenized with a vocabulary of "
                        f"{tokenizer_size} pieces ({spm}), init_from {cfg.init_from} has {model_size}: prepare the "
                        f"data with `roformer data prepare --tokenizer {cfg.init_from} ...`")
    raise UserError(f"{cfg.source}: model.vocab_size {model_size} is {relation} than the tokenizer's vocabulary "
                    f"({tokenizer_size} pieces in {spm}); it must equal it: set model.vocab_size: {tokenizer_size}")


def check_pad_id(cfg: RunConfig, corpus) -> None:
    """The model's padding row must be the id the batches pad with (the tokenizer's [PAD], manifest)."""
    pad = corpus.special_ids.pad_token
    if cfg.model.pad_token_id != pad:
        raise UserError(f"{cfg.source}: model.pad_token_id {cfg.model.pad_token_id} is not the tokenizer's pad id "
                        f"{pad} ({corpus.data_dir / 'manifest.json'}, special_ids.pad_token): set "
                        f"model.pad_token_id: {pad}")
