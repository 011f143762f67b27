"""launcher/config/precision.py: one answer to "what precision does this DeepSpeed config train in",
the same as DeepSpeed's own parser gives, and the same in `roformer plan`, `roformer report` and the
resume decision, also for DeepSpeed's older `bfloat16` spelling (issue 19, item 2). Plus the resume's
shape rules (launcher/checkpoint/resume.py load_route / shape_notes) that need no process group.

No test here depends on the CPU: `plan` pins the accelerator's bf16 answer (tests/support/cpu_precision.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from launcher.config.precision import train_precision
from launcher.common.errors import UserError
from tests.support.helpers import REPO, bfloat16_copy, stored_run_resume_config

ACCEPTED = [
    ({}, "fp32"),
    ({"fp16": {"enabled": True}}, "fp16"),
    ({"fp16": {"enabled": False}, "bf16": {"enabled": True}}, "bf16"),
    ({"bfloat16": {"enabled": True}}, "bf16"),
    ({"bf16": {"enabled": False}}, "fp32"),
    ({"bf16": {}}, "fp32"),
    ({"fp16": {"loss_scale": 0}}, "fp32"),  # a section without enabled: DeepSpeed's default is off
    ({"torch_autocast": {"enabled": False}}, "fp32"),
]


@pytest.mark.parametrize("config, expected", ACCEPTED)
def test_precision_agrees_with_deepspeeds_parser(config, expected):
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    assert train_precision(config) == expected
    fp16, bf16 = get_float16_config(config).enabled, get_bfloat16_config(config).enabled
    assert expected == ("fp16" if fp16 else "bf16" if bf16 else "fp32")


@pytest.mark.parametrize("path", sorted((REPO / "ds_configs").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_reads_as_deepspeed_reads_it(path):
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    config = json.loads(path.read_text())
    fp16, bf16 = get_float16_config(config).enabled, get_bfloat16_config(config).enabled
    assert train_precision(config, str(path)) == ("fp16" if fp16 else "bf16" if bf16 else "fp32")
    assert train_precision(config) == path.name.split("_")[1]  # the file names say it too: cpu_bf16_zero2.json


REFUSED = {
    "auto": ({"bf16": {"enabled": "auto"}}, 'x.json: bf16.enabled: "auto" is a Hugging Face Trainer placeholder'),
    "auto, old spelling": ({"bfloat16": {"enabled": "auto"}}, 'x.json: bfloat16.enabled: "auto"'),
    "fp16 auto": ({"fp16": {"enabled": "auto"}}, 'x.json: fp16.enabled: "auto"'),
    "both spellings": ({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}},
                       "x.json: both bf16 and bfloat16 are given; DeepSpeed reads bf16 only"),
    "both precisions": ({"fp16": {"enabled": True}, "bfloat16": {"enabled": True}},
                        "x.json: fp16.enabled and bfloat16.enabled are both true"),
    "not a bool": ({"fp16": {"enabled": "yes"}}, "x.json: fp16.enabled: must be true or false, got 'yes'"),
    "not a mapping": ({"bf16": True}, "x.json: bf16: must be a mapping"),
    "autocast": ({"torch_autocast": {"enabled": True}}, "x.json: torch_autocast.enabled: true is not supported"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_deepspeed_would_read_otherwise_is_refused_naming_the_field(case):
    config, message = REFUSED[case]
    with pytest.raises(UserError) as err:
        train_precision(config, "x.json")
    assert str(err.value).startswith(message), str(err.value)


def test_a_refused_precision_stops_the_config_at_load(tmp_path):
    from launcher.config.deepspeed_json import load_ds_json

    path = tmp_path / "auto.json"
    path.write_text(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}))
    with pytest.raises(UserError, match=f'^{path}: bf16.enabled: "auto"'):
        load_ds_json(path)
    path.write_text(json.dumps({"bfloat16": {"enabled": True}, "zero_optimization": {"stage": 0}}))
    with pytest.raises(UserError, match=f"^{path}: zero_optimization.stage: 0 with bf16 cannot be exported"):
        load_ds_json(path)


def test_plan_and_report_see_bf16_in_a_bfloat16_config(stored_run, copy_of, tmp_path, monkeypatch, capsys):
    """The same config through two readers that each had their own expression before (the resume's
    reading, on a real run: tests/multirank/test_resume_shapes.py)."""
    from launcher.cli import main as cli_main
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.resolved.stage_configs import resolve_ds_config
    from launcher.config.run_config import load_run_config
    from launcher.config.stages import resolve_stages
    from launcher.report.curves import records_in_effect
    from launcher.run_dir.layout import RunDir
    from tests.support.cpu_precision import pin_cpu_accelerator

    pin_cpu_accelerator(monkeypatch, bf16=True)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    spelled = bfloat16_copy(tmp_path)
    run = copy_of(stored_run)
    config = yaml.safe_load(stored_run_resume_config(run).read_text())
    config["deepspeed"]["config"] = str(spelled)
    config["data"]["data_dir"] = str(stored_run.parent / "data")  # the copy's neighbour is not the data
    config_path = tmp_path / "bfloat16.yaml"
    config_path.write_text(yaml.safe_dump(config))

    # plan: the memory estimate is the bf16 one (not fp32's), and the summary line says bf16
    estimates = {}
    for name, ds_path in (("bfloat16", spelled), ("bf16", REPO / "ds_configs" / "cpu_bf16_zero2.json"),
                          ("fp32", REPO / "ds_configs" / "cpu_fp32_zero2.json")):
        args = ["plan", "--config", str(config_path), "--world-size", "2", "--peak-tflops", "1",
                "--set", f"deepspeed.config={ds_path}"]
        assert cli_main([*args, "--json"]) == 0
        estimates[name] = json.loads(capsys.readouterr().out)["estimate"]
    assert estimates["bfloat16"]["precision"] == "bf16"
    assert estimates["bfloat16"]["stages"] == estimates["bf16"]["stages"] != estimates["fp32"]["stages"]
    assert cli_main(["plan", "--config", str(config_path), "--world-size", "2", "--peak-tflops", "1"]) == 0
    assert "(ZeRO stage 2, bf16)" in capsys.readouterr().out

    # report: a run whose recorded DeepSpeed config is that one (its checkpoints' sidecars say fp32)
    cfg = load_run_config(config_path)
    recorded = resolve_ds_config(cfg, resolve_stages(cfg, 2)[0], 2, DeepSpeedJson.of(cfg))
    assert "bfloat16" in recorded and "bf16" not in recorded
    records_in_effect(RunDir(run))["ds_config"].write_text(json.dumps(recorded))
    assert cli_main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "| precision | bf16 |" in (tmp_path / "report" / "report.md").read_text()


def shape_point(precision="fp32", zero_stage=2, world_size=2, loss_scale=1.0):
    sidecar = SimpleNamespace(precision=precision, zero_stage=zero_stage, world_size=world_size, loss_scale=loss_scale)
    return SimpleNamespace(tag="global_step8", path=Path("/runs/r/checkpoints/global_step8"), sidecar=sidecar)


ROUTES = [  # (saved, now) as (stage, precision, ranks) -> universal?
    ((2, "fp32", 2), (2, "fp32", 2), False),
    ((2, "fp32", 2), (1, "fp32", 2), False),  # ZeRO 1 and 2 read each other's files
    ((0, "fp32", 2), (0, "fp32", 1), False),  # ZeRO-0: every rank reads the one full file
    ((2, "fp32", 2), (3, "fp32", 2), True),
    ((3, "fp16", 4), (1, "fp16", 4), True),
    ((2, "fp32", 2), (2, "bf16", 2), True),
    ((1, "fp16", 8), (2, "fp32", 8), True),
    ((2, "fp32", 2), (2, "fp32", 1), True),
    ((3, "bf16", 2), (1, "fp16", 3), True),
]


@pytest.mark.parametrize("saved, now, universal", ROUTES)
def test_load_route(saved, now, universal):
    from launcher.checkpoint.resume import load_route
    from launcher.config.run_shape import RunShape

    point = shape_point(saved[1], saved[0], saved[2])
    assert load_route(point, RunShape(*saved), RunShape(*now), "ds.json") is universal


@pytest.mark.parametrize("saved, now", [((0, "fp32", 2), (2, "fp32", 2)), ((3, "bf16", 2), (0, "fp32", 2))])
def test_zero_0_to_another_stage_is_refused_naming_both_shapes_and_the_way_out(saved, now):
    from launcher.checkpoint.resume import load_route
    from launcher.config.run_shape import RunShape

    with pytest.raises(UserError) as err:
        load_route(shape_point(saved[1], saved[0], saved[2]), RunShape(*saved), RunShape(*now), "ds.json")
    message = str(err.value)
    assert message.startswith(f"ds.json: {RunShape(*now)}, but checkpoint global_step8 was saved with "
                              f"{RunShape(*saved)} (/runs/r/checkpoints/global_step8/sidecar.json)")
    assert f"resume with zero_optimization.stage {saved[0]} in {saved[1]}, or use a new run directory" in message


def test_the_fp16_loss_scaler_is_said_to_start_fresh_or_to_be_dropped():
    from launcher.checkpoint.resume import shape_notes
    from launcher.config.run_shape import RunShape

    to_fp16 = shape_notes(shape_point("bf16"), RunShape(2, "bf16", 2), RunShape(2, "fp16", 2), True)
    assert to_fp16[1] == "fp16 loss scaler: starts fresh (the checkpoint trained in bf16, without loss scaling)"
    from_fp16 = shape_notes(shape_point("fp16", loss_scale=512.0), RunShape(2, "fp16", 2), RunShape(3, "fp32", 2), True)
    assert from_fp16[1] == "fp16 loss scaler: the checkpoint's (scale 512) is dropped: fp32 trains without loss scaling"
    assert len(shape_notes(shape_point(), RunShape(2, "fp32", 2), RunShape(3, "fp32", 2), True)) == 1
    assert shape_notes(shape_point(), RunShape(2, "fp32", 2), RunShape(2, "fp32", 2), False) == []
