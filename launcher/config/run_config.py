"""Run configuration: one YAML file, parsed once into typed sections; unknown keys rejected by name.

A run config has the sections `model` (a `roformer.RoFormerConfig`, plus `compile`: whether the encoder
layers are compiled, not part of the architecture), `data` (its `masking` a
`data_pipeline.MaskingConfig`), `optimizer`, `schedule` (the schedule file is read at load: its
stages, `total_steps` and `stage_for_step`), `checkpoint`, `logging`, `deepspeed` (those six:
launcher.config.sections), `watchdog`
(launcher.config.watchdog_section) and `guard` (launcher.config.guard_section), plus a top-level
`seed`. Relative paths are resolved against the directory of the config file, so a config works from
any working directory; the resolved config written into a run directory holds absolute paths only.

    cfg = load_run_config("configs/demo_cpu.yaml", ["optimizer.lr=5e-4", "schedule.file=..."])
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from data_pipeline.config import ORDERS
from data_pipeline.documents import DOCUMENT_VIEWS
from data_pipeline.errors import DataError
from launcher.common.io import load_yaml, read_mapping
from launcher.config.branch_from import BranchFrom
from launcher.config.sections import (REMOTE_KEYS, CheckpointSection, DataSection, DeepSpeedSection,
                                      LoggingSection, OptimizerSection, ScheduleSection)
from launcher.config.schedule import (format_tokens, load_schedule, parse_token_count,
                                      run_learning_rate, schedule_pieces, schedule_warnings, steps_to_reach,
                                      tokens_before, wsd_decay_steps)
from launcher.config.guard_section import GuardSection
from launcher.config.hardware_section import HardwareSection
from launcher.config.report_to import parse_report_to
from launcher.config.restarts_section import RestartsSection
from launcher.config.watchdog_section import WatchdogSection
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_text
from launcher.flag_types import MAX_SEED  # numpy's seeds are 32-bit; torch's and Python's take any of these too
from roformer.config import ConfigError, RoFormerConfig, require_finite
from data_pipeline.remote.url import SCHEME, is_remote, parse_location
from launcher.common.local_paths import refuse_url

InitModelReader = Callable[[str, str, "dict | None"], tuple[dict, Path, tuple[str, ...]]]
"""How a config with `init_from` gets DIR's model section: (init_dir, source, the config's model keys) ->
(DIR's model fields, its config.json, the WEIGHT_FIELDS the source lets the run change, e.g. a BERT's
position_encoding). launcher/resolved/init_from.py reads them; parsing reads no model directory."""


COMPILE_SETTINGS = (True, False, "auto")
"""`model.compile`: each encoder layer compiled with torch.compile (true), not (false), or where compiling measured
faster (auto; launcher/train/engine.py compile_layers)."""


@dataclass
class RunConfig:
    model: RoFormerConfig
    """The architecture (the YAML section holds RoFormerConfig fields)."""
    data: DataSection
    optimizer: OptimizerSection
    schedule: ScheduleSection
    checkpoint: CheckpointSection
    logging: LoggingSection
    deepspeed: DeepSpeedSection
    seed: int = 42
    """Seed of the model initialisation and of torch/numpy/python RNGs (dropout)."""
    model_compile: bool | str = "auto"
    """The YAML key `model.compile` (COMPILE_SETTINGS): how the ranks run the model, not what it is, so kept out
    of the RoFormerConfig that checkpoints and exports carry."""
    watchdog: WatchdogSection = field(default_factory=WatchdogSection)
    """Hang watchdog bounds (launcher.config.watchdog_section)."""
    init_from: str = ""
    """A model directory to continue pretraining from (`roformer pretrain --init-from DIR`): our export or
    any transformers RoFormer directory. The model section then comes from DIR's config.json (the `model:`
    keys given here may only change what keeps the weights' shapes, e.g. dropout), its weights are loaded
    on a fresh start, and the data must be tokenized with its tokenizer (launcher/resolved/init_from.py).
    Empty = random initialisation."""
    branch_from: str = ""
    """`RUN_DIR[:TAG]` (`roformer pretrain --branch-from`): start at that run's checkpoint (default: its newest
    complete one) with its weights, optimizer state, data position and RNG, then follow this config's schedule,
    which must be the source's up to the checkpoint's step (launcher/config/branch_from.py). A fresh start
    only: a run directory with a checkpoint resumes from it. Stored with RUN_DIR absolute. Empty = no branch."""
    guard: GuardSection = field(default_factory=GuardSection)
    """The numerics guard: loss spikes, non-finite figures, a stuck fp16 loss scale (launcher.config.guard_section)."""
    restarts: RestartsSection = field(default_factory=RestartsSection)
    """Restarts after a fault and the preemption grace time (launcher.config.restarts_section); read by
    `roformer pretrain` only, so left out of to_dict (the run's recorded config)."""
    hardware: HardwareSection = field(default_factory=HardwareSection)
    """The accelerator the run is meant for, which `roformer plan` and the dry run price it on
    (launcher.config.hardware_section); read by the launching machine only, so left out of to_dict."""
    source: str = ""
    """The file this config came from (for error messages)."""

    @property
    def decay_steps(self) -> int:
        """The WSD decay window in steps (optimizer.decay_steps, else the last stage's steps); 0 for other decays."""
        if self.optimizer.decay != "wsd":
            return 0
        return wsd_decay_steps(self.optimizer.decay_steps, [stage.steps for stage in self.schedule.stages])

    def learning_rate(self, step: int, lr_scale: float = 1.0) -> float:
        """The LR of optimizer step `step` (0-based) under this config's optimizer section and schedule."""
        return run_learning_rate(step, self.optimizer, [stage.steps for stage in self.schedule.stages], lr_scale,
                                 batch=self.schedule.global_batch_at(step))

    def schedule_warnings(self) -> list[str]:
        """The schedule's warnings (launcher/config/schedule.py schedule_warnings), one line each."""
        return schedule_warnings(self.schedule.stages, self.optimizer.batch_scaling, self.optimizer.reference_batch)

    def to_dict(self) -> dict[str, Any]:
        """The YAML form (loads back with run_config_from_dict)."""
        out = dataclasses.asdict(self)
        if out.pop("model_compile") != "auto":  # runs that leave it at auto record what they always did
            out["model"]["compile"] = self.model_compile
        if self.optimizer.decay != "wsd":  # other decays record what they always did
            out["optimizer"].pop("decay_steps")
            out["optimizer"].pop("decay_shape")
        out.pop("source")
        out.pop("restarts")  # the launching machine's business: changing it is no new config version
        out.pop("hardware")  # the same: what plan prices the run on, not what the ranks run
        out["schedule"].pop("stages")
        out["schedule"].pop("pieces")
        for section, key, _ in TOKEN_FIELDS:  # recorded as the steps they resolved to (what the ranks run)
            out[section].pop(key)
        if self.optimizer.batch_scaling == "none" and not self.optimizer.reference_batch:
            out["optimizer"].pop("batch_scaling")  # runs without it record what they always did
            out["optimizer"].pop("reference_batch")
        if not out["init_from"]:
            out.pop("init_from")  # runs that start from random weights record what they always did
        if not out["branch_from"]:
            out.pop("branch_from")  # the same for runs that are no branch
        defaults = DataSection()
        # local, global-order, sequence-attention runs record what they always did
        for key in ("order", "shard_window", "attention", "positions", *REMOTE_KEYS):
            if out["data"][key] == getattr(defaults, key) and (key not in REMOTE_KEYS or not self.data.is_remote):
                out["data"].pop(key)
        return out


SECTIONS: dict[str, type] = {
    "data": DataSection,
    "optimizer": OptimizerSection,
    "schedule": ScheduleSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
    "deepspeed": DeepSpeedSection,
    "watchdog": WatchdogSection,
    "guard": GuardSection,
    "restarts": RestartsSection,
    "hardware": HardwareSection,
}
TOP_LEVEL_SCALARS = ("seed", "init_from", "branch_from")
# Fields holding paths, resolved against the config file's directory.
PATH_FIELDS = {("data", "data_dir"), ("schedule", "file"), ("deepspeed", "config")}


def load_run_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
                    read_init_model: InitModelReader | None = None) -> RunConfig:
    """Read, override (`section.key=value`, value parsed as YAML) and validate a run config.
    read_init_model: how an `init_from` directory's model section is read (launcher/resolved/init_from.py,
    whose load_run_config passes it); without it a config with init_from is refused."""
    path = Path(path)
    raw = read_mapping(path, "run config")
    for item in overrides:
        _apply_override(raw, item, path)
    return run_config_from_dict(raw, source=str(path), base_dir=path.resolve().parent, read_init_model=read_init_model)


