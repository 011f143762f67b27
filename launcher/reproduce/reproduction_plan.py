"""What the paper reproduction runs: its parts, the runs of each part, and the two presets.

Every run is an ordinary `roformer pretrain` run directory or `roformer finetune` JSON report under one
output directory (OUT/data*, runs/, finetune/, schedules/, eval/, logs/, report/), so an interrupted
reproduction resumes and finished runs are skipped. What each part compares (encodings, linear, lengths,
downstream, extension, recipes, retrieval, from-bert) and the presets: docs/reproduction/README.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.common.io import read_mapping
from launcher.reproduce import documents_part, from_bert_part, retrieval_part, schedules_part
from launcher.reproduce.documents_part import DocumentsPart
from launcher.reproduce.from_bert_part import FromBert
from launcher.reproduce.retrieval_part import RetrievalProtocol
from launcher.reproduce.schedules_part import SchedulesPart
from launcher.run_dir.layout import tag_for_step

PARTS = ("encodings", "linear", "lengths", "downstream", "extension", "recipes", "retrieval", "from-bert", "documents",
         "schedules")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PretrainRun:
    """One `roformer pretrain` run (and its export when a fine-tune needs it)."""

    name: str
    """Run directory name under OUT/runs/ (also the label in plots)."""
    config: Path
    """Run config YAML."""
    overrides: tuple[str, ...]
    """`--set section.key=value` items on top of the config (encoding, attention, seed, preset size)."""
    group: str
    """What the run is compared as: e.g. "rope", "sinusoidal", "linear+rope", "recipe"."""
    seed: int
    data: str = "data"
    """Prepared data directory name under OUT/ ("data" or "data-recipe")."""
    schedule: tuple[dict, ...] | None = None
    """Stages the harness writes to OUT/schedules/<name>.yaml and sets as schedule.file (None: the config's)."""
    init_from: str | None = None
    """Name of the PretrainRun whose export this run starts from (`--init-from`; None: random init)."""


@dataclass(frozen=True)
class FinetuneRun:
    """One `roformer finetune` job on a pretraining run's export (or on its random-init twin)."""

    pretrain: str
    """Name of the PretrainRun whose export is fine-tuned."""
    task: str
    init: str
    """"pretrained" or "random" (the twin: same architecture and tokenizer, fresh weights)."""
    budget: int | None
    """Labelled training examples (a seeded subset); None = the whole training split."""
    max_length: int
    seed: int
    part: str
    """"lengths" or "downstream" (their protocols differ, so each part has its own jobs)."""
    args: tuple[str, ...] = ()
    """Further finetune flags of the preset (epochs, lr, batch size, eval subset)."""

    @property
    def name(self) -> str:
        budget = "all" if self.budget is None else str(self.budget)
        return f"{self.part}-{self.pretrain}-{self.init}-{self.task}-n{budget}-L{self.max_length}-s{self.seed}"


@dataclass(frozen=True)
class EvalRun:
    """One masked-LM evaluation of a pretraining run's checkpoint at several lengths (extension part)."""

    pretrain: str
    """Name of the PretrainRun whose checkpoint is evaluated."""
    variant: str
    """"same-theta", "larger-theta" or "no-extension"."""
    seed: int
    tag: str | None
    """Checkpoint tag (None: the latest); "no-extension" is the same-theta run before its last stage."""
    seq_lens: tuple[int, ...]
    tokens: int
    part: str = "extension"
    attention: str = "sequence"
    """How packed documents are seen: "sequence" (as packed) or "document" (each alone; documents part)."""

    @property
    def name(self) -> str:
        view = "" if self.attention == "sequence" else f"-{self.attention}-view"
        return f"{self.part}-{self.variant}-s{self.seed}{view}"


@dataclass(frozen=True)
class Extension:
    """The extension part: base stages, one long last stage, and the RoPE base of each variant."""

    base: tuple[dict, ...]
    """Stages before the extension (schedule-file entries)."""
    stage: dict
    """The extension stage without rope_theta (name, max_seq_len, global_batch_size, steps)."""
    larger_theta: float
    """rope_theta of variant (b); variant (a) keeps the model's (10000)."""
    seeds: tuple[int, ...]
    eval_lens: tuple[int, ...]
    eval_tokens: int = 32768

    def schedule(self, variant: str) -> tuple[dict, ...]:
        theta = {"same-theta": {}, "larger-theta": {"rope_theta": self.larger_theta}}[variant]
        return (*self.base, {**self.stage, **theta})

    @property
    def base_end_tag(self) -> str:
        """Checkpoint at the end of the base stages (stage ends always save): variant (c)."""
        return tag_for_step(sum(stage["steps"] for stage in self.base))


@dataclass(frozen=True)
class RecipeAblation:
    """The recipes part: two one-factor changes of the RoPE ablation run (its config and schedule)."""

    mask_probs: tuple[float, ...]
    """mask_prob of each stage of the preset's ablation schedule in the annealed variant."""
    seeds: tuple[int, ...]
    decay_shape: str = "1-sqrt"
    """The WSD variant's decay shape; its window is the last stage (optimizer.decay_steps unset)."""

    def annealed_schedule(self, schedule_file: Path) -> tuple[dict, ...]:
        """The stages of `schedule_file` with this part's mask rate per stage."""
        stages = yaml.safe_load(schedule_file.read_text(encoding="utf-8"))["stages"]
        if len(stages) != len(self.mask_probs):
            raise ValueError(f"{schedule_file}: {len(stages)} stages, but {len(self.mask_probs)} mask rates planned")
        return tuple({**stage, "mask_prob": rate} for stage, rate in zip(stages, self.mask_probs))


@dataclass(frozen=True)
class RecipeComparison:
    """The recipes part's shipped-recipe comparison: a three-phase run at the recipe's scale (equal tokens)
    against the recipe run and its random-init twin, fine-tuned on each task at one label budget."""

    config: Path
    """Run config of the three-phase run (the recipe's model, corpus, lengths, batches and steps)."""
    budget: int
    """Labelled training examples of the fine-tunes."""
    name: str = "recipe-three-phase"


@dataclass(frozen=True)
class TaskProtocol:
    """How one task is fine-tuned in the downstream part (the same for the export and its twin)."""

    max_length: int
    args: tuple[str, ...]
    """finetune flags (epochs, lr, ...), chosen on the dev split, never on test."""
    full_budget_args: tuple[str, ...] = ()
    """Flags appended when fine-tuning on the whole training split (later flags win: e.g. fewer
    epochs, since 5x more examples per epoch need fewer passes and cost 5x more per pass)."""

    def args_for(self, budget: int | None) -> tuple[str, ...]:
        return self.args if budget is not None else (*self.args, *self.full_budget_args)


@dataclass(frozen=True)
class Preset:
    """Sizes of a reproduction: `full` (the documented result) or `quick` (the test suite's check)."""

    name: str
    prepare_args: tuple[str, ...]
    """`roformer data prepare` arguments besides --out (corpus and tokenizer) of OUT/data."""
    recipe_prepare_args: tuple[str, ...] | None
    """The same for OUT/data-recipe, the recipe's own corpus; None = the recipe trains on OUT/data."""
    ablation_config: Path
    """Run config of the encodings and linear parts."""
    recipe_config: Path | None
    """Run config of the recipe pretraining whose export the lengths and downstream parts use; None:
    use the first RoPE run of the encodings part instead (the quick preset saves a pretraining run)."""
    pretrain_seeds: tuple[int, ...]
    finetune_seeds: tuple[int, ...]
    lengths_seeds: tuple[int, ...]
    """Fine-tuning seeds of the lengths part (a 1024-token inews fine-tune at 1000 labels took 12.5 CPU-minutes here)."""
    label_budgets: tuple[int | None, ...]
    tasks: dict[str, TaskProtocol]
    lengths: tuple[int, ...]
    """inews maximum lengths of the lengths part."""
    lengths_budget: int | None
    lengths_args: tuple[str, ...]
    absolute_positions: int = 1024
    """Table size of the sinusoidal / learned encodings (>= the ablation schedule's longest length)."""
    num_ranks: int = 2
    overrides: tuple[str, ...] = ()
    """`--set` items applied to every pretraining run (the quick preset shrinks model and schedule)."""
    finetune_jobs: int = 2
    """Fine-tunes run side by side (each uses one thread)."""
    pretrain_jobs: int = 1
    """Pretraining runs side by side (only sensible with one rank each: the quick preset)."""
    recipe_seeds: tuple[int, ...] = (0,)
    """Pretraining seeds of the recipe (the downstream part fine-tunes each one's export)."""
    extension: Extension | None = None
    """The extension part (None: the preset has none)."""
    recipes: RecipeAblation | None = None
    """The recipes part (None: the preset has none)."""
    recipe_comparison: RecipeComparison | None = None
    """The recipes part's comparison with the recipe run (None: none; needs recipe_config)."""

    def compares_recipe(self, parts: tuple[str, ...]) -> bool:
        return "recipes" in parts and self.recipe_comparison is not None and self.recipe_config is not None

    @property
    def exported_runs(self) -> set[str]:
        """Pretraining runs whose export is fine-tuned: the recipe runs and the three-phase comparison run."""
        return {*self.recipe_runs, *((self.recipe_comparison.name,) if self.recipe_comparison else ())}

    def exported(self, parts: tuple[str, ...]) -> set[str]:
        """exported_runs, plus the from-bert part's (its learned runs' BERTs and its variants) when it runs."""
        return (self.exported_runs | (from_bert_part.exported_runs(self) if "from-bert" in parts else set())
                | (documents_part.exported_runs(self) if "documents" in parts else set())
                | (schedules_part.exported_runs(self) if "schedules" in parts else set()))

    @property
    def ablation_schedule(self) -> Path:
        """The schedule file every ablation run trains (a preset's schedule.file override, else the config's)."""
        for item in reversed(self.overrides):
            if item.startswith("schedule.file="):
                return Path(item.partition("=")[2])
        schedule = Path(read_mapping(self.ablation_config, "run config")["schedule"]["file"])
        return schedule if schedule.is_absolute() else self.ablation_config.parent / schedule
    retrieval: RetrievalProtocol | None = None
    """The retrieval part's protocol (None: the preset has none)."""
    from_bert: FromBert | None = None
    """The from-bert part's sizes (None: the preset has none)."""
    documents: DocumentsPart | None = None
    """The documents part's sizes (None: the preset has none)."""
    schedules: SchedulesPart | None = None
    """The schedules part's sizes (None: the preset has none)."""
    default_parts: tuple[str, ...] = PARTS
    """The parts run without --parts."""

    @property
    def recipe_run(self) -> str:
        """Name of the pretraining run whose export the lengths part fine-tunes (the first recipe seed)."""
        return self.recipe_runs[0]

    @property
    def recipe_runs(self) -> tuple[str, ...]:
        """One pretraining run per recipe seed: "recipe" (seed 0, the name runs have always had),
        "recipe-s<seed>"; without a recipe config, the RoPE ablation runs of those seeds stand in."""
        if self.recipe_config is None:
            return tuple(f"rope-s{seed}" for seed in self.recipe_seeds)
        return tuple("recipe" if seed == 0 else f"recipe-s{seed}" for seed in self.recipe_seeds)

    def pretrain_runs(self, parts: tuple[str, ...]) -> list[PretrainRun]:
        runs: list[PretrainRun] = []
        variants = {"encodings": [("rope", "softmax"), ("sinusoidal", "softmax"), ("learned", "softmax")],
                    "linear": [("rope", "linear"), ("sinusoidal", "linear")]}
        needs_recipe = ("lengths" in parts or "downstream" in parts or self.compares_recipe(parts)
                        or ("retrieval" in parts and self.retrieval is not None))
        # Recipe runs the parts need: the lengths part only the first seed's, downstream every seed's.
        wanted = set(self.recipe_runs if "downstream" in parts else self.recipe_runs[:1]) if needs_recipe else set()
        for part in ("encodings", "linear"):
            if part not in parts and not (part == "encodings" and needs_recipe and self.recipe_config is None):
                continue
            for encoding, attention in variants[part]:
                group = encoding if attention == "softmax" else f"linear+{encoding}"
                table = () if encoding == "rope" else (f"model.max_position_embeddings={self.absolute_positions}",)
                seeds = self.pretrain_seeds if part in parts else ()
                if self.recipe_config is None and group == "rope":
                    seeds = tuple(dict.fromkeys((*seeds, *self.recipe_seeds)))  # stand-ins of the recipe seeds
                for seed in seeds:
                    if part not in parts and f"{group}-s{seed}" not in wanted:
                        continue  # only the recipe's stand-ins
                    compared = part in parts and seed in self.pretrain_seeds  # else a stand-in only
                    runs.append(PretrainRun(
                        name=f"{group.replace('+', '-')}-s{seed}", config=self.ablation_config,
                        group=group if compared else "recipe", seed=seed,
                        overrides=(*self.overrides, f"model.position_encoding={encoding}",
                                   f"model.attention={attention}", *table, f"seed={seed}")))
        if needs_recipe and self.recipe_config is not None:
            for seed, name in zip(self.recipe_seeds, self.recipe_runs):
                if name in wanted:
                    runs.append(PretrainRun(name=name, config=self.recipe_config, group="recipe", seed=seed,
                                            overrides=(*self.overrides, f"seed={seed}"),
                                            data="data" if self.recipe_prepare_args is None else "data-recipe"))
        if "extension" in parts and self.extension is not None:
            for variant in ("same-theta", "larger-theta"):
                for seed in self.extension.seeds:
                    # keep_last: the checkpoint before the extension stage is variant (c)'s model
                    runs.append(PretrainRun(
                        name=f"extension-{variant}-s{seed}", config=self.ablation_config, group=f"extension-{variant}",
                        seed=seed, schedule=self.extension.schedule(variant),
                        overrides=(*self.overrides, "model.position_encoding=rope", "model.attention=softmax",
                                   "checkpoint.keep_last=20", f"seed={seed}")))
        if "recipes" in parts and self.recipes is not None:
            runs += self._recipe_ablation_runs({run.name for run in runs})
        if "from-bert" in parts and self.from_bert is not None:
            runs += from_bert_part.pretrain_runs(self, PretrainRun, {run.name for run in runs})
        if "documents" in parts and self.documents is not None:
            runs += documents_part.pretrain_runs(self, PretrainRun, {run.name for run in runs})
        if "schedules" in parts and self.schedules is not None:
            runs += schedules_part.pretrain_runs(self, PretrainRun, {run.name for run in runs})
        if self.compares_recipe(parts):
            runs.append(PretrainRun(name=self.recipe_comparison.name, config=self.recipe_comparison.config,
                                    group=self.recipe_comparison.name, seed=0, overrides=(*self.overrides, "seed=0"),
                                    data="data" if self.recipe_prepare_args is None else "data-recipe"))
        return runs

    def _recipe_ablation_runs(self, planned: set[str]) -> list[PretrainRun]:
        """The recipes part's runs: the RoPE ablation runs (unless another part plans them) and its two variants."""
        rope = (*self.overrides, "model.position_encoding=rope", "model.attention=softmax")
        annealed = self.recipes.annealed_schedule(self.ablation_schedule)
        runs = []
        for seed in self.recipes.seeds:
            if f"rope-s{seed}" not in planned:  # the same run as the encodings part's rope group
                runs.append(PretrainRun(name=f"rope-s{seed}", config=self.ablation_config, group="rope", seed=seed,
                                        overrides=(*rope, f"seed={seed}")))
            runs.append(PretrainRun(name=f"wsd-s{seed}", config=self.ablation_config, group="wsd", seed=seed,
                                    overrides=(*rope, "optimizer.decay=wsd",
                                               f"optimizer.decay_shape={self.recipes.decay_shape}", f"seed={seed}")))
            runs.append(PretrainRun(name=f"mask-annealed-s{seed}", config=self.ablation_config, group="mask-annealed",
                                    seed=seed, schedule=annealed, overrides=(*rope, f"seed={seed}")))
        return runs

    def eval_runs(self, parts: tuple[str, ...]) -> list[EvalRun]:
        """Checkpoint evaluations: the from-bert part's (launcher/reproduce/from_bert_part.py) and the extension
        part's: (a), (b) at their last checkpoint, (c) = (a) before its extension stage."""
        runs = from_bert_part.eval_runs(self, EvalRun) if "from-bert" in parts and self.from_bert else []
        if "documents" in parts and self.documents is not None:
            runs += documents_part.eval_runs(self, EvalRun)
        if "schedules" in parts and self.schedules is not None:
            runs += schedules_part.eval_runs(self, EvalRun)
        ext = self.extension
        if "extension" not in parts or ext is None:
            return runs
        for seed in ext.seeds:
            for variant, run, tag in (("same-theta", f"extension-same-theta-s{seed}", None),
                                      ("larger-theta", f"extension-larger-theta-s{seed}", None),
                                      ("no-extension", f"extension-same-theta-s{seed}", ext.base_end_tag)):
                runs.append(EvalRun(run, variant, seed, tag, ext.eval_lens, ext.eval_tokens))
        return runs

    def finetune_runs(self, parts: tuple[str, ...]) -> list[FinetuneRun]:
        runs: list[FinetuneRun] = []
        if "downstream" in parts:
            runs += self.downstream_finetunes()
        if "retrieval" in parts and self.retrieval is not None:
            runs += retrieval_part.finetune_runs(self, FinetuneRun)
        if "lengths" in parts:
            runs += self.lengths_finetunes()
        runs += self.recipe_comparison_finetunes(parts)
        if "from-bert" in parts and self.from_bert is not None:
            runs += from_bert_part.finetune_runs(self, FinetuneRun)
        if "documents" in parts and self.documents is not None:
            runs += documents_part.finetune_runs(self, FinetuneRun)
        if "schedules" in parts and self.schedules is not None:
            runs += schedules_part.finetune_runs(self, FinetuneRun)
        return list({run.name: run for run in runs}.values())  # the comparison's recipe fine-tunes are downstream's

    def downstream_finetunes(self) -> list[FinetuneRun]:
        """The downstream part's jobs: every task and label budget, each recipe export and the twin."""
        runs = []
        for task, protocol in self.tasks.items():
            for budget in self.label_budgets:
                # The twin is a function of architecture, tokenizer and fine-tuning seed only: one
                # set of twins (named after the first recipe run) serves every pretraining seed.
                for recipe, init in [*((r, "pretrained") for r in self.recipe_runs), (self.recipe_run, "random")]:
                    for seed in self.finetune_seeds:
                        runs.append(FinetuneRun(recipe, task, init, budget, protocol.max_length, seed,
                                                "downstream", protocol.args_for(budget)))
        return runs

    def lengths_finetunes(self) -> list[FinetuneRun]:
        """The lengths part's inews fine-tunes of the recipe export. One that is a downstream job in all but its
        part (the quick preset's length 32) is named as that job: it runs once, and both parts read its report."""
        downstream, runs = set(self.downstream_finetunes()), []
        for length in self.lengths:
            for seed in self.lengths_seeds:
                run = FinetuneRun(self.recipe_run, "inews", "pretrained", self.lengths_budget, length, seed, "lengths",
                                  self.lengths_args)
                same = dataclasses.replace(run, part="downstream")
                runs.append(same if same in downstream else run)
        return runs

    def recipe_comparison_finetunes(self, parts: tuple[str, ...]) -> list[FinetuneRun]:
        """The three-phase export, the recipe's (seed 0) and the twin on every task at the comparison's budget,
        each fine-tuning seed; the latter two named as the downstream part's (one report serves both)."""
        if not self.compares_recipe(parts):
            return []
        budget, runs = self.recipe_comparison.budget, []
        for task, protocol in self.tasks.items():
            for seed in self.finetune_seeds:
                runs.append(FinetuneRun(self.recipe_comparison.name, task, "pretrained", budget, protocol.max_length,
                                        seed, "recipes", protocol.args_for(budget)))
                for init in ("pretrained", "random"):
                    runs.append(FinetuneRun(self.recipe_run, task, init, budget, protocol.max_length, seed,
                                            "downstream", protocol.args_for(budget)))
        return runs


def _configs() -> Path:
    return PROJECT_ROOT / "configs" / "reproduce"


def full_preset() -> Preset:
    """The documented reproduction (see docs/reproduction/README.md for what it costs and found)."""
    return Preset(
        name="full",
        prepare_args=("--default-corpus", "en,zh", "--vocab-size", "8000", "--workers", "2"),
        recipe_prepare_args=("--default-corpus", "wordnet,zh,task-train", "--vocab-size", "16000", "--workers", "2"),
        ablation_config=_configs() / "ablation.yaml",
        recipe_config=_configs() / "recipe.yaml",
        pretrain_seeds=(0, 1, 2),
        finetune_seeds=(0, 1, 2),
        lengths_seeds=(0, 1, 2),
        label_budgets=(250, 1000, None),
        # Chosen on dev by the recipe probes: inews at 1000 labels collapses to the majority class with
        # fewer than ~5 epochs, at every length tried. The whole training split (5-8x the examples)
        # gets 3 epochs: more optimizer steps than 8 epochs of 1000 examples, at half the CPU time.
        tasks={"movie-reviews": TaskProtocol(64, ("--epochs", "6", "--lr", "1e-3"), ("--epochs", "3")),
               "inews": TaskProtocol(128, ("--epochs", "8", "--lr", "1e-3"), ("--epochs", "3"))},
        lengths=(128, 256, 512, 1024),
        lengths_budget=1000,
        lengths_args=("--epochs", "8", "--lr", "1e-3", "--batch-size", "16", "--max-eval-examples", "500"),
        recipe_seeds=(0, 1),
        # The ablation model and data; 128 -> 512 as the ablation schedule, then 40 steps at 2048
        # (4x the longest base length); the larger base 160000 is ModernBERT's long-context one.
        extension=Extension(
            base=({"name": "short", "max_seq_len": 128, "global_batch_size": 32, "steps": 250},
                  {"name": "long", "max_seq_len": 512, "global_batch_size": 8, "steps": 60}),
            stage={"name": "extend", "max_seq_len": 2048, "global_batch_size": 2, "steps": 40},
            larger_theta=160000.0, seeds=(0, 1), eval_lens=(512, 1024, 2048, 4096)),
        # The ablation schedule's short / long / medium stages at 30% / 20% / 15% masked.
        recipes=RecipeAblation(mask_probs=(0.3, 0.2, 0.15), seeds=(0, 1, 2)),
        recipe_comparison=RecipeComparison(config=_configs() / "recipe_three_phase.yaml", budget=1000),
        # The learned runs (370 steps) continued 120 steps at the ablation schedule's last length (validation
        # every 10 steps: the recovery step); losses at 128 and at 2048, twice the 1024-row table.
        from_bert=FromBert(stage={"name": "continue", "max_seq_len": 256, "global_batch_size": 16, "steps": 120},
                           seeds=(0, 1, 2), eval_lens=(128, 2048), budget=1000,
                           finetune_args=("--epochs", "8", "--lr", "1e-3"),
                           continue_overrides=("logging.valid_every=10",)),
        # lr 1e-3 (of 1e-4, 3e-4, 1e-3) and 3 epochs: the best dev nDCG@10 on the demo export, 1000 pairs.
        retrieval=RetrievalProtocol(64, (0, 1000), ("--epochs", "3", "--lr", "1e-3", "--batch-size", "32")),
        # The ablation schedule's shortest and longest lengths; the downstream part's protocols at 1000 labels.
        documents=DocumentsPart(seeds=(0, 1, 2), eval_lens=(128, 512), budget=1000),
        schedules=schedules_part.full_sizes(_configs()),
    )


def quick_preset() -> Preset:
    """A tiny model for a few steps: checks the harness and the report's shape, not the paper."""
    return Preset(
        name="quick",
        prepare_args=("--default-corpus", "en", "--max-documents", "300", "--vocab-size", "600"),
        recipe_prepare_args=None,
        ablation_config=_configs() / "ablation.yaml",
        recipe_config=None,
        pretrain_seeds=(0,),
        finetune_seeds=(0,),
        lengths_seeds=(0,),
        label_budgets=(32,),
        tasks={"movie-reviews": TaskProtocol(32, ("--epochs", "1", "--max-eval-examples", "32")),
               "inews": TaskProtocol(32, ("--epochs", "1", "--max-eval-examples", "32"))},
        lengths=(32, 64),
        lengths_budget=32,
        lengths_args=("--epochs", "1", "--max-eval-examples", "32"),
        absolute_positions=64,
        num_ranks=1,
        overrides=("model.vocab_size=600", "model.hidden_size=32", "model.num_hidden_layers=1",
                   "model.num_attention_heads=2", "model.intermediate_size=64",
                   f"schedule.file={_configs() / 'quick_schedule.yaml'}", "logging.valid_every=2",
                   "logging.valid_batches=1", "checkpoint.every_steps=0", "optimizer.warmup_steps=1",
                   "logging.plots=false",  # the harness check draws the report's plots, not each run's
                   # A nominal peak: a 6-step tiny run's MFU measures nothing, and timing the CPU's matmul
                   # peak cost each run ~1.6 CPU-s of its ~12 (docs/reproduction/README.md).
                   "logging.peak_tflops=1"),
        finetune_jobs=2,
        pretrain_jobs=2,
        # One recipe seed and one fine-tuning seed: several seeds are the full preset's, checked by
        # tests/unit/test_reproduce.py on written reports (each extra job here lengthens the test suite).
        extension=Extension(base=({"name": "short", "max_seq_len": 32, "global_batch_size": 4, "steps": 3},),
                            stage={"name": "extend", "max_seq_len": 64, "global_batch_size": 2, "steps": 2},
                            larger_theta=40000.0, seeds=(0,), eval_lens=(32, 64, 128), eval_tokens=512),
        recipes=RecipeAblation(mask_probs=(0.3, 0.15), seeds=(0,)),  # quick_schedule.yaml's two stages
        # Fine-tuned pairs only (zero-shot jobs are the full preset's; tests/unit/test_retrieval.py runs one).
        retrieval=RetrievalProtocol(32, (32,), ("--epochs", "1"), eval_args=("--max-eval-examples", "32")),
        # 15 more jobs (4 pretrain, 4 export, 4 eval, 3 finetune): run only when asked for
        # (`--quick --parts from-bert`).
        from_bert=FromBert(stage={"name": "continue", "max_seq_len": 64, "global_batch_size": 2, "steps": 2},
                           seeds=(0,), eval_lens=(32, 128), budget=32, eval_tokens=512, max_length=32,
                           finetune_args=("--epochs", "1", "--max-eval-examples", "32"),
                           continue_overrides=("logging.valid_every=1",)),
        # 8 more pretraining runs and their jobs: run only when asked for (`--quick --parts documents`).
        documents=DocumentsPart(seeds=(0,), eval_lens=(32, 64), budget=32, eval_tokens=512),
        schedules=schedules_part.quick_sizes(),  # 3 more pretraining runs: only with `--quick --parts schedules`
        default_parts=tuple(part for part in PARTS if part not in ("from-bert", "documents", "schedules")),
    )


PRESETS = {"full": full_preset, "quick": quick_preset}
