"""A run config's target (`hardware.device`) as the default of `roformer plan` and `roformer pretrain
--dry-run` on a machine without that accelerator (this one: CPU), the note instead of a CPU-priced
estimate when a config names none, and `plan` before the data exists (launcher/pricing/target.py)."""
from __future__ import annotations

import json
import re

import deepspeed.utils  # noqa: F401  DeepSpeed's stdout logger made now, not on a test's own (later closed) capture
import pytest
import yaml

from launcher.config.run_config import load_run_config
from launcher.common.errors import UserError
from launcher.common.mfu import table_peak_tflops
from tests.support.cpu_precision import pin_cpu_accelerator
from tests.support.helpers import REPO, in_process_cli, write_schedule, write_yaml

REFERENCE = REPO / "configs" / "reference_v100.yaml"
HOSTFILE = REPO / "hostfile"


@pytest.fixture
def login_node(monkeypatch, capsys):
    """A CPU machine without fp16 (a typical login node), DS_ACCELERATOR unset as a GPU user has it."""
    pin_cpu_accelerator(monkeypatch, fp16=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    return in_process_cli(monkeypatch, capsys)


def plan_json(run, *extra: str) -> tuple[dict, str]:
    code, out, err = run("plan", "--config", str(REFERENCE), "--hostfile", str(HOSTFILE), "--json", *extra)
    assert code == 0, err
    return json.loads(out), err


def test_the_reference_config_is_planned_on_its_v100_without_data(login_node, tmp_path):
    """Shipped config and hostfile, no corpus prepared yet: the model and schedule are planned on the
    declared V100 16 GB (its memory, its fp16 peak, fused attention), and a note says the data was not checked."""
    missing = tmp_path / "not-prepared"
    plan, err = plan_json(login_node, "--set", f"data.data_dir={missing}")
    estimate = plan["estimate"]
    assert estimate["device"] == "V100 16 GiB (hardware.device)"
    assert estimate["device_memory_bytes"] == 16 * 2 ** 30 and not estimate["cpu_ranks"]
    assert estimate["precision"] == "fp16" and estimate["peak_tflops"] == table_peak_tflops("V100", "fp16") == 125.0
    assert estimate["peak_source"] == "table: V100 fp16" and estimate["all_fit"]
    assert plan["world_size"] == 8 and len(plan["stages"]) == 6
    assert f"note: data.data_dir {missing} does not exist (yet): the data was not checked" in err
    # The same numbers as naming the device by flags.
    flags, _ = plan_json(login_node, "--set", f"data.data_dir={missing}", "--device-name", "V100",
                         "--device-memory", "16GB")
    assert flags["estimate"]["stages"] == estimate["stages"]
    assert flags["estimate"]["device"] == "V100 16 GiB (flags)"


def test_the_dry_run_prices_the_target_too(login_node, tiny_data, tmp_path):
    schedule = write_schedule(tmp_path / "schedule.yaml", [
        {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 2}])
    code, out, err = login_node("pretrain", "--hostfile", str(HOSTFILE), "--config", str(REFERENCE),
                                "--run-dir", str(tmp_path / "r"), "--dry-run", "--set", f"data.data_dir={tiny_data}",
                                "--set", "model.vocab_size=900", "--set", f"schedule.file={schedule}")
    assert code == 0, err
    table = out.split("on V100 16 GiB (hardware.device): memory per rank (ZeRO-2, fp16, 8 ranks, device 16.00 GiB")[1]
    assert "accelerator ranks: fused attention kernels" in table.splitlines()[0]
    assert ("at 40% MFU (assumed: nothing measured on V100 fp16; --mfu sets it) of 125 TFLOP/s per rank "
            "(table: V100 fp16)") in table
    assert ("optimizer: DeepSpeed FusedAdam on every GPU node where it is prebuilt, built or buildable (nvcc); if any "
            "node cannot build it, torch's fused AdamW (torch_adam) on every node: checked on each node before launch"
            ) in out.splitlines()
    assert not (tmp_path / "r").exists()


def test_no_target_on_a_machine_without_its_accelerator_is_a_note_not_a_cpu_price(login_node, tmp_path):
    args = ("--set", f"data.data_dir={tmp_path / 'none'}", "--set", "hardware.device=''")
    plan, _ = plan_json(login_node, *args)
    assert plan["estimate"] is None
    assert plan["estimate_note"].startswith(f"{REFERENCE} declares no target (hardware.device) and this machine "
                                            "has no accelerator for its fp16 run (cpu)")
    code, out, _ = login_node("plan", "--config", str(REFERENCE), "--hostfile", str(HOSTFILE), *args)
    assert code == 0
    lines = [line for line in out.splitlines() if "memory" in line or "time" in line]
    assert lines == [f"memory and time: not estimated: {plan['estimate_note']}"]
    assert "TFLOP/s" not in out and "measured" not in out


def test_a_cpu_config_without_target_is_still_priced_on_this_machine(login_node, tiny_data, tmp_path):
    from tests.support.helpers import tiny_run_config

    config = tiny_run_config(tmp_path, tiny_data)
    code, out, err = login_node("plan", "--config", str(config), "--world-size", "2", "--peak-tflops", "1")
    assert code == 0, err
    assert "on this machine: cpu: memory per rank (ZeRO-2, fp32, 2 ranks" in out and "CPU ranks" in out


@pytest.mark.parametrize("device, message", [
    ("V100", "hardware.device: expected NAME-MEMORY, e.g. V100-16GB or H100-80GB, got 'V100'"),
    ("H100-0GB", "hardware.device: 'H100-0GB': must be more than 0 bytes (e.g. 16GB), got '0GB'"),  # issue 63
    ("TPUv4-32GB", "hardware.device: 'TPUv4' is not in the peak table of launcher/common/mfu.py (known: A100, H100, "
                   "H100 PCIE, H200, V100)"),
])
def test_a_bad_target_is_named(tmp_path, device, message):
    with pytest.raises(UserError, match=f"^{re.escape(f'{REFERENCE}: {message}')}"):
        load_run_config(REFERENCE, [f"hardware.device={device}"])


def test_a_target_without_the_runs_precision_is_refused(login_node, tmp_path):
    config = yaml.safe_load(REFERENCE.read_text())
    config["deepspeed"]["config"] = str(REPO / "ds_configs" / "cpu_bf16_zero2.json")
    for section, key in (("schedule", "file"), ("data", "data_dir")):
        config[section][key] = str((REFERENCE.parent / config[section][key]).resolve())
    path = write_yaml(tmp_path / "bf16_on_v100.yaml", config)
    code, _, err = login_node("plan", "--config", str(path), "--world-size", "8")
    assert code == 2
    assert err.strip().splitlines()[-1] == (f"roformer plan: error: {path}: hardware.device: V100 has no bf16 peak in the table of "
                           "launcher/common/mfu.py (V100 has no bf16: use an fp16 DeepSpeed config); give --peak-tflops")


def test_hyphenated_product_names_and_the_recorded_config():
    cfg = load_run_config(REFERENCE, ["hardware.device=H100-PCIe-80GB"])
    assert cfg.hardware.product_name == "H100 PCIe" and cfg.hardware.memory_bytes == 80 * 2 ** 30
    assert table_peak_tflops(cfg.hardware.product_name, "bf16") == 756.0  # the PCIe row, not the SXM one
    assert "hardware" not in cfg.to_dict()  # what plan prices on, not what the ranks run


def test_the_plan_prices_time_with_the_measured_mfu_and_names_its_source(login_node, tmp_path):
    """Issue 60 item 4: the V100 fp16 time says its 40% is assumed; an H200 bf16 plan uses the H200 measurement
    (bench/results/gpu_check_h200.json) at each stage's nearest measured length; --mfu still overrides."""
    missing = ("--set", f"data.data_dir={tmp_path / 'none'}")
    v100, _ = plan_json(login_node, *missing)
    assert v100["estimate"]["mfu"] == {"by_seq_len": {"0": 0.4},
                                       "source": "assumed: nothing measured on V100 fp16; --mfu sets it"}
    bf16 = ("--set", "deepspeed.overrides.fp16.enabled=false", "--set", "deepspeed.overrides.bf16.enabled=true")
    code, out, err = login_node("plan", "--config", str(REFERENCE), "--hostfile", str(HOSTFILE), *missing, *bf16,
                                "--device-name", "H200", "--device-memory", "141GB")
    assert code == 0, err
    time_line = next(line for line in out.splitlines() if line.startswith("time: "))
    assert time_line.endswith("at MFU 7.02% at length 128, 8.15% at length 512 (the nearest length per stage; "
                              "measured: H200 bf16, bench/results/gpu_check_h200.json (numerics_speed_rerun), "
                              "2026-11-27) of 989 TFLOP/s per rank (table: H200 bf16)")
    h200, _ = plan_json(login_node, *missing, *bf16, "--device-name", "H200", "--device-memory", "141GB")
    seconds = {stage["name"]: stage["seconds"] for stage in h200["estimate"]["stages"]}
    fixed, _ = plan_json(login_node, *missing, *bf16, "--device-name", "H200", "--device-memory", "141GB",
                         "--mfu", "0.0815")
    assert fixed["estimate"]["mfu"]["source"] == "--mfu"
    for stage in fixed["estimate"]["stages"]:  # 512 and 1536 nearest to 512, 256 and 128 to 128
        same = stage["max_seq_len"] >= 512
        assert (stage["seconds"] == pytest.approx(seconds[stage["name"]])) == same, stage["name"]


def test_a_declared_device_is_planned_as_that_device_whatever_ds_accelerator_says(login_node, monkeypatch, tmp_path):
    """The V100 fp16 config from a login node with DS_ACCELERATOR=cpu: planned on the V100 (before: refused, as
    if the ranks were this CPU), and without a note about this machine's fp16."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    plan, err = plan_json(login_node, "--set", f"data.data_dir={tmp_path / 'none'}")
    assert plan["estimate"]["device"] == "V100 16 GiB (hardware.device)" and plan["estimate"]["precision"] == "fp16"
    assert "fp16" not in err


@pytest.mark.parametrize("value", ["0GB", "-5GB"])
def test_a_device_memory_below_one_byte_is_refused_with_its_range(login_node, tmp_path, value):
    """Issue 63: `--device-memory 0GB` said DOES NOT FIT and exit 0; `-5GB` was taken for a flag by argparse."""
    code, out, err = login_node("plan", "--config", str(REFERENCE), "--hostfile", str(HOSTFILE),
                                "--set", f"data.data_dir={tmp_path / 'none'}", "--device-memory", value)
    assert code == 2 and "DOES NOT FIT" not in out
    assert err.strip().splitlines()[-1] == (f"roformer plan: error: --device-memory: must be more than 0 bytes "
                                            f"(e.g. 16GB), got '{value}'")


def test_the_plan_names_each_stages_attention_where_it_differs_from_data_attention(login_node, tmp_path):
    """Issue 63: every stage `attention: document` under data.attention sequence was not named (stages agreed)."""
    schedule = write_schedule(tmp_path / "schedule.yaml", [
        {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 2, "attention": "document"},
        {"name": "long", "max_seq_len": 64, "global_batch_size": 8, "steps": 2, "attention": "document"}])
    code, out, err = login_node("plan", "--config", str(REFERENCE), "--world-size", "8", "--set",
                                f"data.data_dir={tmp_path / 'none'}", "--set", f"schedule.file={schedule}")
    assert code == 0, err
    assert "attention per stage: short document, long document" in out.splitlines()
    assert not any(line.startswith("positions per stage") for line in out.splitlines())
