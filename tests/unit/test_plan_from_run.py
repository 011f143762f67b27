"""`roformer plan --from-run RUN` (issue 61 item 3) on a real run directory: the stored release run (2 ranks,
stages 32 x 8 for 3 steps and 64 x 4 for 2), its metrics.jsonl given noise estimates in the contract's format
(grad_noise_scale, grad_sq_norm, grad_noise_trace at the steps with an estimate). The printed schedule file is
accepted by `roformer plan --config`; a run without estimates gets one line naming logging.noise_every."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from launcher.run_dir.metrics_format import read_records
from tests.support.helpers import roformer

REPO = Path(__file__).resolve().parents[2]


def _with_noise(release_run: Path, to: Path, noise: dict[int, float]) -> Path:
    """A copy of release_run whose train record at step s (a key of `noise`) carries the estimate noise[s]."""
    shutil.copytree(release_run, to, symlinks=True)
    lines = []
    for record in read_records(to / "metrics.jsonl"):
        if record.get("kind") == "train" and record["step"] in noise:
            record.update(grad_noise_scale=noise[record["step"]], grad_sq_norm=0.5, grad_noise_trace=3.0)
        lines.append(json.dumps(record))
    (to / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return to


def test_plan_from_run_prints_a_ramp_that_plan_accepts(tmp_path, release_run):
    # Stage 0 (granularity micro 4 x 2 ranks = 8): 7 -> 15 -> 30 rounds to 8 -> 16 -> 32, grown by the estimate
    # of step 3, after 2 steps x 8 x 32 = 512 token slots. Stage 1 has no estimate: its batch (4) is kept.
    run = _with_noise(release_run, tmp_path / "run", {1: 7.0, 2: 15.0, 3: 30.0})
    printed = roformer("plan", "--from-run", str(run))
    assert printed.returncode == 0, printed.stderr
    schedule = yaml.safe_load(printed.stdout)
    assert schedule["stages"][0]["global_batch_size"] == {"start": 8, "end": 32, "over": 512, "increment": 8}
    assert [s["tokens"] for s in schedule["stages"]] == [3 * 8 * 32, 2 * 4 * 64]  # the run's stage ends
    assert schedule["stages"][1]["global_batch_size"] == 4 and schedule["stages"][1]["max_seq_len"] == 64
    assert "# long: ran at batch 4; no estimate in this stage: kept" in printed.stdout

    out = tmp_path / "suggested.yaml"
    written = roformer("plan", "--from-run", str(run), "--out", str(out))
    assert written.returncode == 0 and out.read_text(encoding="utf-8") == printed.stdout
    config = yaml.safe_load((release_run.parent / "run.yaml").read_text(encoding="utf-8"))
    config["data"]["data_dir"] = str(release_run.parent / "data")
    config["schedule"]["file"] = str(out)
    config["deepspeed"]["config"] = str(REPO / "ds_configs" / "cpu_fp32_zero2.json")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    planned = roformer("plan", "--config", str(tmp_path / "run.yaml"), "--world-size", "2", "--json")
    assert planned.returncode == 0, planned.stderr
    batches = [s["global_batch_size"] for s in json.loads(planned.stdout)["stages"]]
    # The ramp's pieces (8 for 256 slots, 16 for 512: the stage's 768 end before 32), then stage 1 at 4.
    assert batches == [8, 16, 4]
    # An existing file that is not ours is never replaced (the output gate).
    mine = tmp_path / "mine.yaml"
    mine.write_text("stages: []\n", encoding="utf-8")
    refused = roformer("plan", "--from-run", str(run), "--out", str(mine))
    assert refused.returncode == 2 and "--out" in refused.stderr and mine.read_text(encoding="utf-8") == "stages: []\n"


def test_plan_from_run_without_estimates_says_so_in_one_line(tmp_path, release_run):
    result = roformer("plan", "--from-run", str(release_run))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "logging.noise_every" in lines[0] and "grad_noise_scale" in lines[0]
    missing = roformer("plan", "--from-run", str(tmp_path))
    assert missing.returncode == 2 and "stages.json" in missing.stderr
    both = roformer("plan", "--from-run", str(release_run), "--world-size", "2")
    assert both.returncode == 2 and "--world-size" in both.stderr
    neither = roformer("plan", "--world-size", "2")
    assert neither.returncode == 2 and "--config" in neither.stderr
