"""Runs reporting to a real `mlflow server` (tests/support/mlflow_server.py), read back with MLflow's own client:
(a) a one-rank run stopped by SIGTERM mid-stage and resumed while its server is unreachable (its tracking URI a port
nothing listens on: refused, as a server that is down), then caught up by the same command started again with the
server's address (the run is finished) and `roformer report`: one MLflow run, every step once with metrics.jsonl's
values, stage boundaries and artifacts (the trackers live in rank 0 alone: a second rank would add nothing);
(b) a guard rewind on 2 ranks (test_guard.py's (b) run, shared: tests/multirank/conftest.py poisoned_rewind_run):
the redone steps told apart from the abandoned ones by their attempt."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("mlflow")

from launcher.train.metrics import read_metrics  # noqa: E402
from tests.support.helpers import (  # noqa: E402
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    events,
    free_port,
    roformer,
    roformer_env,
    run_to_end,
    start_run,
    tiny_run_config,
)
from tests.multirank.conftest import REWIND_EXPERIMENT  # noqa: E402
from tests.support.wandb_log import train_losses  # noqa: E402

pytestmark = pytest.mark.multiprocess
STOP_BEFORE_STEP = 8  # 0-based: mid-way through the second stage (steps 7-10)


def tracker_env(uri: str, experiment: str) -> dict:
    return {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": experiment}


def test_stopped_resumed_with_the_server_down_then_caught_up(tiny_data, tmp_path, mlflow_server):
    """Stopped at step 8 of 16 (reported), resumed with MLflow unreachable (one warning line, training goes on),
    started again once the server answers (the run is finished: the trackers get what they missed), then `roformer
    report`: MLflow and W&B (offline) each hold every step once with metrics.jsonl's values, the stage boundaries,
    the resume and the outcome as tags, report.md and the plots as artifacts."""
    # No plot renders of the run's own: `roformer report` draws RUN_DIR/plots and attaches them with report.md.
    config = tiny_run_config(tmp_path / "config", tiny_data, logging={"report_to": ["tensorboard", "mlflow", "wandb"]})
    run_dir, env = tmp_path / "run", {**tracker_env(mlflow_server.uri, "stop-resume"), "WANDB_MODE": "offline"}
    proc = start_run(1, config, run_dir, module=TEST_RANK_ENTRY,
                     ROFORMER_TEST_SIGTERM_LAUNCHER_AT=str(STOP_BEFORE_STEP), **env)
    assert proc.wait(timeout=600) != 0
    (stopped,) = events(run_dir, "stopped")
    # The resumed run goes on without its server: a port nothing listens on (claimed by this process, so no other
    # test's server takes it) refuses the connection as a stopped server's does; no retries, so no backoff waits.
    down = {**env, **tracker_env(f"http://127.0.0.1:{free_port()}", "stop-resume"),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    run_to_end(1, config, run_dir, log=tmp_path / "resume.log", **down)
    log = (tmp_path / "resume.log").read_text(errors="replace")
    assert log.count("tracking: mlflow unreachable") == 1, log[-3000:]
    client = mlflow_server.client()
    (run,) = client.search_runs([client.get_experiment_by_name("stop-resume").experiment_id])
    train = read_metrics(run_dir)
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) < len(train)  # what it missed
    # The same command again (issue 49, row 7): the run is finished, and first its trackers get what they missed.
    run_to_end(1, config, run_dir, log=tmp_path / "finished.log", **env)
    finished = (tmp_path / "finished.log").read_text(errors="replace")
    assert "already trained to the end of the schedule" in finished and "unreachable" not in finished, finished[-3000:]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == \
        [r["step"] for r in train]
    result = roformer("report", str(run_dir), env=roformer_env(**env), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    (run,) = client.search_runs([client.get_experiment_by_name("stop-resume").experiment_id])
    run_id = run.info.run_id
    assert [r["step"] for r in train] == list(range(1, TINY_TOTAL_STEPS + 1))
    for key in ("loss", "mlm_accuracy", "lr", "grad_norm"):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"train/{key}"))
        assert logged == [(r["step"], r[key]) for r in train], key  # every step once, metrics.jsonl's values
    tags = run.data.tags
    assert [tags[f"stage.{i}.start_step"] for i in range(3)] == ["0", "6", "10"]
    assert [tags[f"stage.{i}.end_step"] for i in range(3)] == ["6", "10", "16"]
    assert tags["run_dir"] == str(run_dir.resolve()) and tags["data_dir"] == str(tiny_data)
    assert tags[f"resume.step{stopped['step']}"].startswith("global_step") and tags["outcome"] == "finished"
    assert run.data.params["model.hidden_size"] == "32"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert "report.md" in artifacts and "plots" in artifacts
    assert any(a.path.endswith(".png") for a in client.list_artifacts(run_id, "plots"))
    # W&B (offline, never down here): the same run id at every start, every step in its ledger once
    wandb_state = json.loads((run_dir / "tracking" / "wandb.json").read_text())
    starts = list((run_dir / "tracking" / "wandb").glob(f"offline-run-*-{wandb_state['run_id']}"))
    assert len(starts) >= 2 and all((d / f"run-{wandb_state['run_id']}.wandb").is_file() for d in starts)
    sent = (run_dir / "tracking" / "wandb.sent").read_text().splitlines()
    train_keys = [k for k in sent if k.startswith("train:")]
    assert sorted(train_keys) == sorted(f"train:0:{s}" for s in range(1, TINY_TOTAL_STEPS + 1))
    logged = train_losses([d / f"run-{wandb_state['run_id']}.wandb" for d in starts], len(train))
    assert logged == [(r["step"], r["loss"]) for r in train]  # W&B's own files: every step once, the same values


def test_guard_rewind_redone_steps_are_told_apart(poisoned_rewind_run, mlflow_server):
    # Steps 7 and 8 carry a poisoned stretch of data: the guard rewinds to step 6 and redoes 7-12 (attempt 1).
    # The run is test_guard.py's (b), shared (tests/multirank/conftest.py poisoned_rewind_run).
    _, run_dir = poisoned_rewind_run
    [rewind] = events(run_dir, "guard")
    [attempt] = events(run_dir, "attempt")
    assert (attempt["attempt"], attempt["step"]) == (1, rewind["to_step"])
    client = mlflow_server.client()
    (run,) = client.search_runs([client.get_experiment_by_name(REWIND_EXPERIMENT).experiment_id])
    run_id = run.info.run_id
    attempts = {(m.step, m.timestamp): int(m.value) for m in client.get_metric_history(run_id, "train/attempt")}
    loss = [(attempts[(m.step, m.timestamp)], m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")]
    final = {r["step"]: r for r in read_metrics(run_dir)}
    redone = range(rewind["to_step"] + 1, rewind["step"] + 1)  # written, then abandoned by the rewind
    assert sorted((s, a) for a, s, _ in loss if s in redone) == sorted([(s, 0) for s in redone] + [(s, 1) for s in redone])
    assert sorted((s, v) for a, s, v in loss if a == final[s]["attempt"]) == sorted((s, r["loss"]) for s, r in final.items())
    assert all(final[s]["attempt"] == (1 if s > rewind["to_step"] else 0) for s in final)
    assert "attempt.1" in run.data.tags and f"guard.step{rewind['step']}.rewind" in run.data.tags