def run_config_from_dict(raw: dict, source: str, base_dir: Path,
                         read_init_model: InitModelReader | None = None) -> RunConfig:
    known = set(SECTIONS) | {"model"} | set(TOP_LEVEL_SCALARS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{source}: unknown section(s) {', '.join(map(str, unknown))} "
                        f"(known: {', '.join(sorted(known))})")
    init_from = _init_from(raw.get("init_from", RunConfig.init_from), source, base_dir)
    branch_from = _branch_from(raw.get("branch_from", RunConfig.branch_from), source, base_dir)
    if branch_from and init_from:
        raise UserError(f"{source}: branch_from and init_from: a branch starts from its source's checkpoint, "
                        f"init_from from a model directory; give one of them")
    if raw.get("model") is None and not init_from:
        raise UserError(f"{source}: section 'model' (the RoFormerConfig fields) is required")
    if raw.get("model") is not None and not isinstance(raw["model"], dict):
        raise UserError(f"{source}: section 'model' must be a mapping of RoFormerConfig fields (hidden_size: ..., "
                        f"num_hidden_layers: ...), got {raw['model']!r}")
    model_keys = None if raw.get("model") is None else dict(raw["model"])
    model_compile = _model_compile(model_keys.pop("compile", "auto") if model_keys else "auto", source)
    sections = {name: _build_section(name, cls, raw.get(name) or {}, source, base_dir)
                for name, cls in SECTIONS.items()}
    seed = _check_seed("seed", raw.get("seed", RunConfig.seed), source)
    if init_from and read_init_model is None:  # parsing alone cannot know DIR's model
        raise ValueError(f"{source}: init_from: load it with launcher.resolved.init_from.load_run_config")
    try:
        if init_from:
            base, config_path, free = read_init_model(init_from, source, model_keys)
            model = model_over_init(init_from, base, config_path, model_keys, source, free)
        else:
            model = RoFormerConfig.from_dict(model_keys, source=f"{source}: model")
    except ConfigError as err:
        raise UserError(str(err)) from None
    cfg = RunConfig(model=model, seed=seed, model_compile=model_compile, source=source, init_from=init_from,
                    branch_from=branch_from, **sections)
    _validate(cfg, raw)
    cfg.schedule.stages = tuple(load_schedule(cfg.schedule.file))
    cfg.schedule.pieces = tuple(schedule_pieces(cfg.schedule.stages))
    _resolve_token_fields(cfg, raw)
    _check_decay_window(cfg)
    return cfg


