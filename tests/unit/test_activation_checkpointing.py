"""Activation checkpointing from the run config (schedule.activation_checkpointing): parsed and checked
by name, switched on in the model the engine is built from, and judged by `roformer plan`."""
from __future__ import annotations

import json

import pytest
import torch

from launcher.cli import main as cli_main
from launcher.config.run_config import load_run_config
from launcher.common.errors import UserError
from launcher.train.engine import build_model
from tests.support.helpers import run_config_dict, tiny_run_config, write_yaml


def saved_activation_bytes(model, batch: dict) -> int:
    """Bytes of the tensors autograd keeps for backward during one training forward."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    return sum(saved)


def test_the_field_defaults_off_and_a_wrong_type_is_named(tmp_path):
    cfg = load_run_config(write_yaml(tmp_path / "run.yaml", run_config_dict()))
    assert cfg.schedule.activation_checkpointing is False
    on = load_run_config(tmp_path / "run.yaml", ["schedule.activation_checkpointing=true"])
    assert on.schedule.activation_checkpointing is True
    assert on.to_dict()["schedule"]["activation_checkpointing"] is True  # recorded in the run's config.yaml
    with pytest.raises(UserError, match=r"run.yaml: schedule.activation_checkpointing: expected bool, got 'yes'"):
        load_run_config(tmp_path / "run.yaml", ["schedule.activation_checkpointing='yes'"])


def test_the_engines_model_keeps_only_layer_inputs_and_computes_the_same_gradients(tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(
        model={"num_hidden_layers": 4, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}))
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(5, 900, (4, 48), generator=generator)
    labels = torch.where(torch.rand(4, 48, generator=generator) < 0.15, input_ids, -100)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    saved, grads = {}, {}
    for checkpointing in (False, True):
        model = build_model(load_run_config(config, [f"schedule.activation_checkpointing={checkpointing}"])).train()
        assert model.roformer.gradient_checkpointing is checkpointing
        torch.manual_seed(0)  # the same dropout masks (the recompute draws them again from the same state)
        saved[checkpointing] = saved_activation_bytes(model, batch)
        grads[checkpointing] = {name: p.grad for name, p in model.named_parameters()}
    assert saved[True] < saved[False] / 2, saved  # 4 layers: their inputs instead of their activations
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=0, atol=1e-6, msg=name)


def test_plan_judges_memory_and_time_with_the_configs_setting(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    config = tiny_run_config(tmp_path, tiny_data)
    verdicts = {}
    for checkpointing in (False, True):
        assert cli_main(["plan", "--config", str(config), "--world-size", "2", "--peak-tflops", "1", "--json",
                         "--set", f"schedule.activation_checkpointing={checkpointing}"]) == 0
        verdicts[checkpointing] = json.loads(capsys.readouterr().out)["estimate"]
    off, on = verdicts[False], verdicts[True]
    assert (off["activation_checkpointing"], on["activation_checkpointing"]) == (False, True)
    for before, after in zip(off["stages"], on["stages"]):
        memory = after["memory_bytes"]
        assert memory["total"] - memory["activations_checkpointed"] == \
            before["memory_bytes"]["total"] - before["memory_bytes"]["activations"]  # the other activations column
        assert memory["total"] < before["memory_bytes"]["total"]
        assert after["seconds"] > before["seconds"]  # the recomputed forward is priced in
    assert cli_main(["plan", "--config", str(config), "--world-size", "2", "--peak-tflops", "1",
                     "--set", "schedule.activation_checkpointing=true"]) == 0
    assert "activation checkpointing on (schedule.activation_checkpointing)" in capsys.readouterr().out
