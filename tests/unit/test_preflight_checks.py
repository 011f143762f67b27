"""`roformer plan`, `roformer pretrain --dry-run` and a rank's start-up run the same checks
(launcher/config/preflight_checks.py, issue 12 item 2): each bad input below gets the same one line
from all three, naming the file and the field, before DeepSpeed runs or anything is launched.

All in this process: the CLI's `main` and the rank entry's `main` (as rank 0 of 2, which must stop
before its process group would start). What the accelerator answers about fp16 / bf16 is pinned both
ways (tests/support/cpu_precision.py): DeepSpeed's CPU accelerator asks the CPU, and a Xeon with
AVX512-FP16 / AMX says yes to fp16. One test takes the real answer and checks what it calls for.
"""
from __future__ import annotations

import pytest

from launcher.cli import main as cli_main
from tests.support.cpu_precision import pin_cpu_accelerator, real_cpu_precision
from tests.support.helpers import REPO, run_config_dict, write_schedule, write_yaml

FP16_DS = REPO / "ds_configs" / "v100_fp16_zero2.json"
BF16_DS = REPO / "ds_configs" / "cpu_bf16_zero2.json"
PRECISION_DS = {"fp16": FP16_DS, "bf16": BF16_DS}
ONE_STAGE = [{"name": "one", "max_seq_len": 32, "global_batch_size": 8, "steps": 2}]


def bad_inputs(tiny_data, tmp_path) -> dict[str, tuple[dict, str]]:
    """case -> (run config sections, text the one-line error must hold)."""
    (tmp_path / "empty_data").mkdir()
    spm = tiny_data / "tokenizer" / "spm.model"
    short = write_schedule(tmp_path / "short.yaml", [{**ONE_STAGE[0], "max_seq_len": 1}])
    return {
        "missing data dir": ({"data": {"data_dir": str(tmp_path / "absent")}},
                             f"data.data_dir: {tmp_path / 'absent'} is not a directory"),
        "no manifest": ({"data": {"data_dir": str(tmp_path / "empty_data")}},
                        f"{tmp_path / 'empty_data' / 'manifest.json'}: no manifest"),
        "vocab larger than the tokenizer": ({"model": {"vocab_size": 1000}},
                                            f"model.vocab_size 1000 is larger than the tokenizer's vocabulary "
                                            f"(900 pieces in {spm}); it must equal it"),
        "pad id other than the tokenizer's": ({"model": {"pad_token_id": 1}},
                                              "model.pad_token_id 1 is not the tokenizer's pad id 0 "
                                              f"({tiny_data / 'manifest.json'}, special_ids.pad_token)"),
        "vocab smaller than the tokenizer": ({"model": {"vocab_size": 899}},
                                             "model.vocab_size 899 is smaller than the tokenizer's vocabulary "
                                             f"(900 pieces in {spm})"),
        "max_seq_len 1": ({"schedule": {"file": str(short)}},
                          f"{short}: stage 1 (one): max_seq_len 1 is too short"),
        "ZeRO stage 7": ({"deepspeed": {"overrides": {"zero_optimization": {"stage": 7}}}},
                         "rejected by DeepSpeed's DeepSpeedConfig: zero_optimization.stage: Input should be 0, 1, 2"),
        "fp16 on a cpu accelerator without fp16": ({"deepspeed": {"config": str(FP16_DS)}},
                                                    f"{FP16_DS}: fp16.enabled: DeepSpeed's cpu accelerator "
                                                    "(DS_ACCELERATOR=cpu) does not support fp16 "
                                                    "(get_accelerator().is_fp16_supported() is False); "
                                                    "use a bf16 or fp32 DeepSpeed config"),
        "bf16 on a cpu accelerator without bf16": ({"deepspeed": {"config": str(BF16_DS)}},
                                                    f"{BF16_DS}: bf16.enabled: DeepSpeed's cpu accelerator "
                                                    "(DS_ACCELERATOR=cpu) does not support bf16 "
                                                    "(get_accelerator().is_bf16_supported() is False); "
                                                    "use a fp32 DeepSpeed config"),
    }


def write_config(tmp_path, tiny_data, sections: dict, name: str = "run.yaml"):
    schedule = write_schedule(tmp_path / "one_stage.yaml", ONE_STAGE)
    config = run_config_dict(data_dir=tiny_data, schedule_file=schedule)
    for section, values in sections.items():
        config[section].update(values)
    return write_yaml(tmp_path / name, config)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines, "no error printed"
    return lines[-1]