def dump_run_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config (absolute paths) atomically; it loads back with load_run_config."""
    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _build_section(name: str, cls: type, values: Any, source: str, base_dir: Path):
    if not isinstance(values, dict):
        raise UserError(f"{source}: section '{name}' must be a mapping, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UserError(f"{source}: unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)} "
                        f"(known in '{name}': {', '.join(fields)})")
    kwargs = {}
    for key, value in values.items():
        default = fields[key].default if fields[key].default is not dataclasses.MISSING \
            else fields[key].default_factory()
        if dataclasses.is_dataclass(default):
            kwargs[key] = _build_nested(f"{name}.{key}", type(default), value, source)
            continue
        kwargs[key] = _check_type(f"{name}.{key}", value, default, source)
        if (name, key) in PATH_FIELDS and kwargs[key]:
            if (name, key) == ("data", "data_dir") and is_remote(kwargs[key]):
                try:
                    kwargs[key] = SCHEME + str(parse_location(kwargs[key], f"{name}.{key}"))[len(SCHEME):]
                except DataError as err:
                    raise UserError(f"{source}: {err}") from None
                continue
            refuse_url(f"{source}: {name}.{key}", kwargs[key])  # not a folder beside the config named s3:
            expanded = Path(os.path.expandvars(os.path.expanduser(kwargs[key])))
            kwargs[key] = str(expanded if expanded.is_absolute() else (base_dir / expanded).resolve())
    return cls(**kwargs)


def _build_nested(where: str, cls: type, values: Any, source: str):
    """A section field that is itself a dataclass (data.masking): keys named as where.<key>."""
    if not isinstance(values, dict):
        raise UserError(f"{source}: {where}: expected a mapping of {cls.__name__} fields, got {values!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) for k in values if k not in known)
    if unknown:
        raise UserError(f"{source}: {', '.join(f'{where}.{k}' for k in unknown)}: unknown key(s) "
                        f"(known: {', '.join(known)})")
    try:
        return cls(**values)
    except DataError as err:
        raise UserError(f"{source}: data: {err}") from None


# Word values that YAML 1.1 reads as booleans (`action: off` is False): the word the user wrote.
BOOLEAN_WORDS = {"guard.action": {False: "off"}}
SIZE_FIELDS = ("data.cache_limit",)
TOKEN_FIELDS = (("optimizer", "warmup_tokens", "warmup_steps"), ("optimizer", "decay_tokens", "decay_steps"),
                ("checkpoint", "every_tokens", "every_steps"))
"""(section, token count, the steps field it resolves into at load)."""


def _check_type(where: str, value: Any, default: Any, source: str) -> Any:
    """Values must have the type of the field's default (ints are accepted where floats are)."""
    if isinstance(value, bool) and value in BOOLEAN_WORDS.get(where, {}):
        value = BOOLEAN_WORDS[where][value]
    if where in SIZE_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # bytes as a number, or a size with its unit
    if where in {f"{section}.{key}" for section, key, _ in TOKEN_FIELDS} and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        value = repr(value)  # tokens as a number (2.5e9), or a count with its suffix ("2.5B")
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -2**63 <= value < 2**63:  # beyond the int64 torch and numpy hold
            raise UserError(f"{source}: {where}: {value:,} is out of range (a 64-bit integer)")
    elif isinstance(default, float):
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:  # inf and nan refused here, where parsed, not by the numerics guard after the first step
            try:
                value = require_finite(where, value)
            except ConfigError as err:
                raise UserError(f"{source}: {err}") from None
    else:
        ok = isinstance(value, type(default))
    if not ok and value is None and isinstance(default, str):  # YAML reads a bare `~` or `null` as nothing
        raise UserError(f"{source}: {where}: no value (YAML reads a bare ~ or null as none); quote a path: "
                        f"{where.rpartition('.')[2]}: \"~/...\"")
    if not ok:
        raise UserError(f"{source}: {where}: expected {type(default).__name__}, got {value!r}")
    return value


