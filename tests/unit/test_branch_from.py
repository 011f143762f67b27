"""`branch_from` / `roformer pretrain --branch-from RUN_DIR[:TAG]`: parsing, the schedule comparison (pure
functions), and every bad input refused in one line naming the file, stage and field, before anything
starts. The source is a copy of the stored 2-rank run (tests/fixtures/README.md: stages short (3 steps) and
long (2), linear decay over 5 steps, checkpoint global_step5); no DeepSpeed job is started here. A branch
that trains: tests/multirank/test_branch.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from data_pipeline import open_corpus
from data_pipeline.errors import DataError
from launcher.cli import main as cli_main
from launcher.checkpoint.resume import check_branch, find_branch_point
from launcher.config.branch_from import BranchFrom, lr_difference, schedule_difference
from launcher.config.run_config import load_run_config
from launcher.config.sections import OptimizerSection
from launcher.config.stages import resolve_stages
from launcher.common.errors import UserError
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import write_branch_record
from tests.support.helpers import stored_run_resume_config, write_schedule

TAG = "global_step5"


def _stage(name: str, first: int, steps: int, **fields) -> dict:
    return {"index": 0, "name": name, "max_seq_len": 32, "global_batch_size": 8, "micro_batch_size": 4,
            "grad_accum_steps": 1, "steps": steps, "first_step": first, "lr_scale": 1.0, "rope_theta": 10000.0,
            **fields}


def test_parse_run_dir_and_tag(tmp_path):
    assert BranchFrom.parse("runs/a:global_step5", "x", tmp_path) == BranchFrom(tmp_path / "runs/a", "global_step5")
    assert BranchFrom.parse(str(tmp_path / "a"), "x") == BranchFrom(tmp_path / "a", None)
    assert BranchFrom.parse("/data/x:y/run", "x").tag is None  # a colon inside the path
    assert str(BranchFrom(Path("/r"), "global_step5")) == "/r:global_step5"
    with pytest.raises(UserError, match="branch_from: expected RUN_DIR or RUN_DIR:TAG"):
        BranchFrom.parse("", "x")


def test_schedule_difference_before_the_branch_step_only():
    stable = [_stage("stable", 0, 100)]
    decayed = [_stage("stable", 0, 60), _stage("decay", 60, 20, lr_scale=0.5)]
    assert schedule_difference(stable, decayed, 60) is None  # the decay starts at the branch: allowed
    assert schedule_difference(stable, decayed, 40) is None
    assert schedule_difference(stable, decayed, 61) == ("stage 1 (stable): steps 60 vs 100 in the source run "
                                                        "(it ends at step 60 vs 61)")
    longer = [_stage("stable", 0, 100, max_seq_len=64)]
    assert schedule_difference(stable, longer, 1) == "stage 1 (stable): max_seq_len 64 vs 32 in the source run"
    other_ranks = [_stage("renamed", 0, 100, micro_batch_size=8, grad_accum_steps=2)]
    assert schedule_difference(stable, other_ranks, 50) is None  # the world size's split, the label
    masked = [_stage("stable", 0, 100, mask_prob=0.3)]
    assert schedule_difference(stable, masked, 50) is None  # a field the source's record predates
    assert "mask_prob 0.3 vs 0.15" in schedule_difference([_stage("stable", 0, 100, mask_prob=0.15)], masked, 50)
    two = [_stage("a", 0, 10), _stage("b", 10, 10)]
    assert schedule_difference([_stage("a", 0, 10)], two, 15) == "stage 2 (b): not in the source run (it has 1 stage)"


def test_lr_difference_names_the_step_and_fields():
    constant = OptimizerSection(lr=1e-3, warmup_steps=10, decay="constant", min_lr_ratio=0.0)
    recorded = {"lr": 1e-3, "warmup_steps": 10, "decay": "constant", "min_lr_ratio": 0.0}
    assert lr_difference(recorded, [1000], constant, [800], 600) is None  # flat after warmup: any length agrees
    linear = {**recorded, "decay": "linear"}
    problem = lr_difference(linear, [1000], constant, [800], 600)
    assert problem.startswith("the learning rate of step 11 is 0.001 vs 0.00099899 in the source run") and \
        "optimizer.decay 'constant' vs 'linear', total steps 800 vs 1000" in problem
    assert lr_difference(linear, [1000], OptimizerSection(lr=1e-3, warmup_steps=10, decay="linear", min_lr_ratio=0.0),
                         [1000], 600) is None
    # WSD: a stable run of 1000 steps, and a branch at 600 that decays over its last stage of 200 steps.
    stable = {**recorded, "decay": "wsd", "decay_steps": 100}
    decay = OptimizerSection(lr=1e-3, warmup_steps=10, decay="wsd", min_lr_ratio=0.0, decay_shape="1-sqrt")
    assert lr_difference(stable, [1000], decay, [600, 200], 600) is None
    assert "the learning rate of step 600 is" in lr_difference(stable, [1000], decay, [600, 200], 700)


@pytest.fixture
def source(stored_run, tmp_path):
    """A copy of the stored run (the branch source), its recorded decay made constant (a stable phase to
    branch from; the stored run's linear decay over 5 steps would differ from any longer schedule's)."""
    run_dir = tmp_path / "source" / "run"
    shutil.copytree(stored_run.parent, run_dir.parent)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["data_dir"] = str(run_dir.parent / "data")
    config["optimizer"]["decay"] = "constant"  # a stable phase: a branch may decay from it
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def _check(source: Path, *overrides: str, branch_from: str | None = None, stages_file: Path | None = None):
    config = stored_run_resume_config(source)
    overrides = [f"branch_from={branch_from or f'{source}:{TAG}'}", *overrides]
    if stages_file:
        overrides.append(f"schedule.file={stages_file}")
    cfg = load_run_config(config, overrides)
    corpus = open_corpus(Path(cfg.data.data_dir), split="train", verify=False)
    point = find_branch_point(cfg)
    check_branch(cfg, resolve_stages(cfg, 2), corpus, point)
    return point


def test_a_branch_of_the_stored_run_passes(source):
    point = _check(source)
    assert point.tag == TAG and point.step == 5 and point.source.run_dir == source.resolve()
    assert _check(source, branch_from=str(source)).tag == TAG  # default: the newest complete checkpoint


def test_schedule_differing_before_the_branch_step(source, tmp_path):
    stages = json.loads((source / "stages.json").read_text())["stages"]
    schedule = [{k: s[k] for k in ("name", "max_seq_len", "global_batch_size", "steps")} for s in stages]
    schedule[1]["max_seq_len"] = 128
    schedule.append({"name": "decay", "max_seq_len": 32, "global_batch_size": 8, "steps": 3})
    with pytest.raises(UserError) as err:
        _check(source, stages_file=write_schedule(tmp_path / "other.yaml", schedule))
    assert f"other.yaml vs the branch source's {source / 'stages.json'}: stage 2 (long): max_seq_len 128 vs 64 " \
           f"in the source run, before the branch step 5 ({TAG})" in str(err.value)


def test_learning_rate_differing_before_the_branch_step(source):
    with pytest.raises(UserError, match=r"vs the branch source's .*config.yaml: the learning rate of step 0 is "
                                        r"0.0005 vs 0.001 in the source run \(optimizer.lr 0.001 vs 0.002"):
        _check(source, "optimizer.lr=0.001")


def test_another_model_tokenizer_or_data_is_refused(source, tiny_data):
    with pytest.raises(UserError, match=r"model.intermediate_size 128 differs from 64 of the branch source"):
        _check(source, "model.intermediate_size=128")
    with pytest.raises(UserError, match=r"is another corpus .* than the branch source trained on"):
        _check(source, f"data.data_dir={tiny_data}")
    sidecar = source / "checkpoints" / TAG / "sidecar.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "tokenizer_sha256": "0" * 64}))
    with pytest.raises(UserError, match=r"was tokenized with tokenizer [0-9a-f]{12}, the branch source "
                                        r"global_step5 with 000000000000"):
        _check(source)


def test_missing_source_tag_or_nothing_left_to_train(source, tmp_path):
    with pytest.raises(UserError, match=r"no checkpoint 'global_step9' in .*checkpoints \(complete ones: global_step5\)"):
        _check(source, branch_from=f"{source}:global_step9")
    with pytest.raises(UserError, match="is not a run directory"):
        _check(source, branch_from=str(tmp_path / "nowhere"))
    (source / "checkpoints" / TAG / "sidecar.json").unlink()
    with pytest.raises(UserError, match="holds no complete checkpoint"):
        _check(source, branch_from=str(source))
    with pytest.raises(UserError, match="partial checkpoint"):
        _check(source)


def test_branch_and_init_from_together_are_refused(source, tmp_path):
    with pytest.raises(UserError, match="branch_from and init_from: .* give one of them"):
        load_run_config(stored_run_resume_config(source), [f"branch_from={source}", f"init_from={tmp_path}"])


def test_pretrain_refuses_before_anything_starts(capsys, source, tmp_path):
    """Through the command: one line, exit code 2, the new run directory not created, the source untouched."""
    config = stored_run_resume_config(source)
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    capsys.readouterr()
    code = cli_main(["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(tmp_path / "new"),
                     "--branch-from", f"{source}:{TAG}", "--set", "optimizer.warmup_steps=3", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("roformer pretrain: error: ") and "the learning rate of step 0 is" in err[0]
    assert not (tmp_path / "new").exists()
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before
    # A branch that has started (its record written) but has no checkpoint of its own yet is checked against
    # its recorded point, as rank 0 would; once it has one it resumes from its own and the source is not read.
    new = RunDir(tmp_path / "new")
    new.root.mkdir()
    write_branch_record(new, {"source_run_dir": str(source), "tag": TAG, "step": 5})
    args = ["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(new.root),
            "--branch-from", str(source), "--set", "optimizer.warmup_steps=3", "--dry-run"]
    assert cli_main(args) == 2
    assert f"before the branch step 5 ({TAG})" in capsys.readouterr().err
    shutil.copytree(source / "checkpoints" / TAG, new.checkpoints / TAG)
    assert cli_main(args) == 0
    assert "a branch of" not in capsys.readouterr().err
    # A first start that agrees is announced by the dry run.
    assert cli_main(["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(tmp_path / "other"),
                     "--branch-from", str(source), "--dry-run"]) == 0
    assert f"roformer pretrain: note: a branch of {source} at {TAG} (step 5, stage 'long')" in capsys.readouterr().err


def test_a_branch_into_its_own_source_is_refused_before_the_lock(capsys, source):
    config = stored_run_resume_config(source)
    before = sorted(p.name for p in source.iterdir())
    capsys.readouterr()
    assert cli_main(["pretrain", "--num_gpus", "2", "--config", str(config), "--run-dir", str(source),
                     "--branch-from", str(source)]) == 2
    assert "is the branch source itself" in capsys.readouterr().err
    assert sorted(p.name for p in source.iterdir()) == before  # no lock, no log written into it


def test_rank_zero_verifies_the_branch_point_and_refuses_a_damaged_one(source, tmp_path):
    """decide (rank 0) verifies the files of the point the input checks read (a branch that starts is
    tests/multirank/test_branch.py); a damaged source checkpoint is refused naming the file, and nothing
    is written in either run directory."""
    from launcher.checkpoint import resume
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.inputs.run_checks import check_run, open_streams

    cfg = load_run_config(stored_run_resume_config(source), [f"branch_from={source}"])
    stages = resolve_stages(cfg, 2)
    new = RunDir(tmp_path / "new")
    new.root.mkdir()
    checked = check_run(cfg, stages, 2, ds_json=DeepSpeedJson.of(cfg), run_dir=new.root)
    assert checked.branch.tag == TAG and not checked.branch.entry.verified
    (source / "checkpoints" / TAG / "mp_rank_00_model_states.pt").unlink()  # the stored run's format-1 sidecar:
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}  # every rank's files must be there
    with pytest.raises(UserError, match=rf"branch_from {source}: .*{TAG}: partial checkpoint: "
                                        r"no model state file .*; branch from another of its checkpoints \(RUN_DIR:TAG\)"):
        resume.decide(new, checked.setup, open_streams(cfg, 0, 2)[0], checked.branch)
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before and not any(new.root.iterdir())


def test_a_branch_start_scans_its_own_checkpoints_once(source, tmp_path, monkeypatch):
    """A branch that saved a checkpoint of its own resumes from it: rank 0's input checks (check_inputs) scan its
    catalogue once and the resume decision reuses that scan (each file of RUN_DIR opened at most once, its sidecar
    exactly once: the sys.addaudithook 'open' events). The checks run before the rank holds RUN_DIR, so a
    checkpoint folder that changes in between is seen, never taken from the stale scan."""
    from launcher.checkpoint import resume
    from launcher.train.rank import check_inputs
    from tests.support.open_counts import counting_opens

    own = tmp_path / "own" / "run"
    shutil.copytree(source.parent, own.parent)  # a branch of `source` that saved global_step5 of its own
    argv = ["--config", str(stored_run_resume_config(own)), "--run-dir", str(own), "--set", f"branch_from={source}"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with counting_opens(own) as opened:
        setup = check_inputs(argv)
        # The decision gets past the catalogue (scanned, the newest verified) to the checkpoint's data position:
        # the stored run's format-1 data state, refused by this reader (its own test: test_old_run_dir.py).
        with pytest.raises(DataError, match="data state format 1 "):
            resume.decide(setup.run_dir, setup.run, setup.train_batches, setup.branch_point, setup.own_checkpoints)
    assert setup.branch_point is None and setup.own_checkpoints.catalogue.entry(TAG).verified
    assert opened.get(str((own / "checkpoints" / TAG / "sidecar.json").resolve())) == 1, opened
    assert {path: n for path, n in opened.items() if n > 1} == {}, opened
    assert not any(path.endswith("stages.json") for path in opened)  # the resolved stages are at hand
    setup = check_inputs(argv)
    (own / "checkpoints" / TAG).rename(own / TAG)  # gone before rank 0 holds RUN_DIR: scanned again, refused
    with pytest.raises(UserError, match="its checkpoints changed during start-up; start again"):
        resume.decide(setup.run_dir, setup.run, setup.train_batches, setup.branch_point, setup.own_checkpoints)
