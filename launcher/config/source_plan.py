"""What each stage draws from each named source of the prepared data (`roformer plan`).

Per stage and source: its share (the stage's `mixture`, else the sources in proportion to their train
tokens, as the batch stream does), the tokens drawn (sequences x seq_len x share: [CLS] and [SEP]
included, as `tokens_by_source` counts them) and, over the whole schedule, the passes over each source
(units read / the source's train tokens plus one [SEP] per document). A source read more than
MAX_PASSES times gets a note: repeating data that often gains little (Muennighoff et al. 2023 find
returns fall off quickly after ~4 epochs).
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_PASSES = 4.0
"""More passes than this over one source get a note in the plan."""


@dataclass(frozen=True)
class SourceDraw:
    """One source in one stage."""

    stage: int
    """0-based stage index."""
    source: str
    share: float
    """Expected share of the stage's sequences drawn from this source."""
    tokens: float
    """Expected token slots drawn ([CLS] + seq_len - 1 units per sequence)."""
    units: float
    """Expected units (tokens + [SEP]s) read from the source's stream."""


@dataclass(frozen=True)
class SourcePlan:
    """The draws of every stage and the passes over every source."""

    sources: list[dict]
    """data_pipeline.manifest.manifest_sources of the data."""
    draws: list[SourceDraw]
    stage_names: list[str]

    def passes(self, source: str) -> float:
        """How many times the whole schedule reads the source's train split."""
        epoch = next(s["train"]["tokens"] + s["train"]["documents"] for s in self.sources if s["name"] == source)
        drawn = sum(d.units for d in self.draws if d.source == source)
        return drawn / epoch if epoch else (float("inf") if drawn else 0.0)

    def notes(self) -> list[str]:
        return [f"source {s['name']!r} would be read {self.passes(s['name']):.1f} times over "
                f"(> {MAX_PASSES:g} passes): more data for it, or a smaller share, repeats less"
                for s in self.sources if self.passes(s["name"]) > MAX_PASSES]

    def table(self) -> str:
        names = [s["name"] for s in self.sources]
        rows = [f"{'#':>2}  {'stage':<16}" + "".join(f"{name[:20]:>22}" for name in names)]
        for index, stage in enumerate(self.stage_names):
            mine = [d for d in self.draws if d.stage == index]  # a batch ramp's pieces: one draw each, summed
            cells = {name: f"{sum(d.tokens for d in mine if d.source == name):,.0f} "
                           f"({100 * next(d.share for d in mine if d.source == name):.0f}%)"
                     for name in dict.fromkeys(d.source for d in mine)}
            rows.append(f"{index + 1:>2}  {stage[:15]:<16}" + "".join(f"{cells.get(name, '-'):>22}" for name in names))
        rows.append(f"{'':>2}  {'passes':<16}" + "".join(f"{self.passes(name):>22.2f}" for name in names))
        sizes = ", ".join(f"{s['name']} {s['train']['tokens']:,}" for s in self.sources)
        title = f"tokens drawn per stage and source (share of the stage); train tokens: {sizes}"
        return "\n".join([title, *rows, *(f"note: {note}" for note in self.notes())])

    def to_dict(self) -> dict:
        return {"sources": [{"name": s["name"], "train_tokens": s["train"]["tokens"], "passes": self.passes(s["name"])}
                            for s in self.sources],
                "stages": [{"stage": d.stage, "source": d.source, "share": d.share, "tokens": d.tokens}
                           for d in self.draws],
                "notes": self.notes()}


def source_plan(stages, sources: list[dict]) -> SourcePlan:
    """stages: ResolvedStage list (their `mixture`: (source, share) pairs or None; a batch ramp's pieces share their
    stage's index and are summed in the table); sources: the
    manifest's named sources (data_pipeline.manifest.manifest_sources)."""
    total = sum(s["train"]["tokens"] for s in sources)
    by_size = {s["name"]: s["train"]["tokens"] / total for s in sources}
    draws = []
    for stage in stages:
        shares = by_size if stage.mixture is None else dict(stage.mixture)
        sequences = stage.steps * stage.global_batch_size
        for s in sources:
            share = shares.get(s["name"], 0.0)
            draws.append(SourceDraw(stage.index, s["name"], share, sequences * stage.max_seq_len * share,
                                    sequences * (stage.max_seq_len - 1) * share))
    return SourcePlan(sources, draws, list({s.index: s.name for s in stages}.values()))  # one name per stage
