"""launcher/tracking: the records of launcher/train/metrics.py in a real MLflow server (read back with MLflow's
own client) and in W&B's offline files (read back with W&B's own datastore reader). Metrics is driven directly
here (no DeepSpeed job): resume from a stop, a restart from an older checkpoint, a guard rewind, the server down."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from launcher.config.stages import ResolvedStage  # noqa: E402
from launcher.run_dir.layout import RunDir  # noqa: E402
from launcher.config.report_to import parse_report_to  # noqa: E402
from launcher.tracking.remote import Ledger  # noqa: E402
from launcher.tracking.open_sinks import TrackedRun  # noqa: E402
from launcher.train.metrics import Metrics, MetricsOptions, read_metrics  # noqa: E402
from launcher.common.errors import UserError  # noqa: E402
from tests.support.mlflow_server import MlflowServer  # noqa: E402
from tests.support.tcp_gate import TcpGate  # noqa: E402
from tests.support.wandb_log import train_losses  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield srv
    srv.stop()


def stages_of(total: int) -> list[ResolvedStage]:
    half = total // 2
    return [ResolvedStage(index=i, name=f"s{i}", max_seq_len=16, global_batch_size=4, micro_batch_size=2,
                          grad_accum_steps=1, steps=end - first, first_step=first, lr_scale=1.0)
            for i, (first, end) in enumerate([(0, half), (half, total)])]


def train(metrics: Metrics, steps: range, attempt_bias: float = 0.0) -> None:
    for step in steps:
        stage = 0 if step <= 3 else 1
        if step in (1, 4):
            metrics.event("stage_start", step=step - 1, stage=stage, name=f"s{stage}", max_seq_len=16,
                          global_batch_size=4)
        metrics.train_step({"step": step, "stage": stage, "loss": 10.0 - step + attempt_bias, "mlm_accuracy": 0.1 * step,
                            "lr": 1e-3, "grad_norm": 1.5, "loss_scale": 1.0, "step_time_s": 0.1, "tokens_per_s": 640.0,
                            "samples_per_s": 10.0, "tokens_by_source": {"wiki": 40, "books": 24}})


def open_metrics(run_dir: RunDir, start: int, report_to=("tensorboard", "mlflow")) -> Metrics:
    return Metrics(run_dir, 0, stages_of(6), start, MetricsOptions(total_steps=6, log_every=1, progress_bar=False),
                   TrackedRun(report_to, {"model.hidden_size": "128"}, {"run_dir": str(run_dir.root), "data_dir": "/data"}))


def wait_sent(run_dir: RunDir, key: str, seconds: float = 60) -> None:
    import time

    deadline = time.time() + seconds
    while key not in Ledger(run_dir, "mlflow").sent():
        assert time.time() < deadline, f"{key} never sent"
        time.sleep(0.2)


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_report_to_values():
    assert parse_report_to("mlflow,wandb") == ("mlflow", "wandb")
    assert parse_report_to(["none"]) == ()
    with pytest.raises(UserError, match="comet"):
        parse_report_to("comet")


def test_mlflow_resume_rewind_and_server_down(tmp_path, server, monkeypatch, capsys):
    gate = TcpGate(server.port).open()  # the server as the run sees it: down while the gate is closed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", gate.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "unit-trackers")
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    # 1. steps 1-3, a stop (its checkpoint at 3), resumed from 3: every step once
    m = open_metrics(run_dir, 0)
    train(m, range(1, 4))
    m.event("stopped", step=3)
    m.close()
    run_id = Ledger(run_dir, "mlflow").run_id()
    client = server.client()
    assert client.get_run(run_id).info.status == "KILLED"
    m = open_metrics(run_dir, 3)
    train(m, range(4, 6))
    # 2. a guard rewind to step 4: step 5 redone as attempt 1
    m.event("guard", step=5, action="rewind", message="loss spike at step 5")
    m.rewind(4)
    train(m, range(5, 6), attempt_bias=0.5)
    wait_sent(run_dir, "train:1:5")  # the sink sends from its own thread: all sent before the server goes
    # 3. the server goes down (refused, its open connections reset): training goes on, one warning, metrics.jsonl
    # has step 6
    gate.close()
    train(m, range(6, 7))
    m.event("finished", step=6)
    m.close()
    err = capsys.readouterr().err
    assert err.count("tracking: mlflow unreachable") == 1, err
    assert [r["step"] for r in read_metrics(run_dir.root)] == [1, 2, 3, 4, 5, 6]
    # 4. the server back: the next start (here of a finished run, as `roformer report` does) fills in step 6
    gate.open()
    run_dir.evals.mkdir()  # a stage-end eval job's result, written meanwhile
    (run_dir.evals / "global_step3.mlm.json").write_text(json.dumps(
        {"eval": "mlm", "tag": "global_step3", "step": 3, "results": [{"seq_len": 16, "loss": 2.5}]}))
    from launcher.tracking.attach import sync_run

    sync_run(run_dir, [])
    client = server.client()
    run = client.get_run(run_id)
    # The run finished while the server was down: the catch-up ends it there too, at the time it finished
    # (it was left RUNNING with no end time before).
    finished_at = next(r["time"] for r in read_metrics(run_dir.root, kind="event") if r["event"] == "finished")
    assert run.info.status == "FINISHED" and run.info.end_time == int(finished_at * 1000)
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert run.data.params["model.hidden_size"] == "128" and run.data.tags["data_dir"] == "/data"
    assert run.data.tags["stage.1.start_step"] == "3" and run.data.tags["stage.0.end_step"] == "3"
    assert "attempt.1" in run.data.tags and run.data.tags["outcome"] == "finished"
    loss = client.get_metric_history(run_id, "train/loss")
    attempts = {(m.step, m.timestamp): m.value for m in client.get_metric_history(run_id, "train/attempt")}
    by_attempt = sorted((int(attempts[(m.step, m.timestamp)]), m.step, m.value) for m in loss)
    assert by_attempt == [(0, 1, 9.0), (0, 2, 8.0), (0, 3, 7.0), (0, 4, 6.0), (0, 5, 5.0), (1, 5, 5.5), (1, 6, 4.0)]
    final = {r["step"]: r for r in read_metrics(run_dir.root)}
    assert {(m.step, m.value) for m in loss if attempts[(m.step, m.timestamp)] == final[m.step]["attempt"]} == \
        {(s, r["loss"]) for s, r in final.items()}
    assert history(client, run_id, "train/tokens_by_source/wiki")[0] == (1, 40.0)
    assert history(client, run_id, "guard/rewind") == [(5, 1.0)]
    assert history(client, run_id, "eval/mlm/results/0/loss") == [(3, 2.5)]
    # 5. a rank's start of the finished run catches up the same way with the stage ends of its resolved stages:
    # RUN_DIR/stages.json is not read (issue 62 R3), and nothing is sent twice.
    from launcher.config.stages import stage_ends
    from tests.support.open_counts import counting_opens

    run_dir.stages.write_text("not the stages")
    tracking = TrackedRun(("tensorboard", "mlflow"), {"model.hidden_size": "128"},
                          {"run_dir": str(run_dir.root), "data_dir": "/data"})
    with counting_opens(run_dir.root) as opened:
        sync_run(run_dir, [], tracking, stage_ends(stages_of(6)))
    assert str(run_dir.stages.resolve()) not in opened and opened, opened
    assert "unreachable" not in capsys.readouterr().err
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")) == sorted(
        (m.step, m.value) for m in loss)
    gate.close()


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_PROJECT", "unit-trackers")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: offline
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # the service this test starts is not the next test's
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    m = open_metrics(run_dir, 0, ("wandb",))
    train(m, range(1, 4))
    m.event("stopped", step=3)
    m.close()
    m = open_metrics(run_dir, 3, ("wandb",))
    train(m, range(4, 7))
    m.event("finished", step=6)
    m.close()
    state = json.loads((run_dir.root / "tracking" / "wandb.json").read_text())
    assert state["mode"] == "offline"
    files = sorted(Path(state["dir"]).glob(f"offline-run-*-{state['run_id']}/run-{state['run_id']}.wandb"))
    assert files  # W&B's own files, one W&B run id (one folder per start, unless two starts share a second)
    assert {f"train:0:{s}" for s in range(1, 7)} <= Ledger(run_dir, "wandb").sent()
    # W&B's own record schema; every step of both starts once is read back by the 2-rank test
    # (tests/multirank/test_trackers.py), where each start is its own process as in a real run: two starts in
    # one process under load lost the second's rows once in CI (the ledger above has them).
    logged = train_losses(files, 6)
    assert logged[:3] == [(s, 10.0 - s) for s in range(1, 4)] and len(set(logged)) == len(logged)
    assert set(logged) <= {(s, 10.0 - s) for s in range(1, 7)}


def test_finetune_job_is_one_tracked_run_linked_to_its_export(tmp_path, server, monkeypatch):
    from launcher.tracking.finetune_run import report_finetune

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "unit-finetune")
    run_dir = tmp_path / "run"
    (run_dir / "tracking").mkdir(parents=True)
    (run_dir / "tracking" / "mlflow.json").write_text(json.dumps({"run_id": "pretraining-run"}))
    export = run_dir / "exports" / "global_step6"
    export.mkdir(parents=True)
    (export / "export_info.json").write_text(json.dumps({"run_dir": str(run_dir), "tag": "global_step6", "step": 6}))
    report = {"task": "sst2", "held_out": {"split": "dev", "accuracy": {"mean": 0.75}}, "seeds": [0]}
    ids = report_finetune(("mlflow",), export, {"task": "sst2", "epochs": "3"}, report, [])
    run = server.client().get_run(ids["mlflow"])
    assert run.data.tags["source.mlflow_run_id"] == "pretraining-run"
    assert run.data.tags["source.tag"] == "global_step6" and run.data.tags["export_dir"] == str(export)
    assert run.data.metrics["finetune/held_out/accuracy/mean"] == 0.75 and run.data.params["epochs"] == "3"
    assert run.info.status == "FINISHED"


def test_tracker_settings_reach_every_node_and_secrets_no_record(tmp_path, monkeypatch):
    from launcher.launch.env_forwarding import forwarded_environment
    from launcher.tracking.mlflow_backend import MlflowBackend

    env = forwarded_environment({"MLFLOW_TRACKING_URI": "http://u:pw@mlflow:5000", "MLFLOW_EXPERIMENT_NAME": "e",
                                 "MLFLOW_TRACKING_PASSWORD": "pw", "MLFLOW_TRACKING_TOKEN": "t", "WANDB_PROJECT": "p",
                                 "WANDB_MODE": "offline", "WANDB_API_KEY": "k", "HOME": str(tmp_path)},
                                ranks_per_node=2, local=False)
    assert {k for k in env if k.startswith(("MLFLOW", "WANDB"))} == \
        {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_MODE"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://u:pw@mlflow:5000")
    assert MlflowBackend(tmp_path, "run").where()["tracking_uri"] == "http://mlflow:5000"


def test_restart_from_an_older_checkpoint_is_a_new_attempt_and_none_reports_nowhere(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    m = open_metrics(run_dir, 0, ())
    train(m, range(1, 6))  # a fault after step 5; the newest checkpoint is step 3
    m.close()
    m = open_metrics(run_dir, 3, ())
    train(m, range(4, 7))
    m.close()
    assert not run_dir.tensorboard.exists()  # report_to [none]: metrics.jsonl only
    from launcher.train.metrics import read_metrics as read

    [attempt] = [e for e in read(run_dir.root, "event") if e["event"] == "attempt"]
    assert (attempt["attempt"], attempt["step"]) == (1, 3)
    assert [(r["step"], r["attempt"]) for r in read(run_dir.root)] == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]
    m = open_metrics(run_dir, 6, ())  # a resume from the stop at the end: no new attempt
    m.close()
    assert len([e for e in read(run_dir.root, "event") if e["event"] == "attempt"]) == 1