def three_entry_points(config, tmp_path, monkeypatch, capsys) -> dict[str, str]:
    """The error each entry point prints (prefix removed); each must exit with 2."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("sys.argv", ["roformer"])
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 2
    plan = error_line(capsys).removeprefix("roformer plan: error: ")
    return {"plan": plan, **dry_run_and_rank(config, tmp_path, monkeypatch, capsys)}


def dry_run_and_rank(config, tmp_path, monkeypatch, capsys) -> dict[str, str]:
    """The error `pretrain --dry-run` and a rank print (prefix removed); each must exit with 2."""
    import deepspeed.comm

    from launcher.train import rank_entry

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("sys.argv", ["roformer"])
    errors = {}
    run_dir = tmp_path / "run"
    assert cli_main(["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(run_dir),
                     "--dry-run"]) == 2
    errors["dry-run"] = error_line(capsys).removeprefix("roformer pretrain: error: ")
    assert not run_dir.exists()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_entry.main(["--config", str(config), "--run-dir", str(run_dir)]) == 2
    errors["rank"] = error_line(capsys).removeprefix("pretrain (rank 0): error: ")
    assert not deepspeed.comm.is_initialized()  # refused before the process group (and the engine)
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()
    return errors


@pytest.mark.parametrize("case", ["no manifest", "vocab larger than the tokenizer", "pad id other than the tokenizer's",
                                  "vocab smaller than the tokenizer", "max_seq_len 1", "ZeRO stage 7",
                                  "fp16 on a cpu accelerator without fp16", "bf16 on a cpu accelerator without bf16"])
def test_plan_dry_run_and_rank_refuse_alike(case, tiny_data, tmp_path, monkeypatch, capsys):
    pin_cpu_accelerator(monkeypatch, fp16=False, bf16=False)  # whichever CPU runs the test
    sections, message = bad_inputs(tiny_data, tmp_path)[case]
    config = write_config(tmp_path, tiny_data, sections)
    errors = three_entry_points(config, tmp_path, monkeypatch, capsys)
    assert message in errors["plan"], errors["plan"]
    assert errors["dry-run"] == errors["plan"] and errors["rank"] == errors["plan"], errors


def plan_and_dry_run_pass(config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("sys.argv", ["roformer"])
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 0
    assert cli_main(["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(tmp_path / "r"),
                     "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "error" not in err and "does not support" not in err, err


def test_a_missing_data_dir_is_a_note_for_plan_and_refused_by_dry_run_and_rank(tiny_data, tmp_path, monkeypatch,
                                                                              capsys):
    """Sizing a cluster comes before preparing its corpus: plan checks the rest and says the data was
    not checked; `pretrain --dry-run` and every rank refuse with the same line."""
    sections, message = bad_inputs(tiny_data, tmp_path)["missing data dir"]
    config = write_config(tmp_path, tiny_data, sections)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 0
    notes = capsys.readouterr().err.strip().splitlines()
    assert any(line.startswith(f"roformer plan: note: data.data_dir {tmp_path / 'absent'} does not exist (yet): "
                               "the data was not checked") for line in notes), notes
    errors = dry_run_and_rank(config, tmp_path, monkeypatch, capsys)
    assert message in errors["dry-run"] and errors["rank"] == errors["dry-run"], errors


def test_the_good_config_passes_plan_and_dry_run(tiny_data, tmp_path, monkeypatch, capsys):
    plan_and_dry_run_pass(write_config(tmp_path, tiny_data, {}), tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_precision_the_accelerator_supports_passes_plan_and_dry_run(precision, tiny_data, tmp_path, monkeypatch,
                                                                     capsys):
    pin_cpu_accelerator(monkeypatch, **{precision: True})
    config = write_config(tmp_path, tiny_data, {"deepspeed": {"config": str(PRECISION_DS[precision])}})
    plan_and_dry_run_pass(config, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_real_accelerator_answer_decides(precision, tiny_data, tmp_path, monkeypatch, capsys):
    """Unpinned: what this machine's CPU accelerator says about `precision` is what plan and --dry-run
    act on (here fp16 is refused on most CPUs and accepted on a Xeon with AVX512-FP16 / AMX; bf16 is
    accepted). Either answer is checked; the real runs are tests/multirank/test_fp16.py and the bf16 ones."""
    pin_cpu_accelerator(monkeypatch)  # a CPU accelerator (even where a GPU would be detected), real answers
    config = write_config(tmp_path, tiny_data, {"deepspeed": {"config": str(PRECISION_DS[precision])}})
    if real_cpu_precision()[precision]:
        plan_and_dry_run_pass(config, tmp_path, monkeypatch, capsys)
        return
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 2
    assert f"{PRECISION_DS[precision]}: {precision}.enabled: DeepSpeed's cpu accelerator (DS_ACCELERATOR=cpu) " \
           f"does not support {precision}" in error_line(capsys)


def test_a_corpus_too_small_for_a_stage_is_refused_by_plan(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    schedule = write_schedule(tmp_path / "huge.yaml", [{"name": "huge", "max_seq_len": 512, "global_batch_size": 4096,
                                                        "steps": 1, "micro_batch_size": 1}])
    config = write_config(tmp_path, tiny_data, {"schedule": {"file": str(schedule)}}, name="huge_run.yaml")
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 2
    assert "fewer than one global batch of 4096 sequences x 511 tokens" in error_line(capsys)


def test_precision_the_ranks_may_not_share_with_this_machine_is_a_note(tiny_data, tmp_path, monkeypatch, capsys):
    """Without DS_ACCELERATOR the ranks detect their own accelerator (a login node without GPUs may
    plan a V100 run): plan says what it found here instead of refusing."""
    pin_cpu_accelerator(monkeypatch, fp16=False)  # "detected": a CPU without fp16, whatever this machine has
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    # warmup_steps below the 2-step schedule: a warm-up as long as the run would be a note of its own.
    config = write_config(tmp_path, tiny_data, {"deepspeed": {"config": str(FP16_DS)}, "optimizer": {"warmup_steps": 1}})
    assert cli_main(["plan", "--config", str(config), "--world-size", "2"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"roformer plan: note: {FP16_DS}: fp16.enabled: DeepSpeed's cpu "
                                               "accelerator (detected) does not support fp16"), err
    assert "each rank checks it again on its own node" in err[0]