def _model_compile(value: Any, source: str) -> bool | str:
    if value not in COMPILE_SETTINGS or (value in (0, 1) and not isinstance(value, bool)):  # 1 == True in Python
        raise UserError(f"{source}: model.compile: must be true, false or auto, got {value!r}")
    return value




def _check_seed(where: str, seed: Any, source: str) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"{source}: {where}: must be an integer in [0, {MAX_SEED:,}], got {seed!r}")
    return seed


def _validate_data(data: DataSection, fail) -> None:
    if data.order not in ORDERS:
        fail("data.order", f"must be one of {', '.join(ORDERS)}, got {data.order!r}")
    if not 0 <= data.seed <= MAX_SEED:
        fail("data.seed", f"must be an integer in [0, {MAX_SEED:,}], got {data.seed}")
    if data.shard_window < 1:
        fail("data.shard_window", f"must be >= 1 shard, got {data.shard_window}")
    for key in ("attention", "positions"):
        if getattr(data, key) not in DOCUMENT_VIEWS:
            fail(f"data.{key}", f"must be one of {', '.join(DOCUMENT_VIEWS)}, got {getattr(data, key)!r}")
    if data.remote_retries < 0:
        fail("data.remote_retries", f"must be >= 0, got {data.remote_retries}")
    if not data.remote_timeout > 0:
        fail("data.remote_timeout", f"must be > 0 seconds, got {data.remote_timeout}")
    try:
        data.cache_limit_bytes
    except DataError as err:
        fail("data.cache_limit", str(err).split(": ", 1)[1])


