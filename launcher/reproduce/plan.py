"""What the paper reproduction runs: its parts, the runs of each part, and the two presets.

Every run is an ordinary `roformer pretrain` run directory or `roformer finetune` JSON report under
one output directory, so an interrupted reproduction resumes and finished runs are skipped:

    OUT/data/                          the ablations' prepared corpus (the bundled English + Chinese text)
    OUT/data-recipe/                   the recipe's prepared corpus (when the preset has its own)
    OUT/runs/<pretrain run>/           run directories; <run>/export/ is its transformers export
    OUT/finetune/<finetune run>.json   fine-tune reports
    OUT/logs/<run>.log                 each command's console output
    OUT/report/                        report.md, PNG plots and results.json

Parts (each can run alone; `lengths` and `downstream` share the recipe's pretraining run):
- encodings   paper Fig. 2: RoPE vs sinusoidal vs learned absolute positions, same data, model,
              schedule and seeds; MLM validation loss against steps.
- linear      paper eq. 19: linear attention with RoPE vs with sinusoidal absolute positions.
- lengths     paper Table 5: the RoPE recipe export fine-tuned on the long-document task (inews)
              at several maximum lengths, up to beyond the longest pretrained length.
- downstream  the recipe export against its random-init twin on every task at several label budgets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PARTS = ("encodings", "linear", "lengths", "downstream")
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

    @property
    def recipe_run(self) -> str:
        """Name of the pretraining run whose export the lengths and downstream parts fine-tune."""
        return "recipe" if self.recipe_config is not None else f"rope-s{self.pretrain_seeds[0]}"

    def pretrain_runs(self, parts: tuple[str, ...]) -> list[PretrainRun]:
        runs: list[PretrainRun] = []
        variants = {"encodings": [("rope", "softmax"), ("sinusoidal", "softmax"), ("learned", "softmax")],
                    "linear": [("rope", "linear"), ("sinusoidal", "linear")]}
        needs_recipe = "lengths" in parts or "downstream" in parts
        for part in ("encodings", "linear"):
            if part not in parts and not (part == "encodings" and needs_recipe and self.recipe_config is None):
                continue
            for encoding, attention in variants[part]:
                group = encoding if attention == "softmax" else f"linear+{encoding}"
                table = () if encoding == "rope" else (f"model.max_position_embeddings={self.absolute_positions}",)
                for seed in self.pretrain_seeds:
                    if part not in parts and f"{group}-s{seed}" != self.recipe_run:
                        continue  # only the recipe's stand-in
                    runs.append(PretrainRun(
                        name=f"{group.replace('+', '-')}-s{seed}", config=self.ablation_config, group=group, seed=seed,
                        overrides=(*self.overrides, f"model.position_encoding={encoding}",
                                   f"model.attention={attention}", *table, f"seed={seed}")))
        if needs_recipe and self.recipe_config is not None:
            runs.append(PretrainRun(name="recipe", config=self.recipe_config, group="recipe", seed=0,
                                    overrides=self.overrides,
                                    data="data" if self.recipe_prepare_args is None else "data-recipe"))
        return runs

    def finetune_runs(self, parts: tuple[str, ...]) -> list[FinetuneRun]:
        runs: list[FinetuneRun] = []
        if "downstream" in parts:
            for task, protocol in self.tasks.items():
                for budget in self.label_budgets:
                    for init in ("pretrained", "random"):
                        for seed in self.finetune_seeds:
                            runs.append(FinetuneRun(self.recipe_run, task, init, budget, protocol.max_length, seed,
                                                    "downstream", protocol.args_for(budget)))
        if "lengths" in parts:
            for length in self.lengths:
                for seed in self.lengths_seeds:
                    runs.append(FinetuneRun(self.recipe_run, "inews", "pretrained", self.lengths_budget, length, seed,
                                            "lengths", self.lengths_args))
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
        lengths_seeds=(0,),
        label_budgets=(250, 1000, None),
        # Chosen on dev by the recipe probes: inews at 1000 labels collapses to the majority class with
        # fewer than ~5 epochs, at every length tried. The whole training split (5-8x the examples)
        # gets 3 epochs: more optimizer steps than 8 epochs of 1000 examples, at half the CPU time.
        tasks={"movie-reviews": TaskProtocol(64, ("--epochs", "6", "--lr", "1e-3"), ("--epochs", "3")),
               "inews": TaskProtocol(128, ("--epochs", "8", "--lr", "1e-3"), ("--epochs", "3"))},
        lengths=(128, 256, 512, 1024),
        lengths_budget=1000,
        lengths_args=("--epochs", "8", "--lr", "1e-3", "--batch-size", "16", "--max-eval-examples", "500"),
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
                   "logging.valid_batches=1", "checkpoint.every_steps=0", "optimizer.warmup_steps=1"),
        finetune_jobs=2,
        pretrain_jobs=2,
    )


PRESETS = {"full": full_preset, "quick": quick_preset}
