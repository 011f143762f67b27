"""`attention` / `positions` as per-stage keys of the schedule (issue 50 item 2, "per stage allowed"): parsing,
resolution over the run config's data.attention / data.positions, one-line errors, the plan, and the trainer's
stage switch (which also restores a stage's setting on a resume mid-stage: the run's first switch_to)."""
from __future__ import annotations

import pytest

from data_pipeline.documents import DocumentView
from launcher.common.errors import UserError
from launcher.config.run_config import load_run_config
from launcher.config.schedule import load_schedule
from launcher.config.stages import entry_at, format_plan, resolve_stages
from tests.support.helpers import run_config_dict, write_schedule, write_yaml

STAGES = [{"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 3},
          {"name": "long", "max_seq_len": 64, "global_batch_size": 4, "steps": 2, "attention": "document",
           "positions": "document"}]


def _cfg(tmp_path, stages, data=None, model=None):
    raw = run_config_dict(schedule_file=write_schedule(tmp_path / "sched.yaml", stages))
    raw["data"].update(data or {})
    raw["model"].update(model or {})
    return load_run_config(write_yaml(tmp_path / "run.yaml", raw))


def test_a_stage_overrides_the_runs_view_and_the_others_keep_it(tmp_path):
    short, long = resolve_stages(_cfg(tmp_path, STAGES), 1)
    assert (short.attention, short.positions, long.attention, long.positions) == \
        ("sequence", "sequence", "document", "document")
    assert long.document_view == DocumentView("document", "document")
    assert long.to_dict()["attention"] == "document"  # recorded in stages.json
    plan = format_plan([short, long], 1)
    assert "attention per stage: short sequence, long document" in plan
    assert "positions per stage: short sequence, long document" in plan
    # the run's own setting fills stages that do not say; one that says "sequence" wins over it
    back = [{**STAGES[0], "attention": "sequence"}, {"name": "x", "max_seq_len": 32, "global_batch_size": 8, "steps": 1}]
    first, second = resolve_stages(_cfg(tmp_path, back, data={"attention": "document"}), 1)
    assert (first.attention, second.attention, first.positions) == ("sequence", "document", "sequence")


def test_a_schedule_without_the_keys_plans_as_before(tmp_path):
    stages = resolve_stages(_cfg(tmp_path, [STAGES[0]]), 1)
    assert stages[0].document_view == DocumentView()
    assert "attention per stage" not in format_plan(stages, 1) and "positions per stage" not in format_plan(stages, 1)


@pytest.mark.parametrize("key, bad", [("attention", "documents"), ("positions", "doc"), ("attention", 1)])
def test_a_bad_value_names_file_stage_and_key(tmp_path, key, bad):
    path = write_schedule(tmp_path / "sched.yaml", [STAGES[0], {**STAGES[1], key: bad}])
    with pytest.raises(UserError, match=rf"^{tmp_path}/sched\.yaml: stage 2 \(long\): {key} must be one of "
                                        rf"sequence, document \(the run's data.{key} for this stage\), got "):
        load_schedule(path)


def test_document_attention_on_a_linear_attention_model_names_the_stage(tmp_path):
    cfg = _cfg(tmp_path, STAGES, model={"attention": "linear"})
    with pytest.raises(UserError, match=r"sched\.yaml: stage 2 \(long\): attention 'document' needs "
                                        r"model.attention 'softmax'"):
        resolve_stages(cfg, 1)


class _Recorder:
    """What switch_to calls on the engine, the readers and the metrics."""

    module = None  # the engine's model (set_rope_theta is stubbed)

    def __init__(self):
        self.calls, self.views, self.events, self.messages = [], [], [], []

    # engine
    def set_train_micro_batch_size(self, n): self.micro = n
    def set_train_batch_size(self, n): self.batch = n
    def gradient_accumulation_steps(self): return self.batch // self.micro

    # readers
    def set_mask_prob(self, p): pass
    def set_mixture(self, m): pass
    def set_document_view(self, view): self.views.append(view)

    # metrics
    def event(self, kind, **fields): self.events.append((kind, fields))
    def message(self, text): self.messages.append(text)

    # guard
    def restore(self, step): pass


def _trainer(monkeypatch, cfg, stages, step=0):
    import launcher.train.trainer as trainer_module
    from launcher.train.read_ahead import ReadAhead
    from launcher.train.trainer import Trainer, TrainParts, TrainState

    monkeypatch.setattr(trainer_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(trainer_module.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(trainer_module, "set_rope_theta", lambda module, theta: None)  # no model here
    engine, train, valid, metrics, guard = (_Recorder() for _ in range(5))
    parts = TrainParts(engine=engine, state=TrainState(step=step), checkpointer=None, metrics=metrics, guard=guard)
    return Trainer(cfg, stages, ReadAhead(train), valid, parts), train, valid, metrics


def test_the_trainer_applies_each_stages_view_at_its_switch_and_on_a_resume_mid_stage(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, STAGES)
    stages = resolve_stages(cfg, 1)
    trainer, train, valid, metrics = _trainer(monkeypatch, cfg, stages)
    trainer.switch_to(stages[0])
    trainer.switch_to(stages[1], previous=stages[0])
    assert train.views[-2:] == valid.views[-2:] == [DocumentView(), DocumentView("document", "document")]
    start = [fields for kind, fields in metrics.events if kind == "stage_start"]
    assert [(f["attention"], f["positions"]) for f in start] == [("sequence", "sequence"), ("document", "document")]
    assert metrics.messages[-1].endswith(", attention document, positions document")
    # a resume at step 4 (inside 'long'): the run's first switch is to the entry at that step, previous None
    resumed, train, valid, _ = _trainer(monkeypatch, cfg, stages, step=4)
    resumed.switch_to(entry_at(stages, resumed.state.step))
    assert train.views[-1] == valid.views[-1] == DocumentView("document", "document")


def test_one_view_throughout_keeps_the_stage_line_as_before(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, [STAGES[0]])
    stages = resolve_stages(cfg, 1)
    trainer, train, _, metrics = _trainer(monkeypatch, cfg, stages)
    trainer.switch_to(stages[0])
    assert train.views[-1] == DocumentView() and "attention" not in metrics.messages[-1]