def _validate(cfg: RunConfig, given: dict) -> None:
    """given: the config's sections as written (after --set), for a key whose default means 'not set'."""
    src = cfg.source

    def fail(where: str, message: str):
        raise UserError(f"{src}: {where}: {message}")

    if not cfg.data.data_dir:
        fail("data.data_dir", "required (a directory made by `roformer data prepare`)")
    _validate_data(cfg.data, fail)
    if cfg.data.attention == "document" and cfg.model.attention != "softmax":
        fail("data.attention", f"'document' needs model.attention 'softmax' ({cfg.model.attention!r} sums over "
             f"the whole sequence)")
    if not cfg.schedule.file:
        fail("schedule.file", "required (a schedule in launcher/schedules/)")
    if cfg.schedule.max_tokens_per_micro_batch < 0:
        fail("schedule.max_tokens_per_micro_batch", "must be >= 0")
    if not cfg.deepspeed.config:
        fail("deepspeed.config", "required (a JSON in ds_configs/)")
    for key in ("schedule.file", "deepspeed.config"):
        section, name = key.split(".")
        if not Path(getattr(getattr(cfg, section), name)).is_file():
            fail(key, f"file not found: {getattr(getattr(cfg, section), name)}")
    cfg.optimizer.check(fail, given.get("optimizer") or {})
    if cfg.checkpoint.every_steps < 0:
        fail("checkpoint.every_steps", "must be >= 0")
    if cfg.checkpoint.keep_last < 1:
        fail("checkpoint.keep_last", "must be >= 1 (the newest complete checkpoint is always kept)")
    for key in ("log_every", "valid_batches"):
        if getattr(cfg.logging, key) < 1:
            fail(f"logging.{key}", "must be >= 1")
    if cfg.logging.valid_every < 0:
        fail("logging.valid_every", "must be >= 0")
    if cfg.logging.noise_every < 0:
        fail("logging.noise_every", f"must be >= 0 (0 = no gradient noise scale), got {cfg.logging.noise_every}")
    if cfg.logging.progress_every < 0:
        fail("logging.progress_every", f"must be >= 0 (0 = about 20 lines per run), got {cfg.logging.progress_every}")
    if not cfg.logging.peak_tflops >= 0:
        fail("logging.peak_tflops", f"must be >= 0 (0 = table or measured), got {cfg.logging.peak_tflops}")
    cfg.logging.report_to = list(parse_report_to(cfg.logging.report_to))
    if not all(isinstance(x, str) for x in cfg.logging.stage_end_evals):
        fail("logging.stage_end_evals", "must be a list of names")
    cfg.watchdog.check(fail)
    cfg.guard.check(fail)
    cfg.restarts.check(fail)
    cfg.hardware.check(fail)


def _resolve_token_fields(cfg: RunConfig, raw: dict) -> None:
    """warmup_tokens / decay_tokens / every_tokens into their steps fields, through the schedule's token slots
    (needs the schedule, so after it is read)."""
    total = cfg.schedule.total_steps
    run_tokens = tokens_before(cfg.schedule.pieces, total)
    for section, key, steps_key in TOKEN_FIELDS:
        text = getattr(getattr(cfg, section), key)
        if not text:
            continue
        where = f"{cfg.source}: {section}.{key}"
        if steps_key in (raw.get(section) or {}):
            raise UserError(f"{where}: give {section}.{steps_key} or {section}.{key}, not both")
        tokens = parse_token_count(text, where, allow_zero=key != "decay_tokens")  # as warmup_steps / every_steps 0
        if key == "decay_tokens" and cfg.optimizer.decay != "wsd":
            raise UserError(f"{where}: only applies to optimizer.decay: wsd (decay is {cfg.optimizer.decay!r})")
        if tokens > run_tokens:  # every_tokens too: no checkpoint but the stage ends' would ever come of it
            raise UserError(f"{where}: {format_tokens(tokens)} tokens is longer than the run ({run_tokens:,} token "
                            f"slots in {total} steps)")
        if key == "decay_tokens":
            steps = max(1, total - steps_to_reach(cfg.schedule.pieces, run_tokens - tokens))
        else:
            steps = steps_to_reach(cfg.schedule.pieces, tokens)
        setattr(getattr(cfg, section), steps_key, steps)


def _check_decay_window(cfg: RunConfig) -> None:
    """A WSD decay window must fit in the run after warmup (needs the schedule, so after it is read)."""
    if cfg.optimizer.decay != "wsd":
        return
    window, total, warmup = cfg.decay_steps, cfg.schedule.total_steps, cfg.optimizer.warmup_steps
    if window > total - warmup:
        given = "" if cfg.optimizer.decay_steps else f" (not set: the last stage's steps, {window})"
        raise UserError(f"{cfg.source}: optimizer.decay_steps: the decay window of {window} steps{given} is longer "
                        f"than the run after warmup ({total} steps - warmup_steps {warmup} = {total - warmup})")


def _init_from(value: Any, source: str, base_dir: Path) -> str:
    """init_from as an absolute path ('' = none), resolved against the config file's directory."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UserError(f"{source}: init_from: expected a directory path, got {value!r}")
    refuse_url(f"{source}: init_from", value)  # s3:// or hf:// would become a local ./s3:/... directory
    expanded = Path(os.path.expandvars(os.path.expanduser(value)))
    return str(expanded if expanded.is_absolute() else (base_dir / expanded).resolve())


def _branch_from(value: Any, source: str, base_dir: Path) -> str:
    """branch_from as `ABSOLUTE_RUN_DIR[:TAG]` ('' = none), RUN_DIR resolved against the config file's directory."""
    if value is None or value == "":
        return ""
    return str(BranchFrom.parse(value, source, base_dir))


def _apply_override(raw: dict, item: str, path: Path) -> None:
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise UserError(f"--set {item!r}: expected section.key=value")
    try:
        value = load_yaml(text)
    except yaml.YAMLError as err:
        raise UserError(f"--set {item!r}: value is not valid YAML: "
                        f"{getattr(err, 'problem', None) or str(err).splitlines()[0]}") from None
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {item!r}: {part} in {path} is not a section")
        node = child
    if text.strip() in ("null", "Null", "NULL"):  # unsets KEY: its default applies (warmup_steps=null beside
        # warmup_tokens); a bare ~ is not: it is refused where typed for a path (a home directory, unquoted)
        node.pop(parts[-1], None)
        return
    node[parts[-1]] = value


WEIGHT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "embedding_size", "type_vocab_size", "position_encoding", "max_position_embeddings",
                 "pad_token_id")
"""Model fields fixed by DIR's weights: their shapes (sizes, position tables) or their meaning (how the
hidden size splits into heads, which embedding row is padding)."""


def model_over_init(init_dir: str, base: dict, config_path: Path, explicit: dict | None, source: str,
                    free: tuple[str, ...] = ()) -> RoFormerConfig:
    """The model section of a config with `init_from`: DIR's model fields (`base`, read from `config_path`) with the
    run config's `model:` keys (`explicit`, None = no section) laid over them. A key that would give a weight another
    shape or meaning (WEIGHT_FIELDS) is refused when it differs from DIR's, naming both values; the dropouts,
    initializer_range and the RoPE / attention variants may change."""
    values = dict(base)
    for key, value in (explicit or {}).items():
        if key in WEIGHT_FIELDS and key not in free and key in values and value != values[key]:
            raise UserError(f"{source}: model.{key}: {value!r} differs from {values[key]!r} in {config_path} "
                            f"(init_from {init_dir}): it changes the shape or meaning of the weights; drop "
                            f"model.{key} or set it to {values[key]!r}"
                            + (f" (data for it is prepared with `roformer data prepare --tokenizer {init_dir} ...`)"
                               if key == "vocab_size" else ""))
        values[key] = value
    try:
        return RoFormerConfig.from_dict(values, source=f"{source}: model (over {config_path})")
    except ConfigError as err:
        raise UserError(str(err)) from None
