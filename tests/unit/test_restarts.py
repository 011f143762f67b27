"""The restart policy of `roformer pretrain --max-restarts` (launcher/launch/restart_loop.py) without a job:
what is retried and what is not, the backoff, node exclusion keeping every stage's global batch (or
refused naming the stage), the loop driven by scripted launches, RUN_DIR/restarts.json round trips,
the `restarts:` config section and the report's restarts table and plot marks."""
from __future__ import annotations

import json
import signal
import time
from argparse import Namespace
from pathlib import Path

import pytest

from launcher.config.restarts_section import RestartsSection
from launcher.common.errors import UserError
from launcher.launch.restart_loop import Fault, RestartPolicy, fault_of, run_with_restarts
from launcher.launch.supervise import Failure, JobOutcome
from launcher.run_dir.layout import RunDir
from launcher.run_dir.restart_records import RestartRecord, append_restart, read_restarts, update_restart
from tests.support.helpers import REPO, run_config_dict, write_complete_checkpoint, write_schedule, write_yaml


def fault(kind="rank", status="killed by SIGKILL", step=9, node="node2", rank=1, returncode=137) -> Fault:
    return Fault(kind, f"rank {rank} on node {node}: {status}", status, node, rank, step, returncode)


POLICY = RestartPolicy(max_restarts=3, backoff_seconds=10, max_backoff_seconds=30, exclude_failed_nodes=False)


# --- the policy (pure) ------------------------------------------------------------------------------

def test_backoff_doubles_up_to_its_cap():
    assert [POLICY.backoff(n) for n in (1, 2, 3, 4)] == [10, 20, 30, 30]
    assert RestartPolicy(3, 0.0, 0.0).backoff(3) == 0


def test_same_error_twice_at_the_same_step_is_not_retried_and_is_named():
    first = fault(step=9)
    assert POLICY.decide(first, [], 0).restart
    decision = POLICY.decide(fault(step=9, rank=0, node="node1"), [first], 1)  # another rank: still the same error
    assert not decision.restart
    assert decision.reason == ("the same error twice at step 9 (killed by SIGKILL): a deterministic fault (a bug, "
                               "a bad batch, a config error) is not retried")
    assert POLICY.decide(fault(step=10), [first], 1).restart  # a later step: progress was made
    assert POLICY.decide(fault(status="exit code 1", step=9), [first], 1).restart  # another error
    hang = "stopped making progress in train step 15 for {} s (bound 20 s): its node cannot reach rank 0's host"
    assert not POLICY.decide(fault(kind="hung", status=hang.format(26), step=14),
                             [fault(kind="hung", status=hang.format(31), step=14)], 1).restart  # how long: not the error
    preempted = fault(kind="preempted", status="preempted", node=None, rank=None)
    assert POLICY.decide(preempted, [preempted], 1).restart  # a scheduler may preempt twice at one step


def test_bad_input_and_spent_restarts_are_not_retried():
    decision = POLICY.decide(fault(status="exit code 2"), [], 0)
    assert not decision.restart and "exit code 2: a config or data error" in decision.reason
    said = "rank 0: checkpoint global_step8 could not be written (the filesystem is full)"
    refused = Fault("rank", "rank 1 on node node2: exit code 2", "exit code 2", "node2", 1, 8, 2, said)
    assert POLICY.decide(refused, [], 0).reason.endswith(f"would meet again: {said}")  # the cause, as the rank said
    assert POLICY.decide(fault(), [fault(step=3), fault(step=5), fault(step=7)], 3).reason == "--max-restarts 3 spent"
    assert RestartPolicy().decide(fault(), [], 0).reason == "--max-restarts 0 (restarts are off)"


def test_exclusion_names_the_failed_or_hung_node_only():
    excluding = RestartPolicy(3, 1, 1, exclude_failed_nodes=True)
    assert excluding.decide(fault(kind="hung", node="node2"), [], 0).exclude == "node2"
    assert excluding.decide(fault(kind="node", node="node1", rank=None), [], 0).exclude == "node1"
    assert excluding.decide(fault(kind="preempted", node=None, rank=None), [], 0).exclude is None
    assert POLICY.decide(fault(kind="hung"), [], 0).exclude is None  # without --exclude-failed-nodes


def test_flags_override_the_config_section():
    section = RestartsSection(max_restarts=2, exclude_failed_nodes=True, backoff_seconds=5, max_backoff_seconds=60)
    assert RestartPolicy.from_args(Namespace(max_restarts=None, exclude_failed_nodes=None), section) == \
        RestartPolicy(2, 5, 60, True)
    assert RestartPolicy.from_args(Namespace(max_restarts=0, exclude_failed_nodes=None), section).max_restarts == 0
    with pytest.raises(UserError, match=r"--max-restarts -1: must be >= 0"):
        RestartPolicy.from_args(Namespace(max_restarts=-1, exclude_failed_nodes=None), section)


def test_faults_from_job_outcomes():
    now = time.monotonic()
    hung = JobOutcome(124, Failure("node2", 1, "0", "stopped making progress", now, hung=True), None, now)
    assert (fault_of(hung, 14).kind, fault_of(hung, 14).node, fault_of(hung, 14).failed_at_step) == ("hung", "node2", 14)
    node = JobOutcome(1, Failure("node1", None, "?", "remote launcher exit code 1", now), None, now)
    assert fault_of(node, 3).kind == "node"
    preempted = JobOutcome(143, None, None, now)
    assert preempted.preempted and fault_of(preempted, 5).kind == "preempted"
    assert not JobOutcome(143, None, signal.SIGTERM, now).preempted  # a stop asked of roformer pretrain
    # SIGTERM to every process of a node: its DeepSpeed launcher says so, then exits 1 once its ranks checkpointed.
    node_term = JobOutcome(1, Failure("node1", None, "?", "remote launcher exit code 1", now), None, now, ["node1"])
    assert node_term.preempted and fault_of(node_term, 27).cause.startswith("preempted: the job's processes on node1 ")
    assert not JobOutcome(1, node.failure, None, now, ["node2"]).preempted  # another node's launcher failed


def test_the_output_monitor_notes_nodes_whose_launcher_got_sigterm(tmp_path):
    from argparse import Namespace
    from collections import OrderedDict

    from launcher.launch.supervise import OutputMonitor

    monitor = OutputMonitor(Namespace(resources=OrderedDict(node1=[0], node2=[0])))
    monitor.feed("node2: [2026-11-25 04:00:00,000] [INFO] [launch.py:262:sigkill_handler] Main process received "
                 "SIGTERM, exiting\n")
    monitor.feed("pdsh@node0: node2: ssh exited with exit code 1\n")
    assert monitor.signalled_nodes == ["node2"] and monitor.first().host == "node2"


# --- the config section -------------------------------------------------------------------------------

def test_restarts_section_fields_are_checked_by_name_and_not_recorded(tmp_path):
    from launcher.config.run_config import load_run_config

    schedule = write_schedule(tmp_path / "s.yaml", [{"name": "a", "max_seq_len": 16, "global_batch_size": 8,
                                                     "steps": 2}])
    path = write_yaml(tmp_path / "run.yaml", run_config_dict(schedule_file=schedule, restarts={"max_restarts": 2}))
    cfg = load_run_config(path)
    assert cfg.restarts.max_restarts == 2 and "restarts" not in cfg.to_dict()
    with pytest.raises(UserError, match=r"restarts\.backoff_seconds: must be >= 0"):
        load_run_config(path, ["restarts.backoff_seconds=-1"])
    with pytest.raises(UserError, match=r"restarts\.max_backoff_seconds: must be >= restarts\.backoff_seconds"):
        load_run_config(path, ["restarts.backoff_seconds=20", "restarts.max_backoff_seconds=5"])
    with pytest.raises(UserError, match=r"unknown key\(s\) restarts\.retries"):
        load_run_config(path, ["restarts.retries=1"])


# --- exclusion keeps every stage's global batch, or is refused naming the stage -------------------------

def _plan_args(tmp_path: Path, hostfile_text: str) -> Namespace:
    schedule = write_schedule(tmp_path / "s.yaml", [
        {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 3},
        {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "micro_batch_size": 4, "steps": 3}])
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(schedule_file=schedule))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hostfile_text)
    return Namespace(hostfile=str(hostfile), include="", exclude="", num_nodes=-1, num_gpus=-1, master_addr="",
                     master_port=29500, launcher="pdsh", launcher_args="", force_multi=False, bind_cores_to_rank=False,
                     bind_core_list=None, config=str(config), run_dir=str(tmp_path / "run"), overrides=[],
                     entry_module="launcher.train.rank_entry")


def test_excluding_a_node_keeps_every_stage_global_batch(tmp_path):
    from launcher.launch.launch_plan import build_plan

    args = _plan_args(tmp_path, "node1 slots=2\nnode2 slots=2\n")
    full, smaller = build_plan(args), build_plan(args, drop_hosts=("node2",))
    assert (full.world_size, smaller.world_size) == (4, 2)
    assert list(smaller.resources) == ["node1"] and smaller.hostfile.render() == "node1 slots=2\n"
    for big, small in zip(full.stages, smaller.stages):
        assert small.global_batch_size == big.global_batch_size
        assert small.grad_accum_steps * small.micro_batch_size * 2 == big.global_batch_size
    assert smaller.stages[1].grad_accum_steps == 2 * full.stages[1].grad_accum_steps


def test_excluding_a_node_is_refused_naming_the_stage_that_cannot_keep_its_batch(tmp_path):
    from launcher.launch.launch_plan import build_plan

    args = _plan_args(tmp_path, "node1 slots=3\nnode2 slots=1\n")
    assert build_plan(args, drop_hosts=("node1",)).world_size == 1
    with pytest.raises(UserError, match=r"world size 3 .*does not fit the schedule: .*short"):
        build_plan(args, drop_hosts=("node2",))
    with pytest.raises(UserError, match=r"no host left once node1, node2 are excluded"):
        build_plan(args, drop_hosts=("node1", "node2"))


# --- the loop, with scripted launches ------------------------------------------------------------------

class ScriptedJob:
    """launch(plan) plays the next scripted attempt: writes train records up to a step, maybe a checkpoint
    sidecar, and returns its JobOutcome."""

    def __init__(self, run_dir: Path, attempts: list[tuple[int, int | None, JobOutcome]]):
        self.run_dir, self.attempts, self.plans = RunDir(run_dir), list(attempts), []

    def __call__(self, plan):
        self.plans.append(plan)
        reach, checkpoint, outcome = self.attempts.pop(0)
        from launcher.launch.restart_loop import train_records

        done = train_records(self.run_dir)
        start = 0 if not done else _checkpoint_step(self.run_dir)
        if done:  # as a resumed rank 0 does: the lines past the checkpoint dropped, a fresh format event first
            kept = [line for line in self.run_dir.metrics.read_text().splitlines()
                    if json.loads(line).get("kind") != "train" or json.loads(line)["step"] <= start]
            fresh = json.dumps({"kind": "event", "event": "metrics_format", "version": 2, "time": time.time()})
            self.run_dir.metrics.write_text("".join(line + "\n" for line in [fresh, *kept]))
        with open(self.run_dir.metrics, "a") as f:
            if not done and f.tell() == 0:  # as a new run's rank 0 does: the format event first
                f.write(json.dumps({"kind": "event", "event": "metrics_format", "version": 2, "time": time.time()}) + "\n")
            f.write(json.dumps({"kind": "event", "event": "startup", "time": time.time()}) + "\n")
            for step in range(start + 1, reach + 1):
                f.write(json.dumps({"kind": "train", "step": step, "step_time_s": 0.25 if done else 0.5}) + "\n")
        if checkpoint is not None:
            write_complete_checkpoint(self.run_dir, checkpoint)
        return outcome


def _checkpoint_step(run_dir: RunDir) -> int:
    from launcher.launch.restart_loop import restart_point

    return restart_point(run_dir)[0]


def _killed(host="node2", rank=1) -> JobOutcome:
    now = time.monotonic()
    return JobOutcome(137, Failure(host, rank, "0", "killed by SIGKILL", now - 2.0), None, now)


def _run(tmp_path, job, policy, rebuild=None):
    plan = Namespace(run_dir=tmp_path / "run", world_size=2)
    (tmp_path / "run").mkdir(exist_ok=True)
    said, slept, drops = [], [], []

    def default_rebuild(drop):
        drops.append(drop)
        return Namespace(run_dir=tmp_path / "run", world_size=2 - len(drop))

    rc = run_with_restarts(plan, policy, job, rebuild or default_rebuild, said.append, sleep=slept.append)
    return rc, said, slept, drops


def test_loop_restarts_from_the_newest_checkpoint_and_records_the_cost(tmp_path):
    job = ScriptedJob(tmp_path / "run", [(9, 8, _killed()), (20, 20, JobOutcome(0, None, None, time.monotonic()))])
    rc, said, slept, drops = _run(tmp_path, job, POLICY)
    assert rc == 0 and slept == [10] and drops == [()]
    assert said == ["roformer pretrain: restart 1/3 in 10 s from global_step8 (step 8; 1 step(s) to redo) after: "
                    "rank 1 (local rank 0) on node node2: killed by SIGKILL"]
    [record] = read_restarts(RunDir(tmp_path / "run"))
    assert (record.action, record.kind, record.node, record.failed_at_step, record.restarted_from_step,
            record.steps_lost, record.redo_seconds, record.backoff_seconds) == \
        ("restart", "rank", "node2", 9, 8, 1, 0.5, 10)
    assert record.stop_seconds >= 2.0  # the failure was seen 2 s before the job had ended
    assert 0.25 <= record.restart_seconds < 0.45  # the restart's own first step (0.25 s), not the run's first
    assert record.restart_seconds is not None and record.seconds_lost == pytest.approx(
        record.stop_seconds + 10 + record.restart_seconds + 0.5, abs=0.02)


def test_loop_before_any_checkpoint_restarts_from_step_0_and_gives_up_on_a_repeat(tmp_path):
    job = ScriptedJob(tmp_path / "run", [(3, None, _killed()), (3, None, _killed())])
    rc, said, slept, _ = _run(tmp_path, job, POLICY)
    assert rc == 137 and slept == [10]
    assert "from step 0 (no checkpoint yet; 3 step(s) to redo)" in said[0]
    assert said[1].startswith("roformer pretrain: not restarting: the same error twice at step 3 (killed by SIGKILL)")
    records = read_restarts(RunDir(tmp_path / "run"))
    assert [(r.action, r.restarted_from_step, r.restarted_from_tag) for r in records] == \
        [("restart", 0, None), ("gave up", 0, None)]


def test_loop_excludes_the_failed_node_and_gives_up_naming_the_stage_when_the_batch_cannot_be_kept(tmp_path):
    policy = RestartPolicy(3, 1, 1, exclude_failed_nodes=True)
    job = ScriptedJob(tmp_path / "run", [(5, 4, _killed("node2")), (7, 6, _killed("node1", 0))])
    calls = []

    def rebuild(drop):
        calls.append(drop)
        if len(drop) > 1:
            raise UserError("world size 0 does not fit the schedule: stage 'short': ...")
        return Namespace(run_dir=tmp_path / "run", world_size=1)

    rc, said, _, _ = _run(tmp_path, job, policy, rebuild)
    assert calls == [("node2",), ("node2", "node1")] and rc == 137
    assert "without node2 (world size 1)" in said[0]
    assert said[1] == ("roformer pretrain: not restarting: cannot restart without node2, node1: world size 0 does not "
                       "fit the schedule: stage 'short': ...")
    first, second = read_restarts(RunDir(tmp_path / "run"))
    assert first.excluded_nodes == ["node2"] and first.world_size == 1
    assert second.action == "gave up" and "stage 'short'" in second.reason


def test_a_restart_failing_before_its_first_step_failed_where_it_resumed(tmp_path):
    job = ScriptedJob(tmp_path / "run", [(9, 8, _killed()), (8, None, _killed()), (8, None, _killed())])
    rc, said, slept, _ = _run(tmp_path, job, POLICY)
    records = read_restarts(RunDir(tmp_path / "run"))
    assert [(r.action, r.failed_at_step, r.steps_lost) for r in records] == \
        [("restart", 9, 1), ("restart", 8, 0), ("gave up", 8, 0)]
    assert rc == 137 and slept == [10, 20]
    assert records[1].restart_seconds is None and records[1].seconds_lost is None  # it never took a step


def test_a_stop_asked_of_roformer_pretrain_is_not_restarted(tmp_path):
    job = ScriptedJob(tmp_path / "run", [(4, 4, JobOutcome(143, None, signal.SIGTERM, time.monotonic()))])
    rc, said, slept, _ = _run(tmp_path, job, POLICY)
    assert rc == 143 and said == [] and slept == []
    assert read_restarts(RunDir(tmp_path / "run")) == []


# --- the record ------------------------------------------------------------------------------------------

def _record(**changes) -> RestartRecord:
    base = dict(attempt=1, action="restart", time="2026-11-25T04:00:00+0000", unix_time=1.8e9, cause="rank 1 on node node2: killed",
                kind="rank", node="node2", rank=1, failed_at_step=9, restarted_from_step=8,
                restarted_from_tag="global_step8", steps_lost=1, stop_seconds=3.0, backoff_seconds=10.0,
                redo_seconds=0.5)
    return RestartRecord(**{**base, **changes})


def test_records_round_trip_and_bad_files_are_named(tmp_path):
    run_dir = RunDir(tmp_path)
    assert read_restarts(run_dir) == []
    append_restart(run_dir, _record())
    append_restart(run_dir, _record(attempt=2, action="gave up", reason="--max-restarts 1 spent"))
    update_restart(run_dir, 0, restart_seconds=20.0, seconds_lost=33.5)
    first, second = read_restarts(run_dir)
    assert first == _record(restart_seconds=20.0, seconds_lost=33.5) and second.reason == "--max-restarts 1 spent"
    run_dir.restarts.write_text('{"restarts": [{"attempt": 1, "colour": "red"}]}')
    with pytest.raises(UserError, match=r"restarts\.json: restart 1: unknown field\(s\) colour"):
        read_restarts(run_dir)
    run_dir.restarts.write_text('{"restarts": [' + json.dumps({**_record().__dict__, "action": "retry"}) + "]}")
    with pytest.raises(UserError, match=r"restart 1: action: expected one of restart, gave up, got 'retry'"):
        read_restarts(run_dir)
    run_dir.restarts.write_text("{not json")
    with pytest.raises(UserError, match=r"restarts\.json: not a restart record"):
        read_restarts(run_dir)


# --- the report --------------------------------------------------------------------------------------------

def test_report_has_a_restarts_table_and_marks_them_on_the_loss_plot(tmp_path):
    from launcher.commands.report import make_report
    from tests.support.stand_in_runs import stand_in_run

    run_dir = stand_in_run(tmp_path / "run")
    append_restart(run_dir, _record(seconds_lost=33.5, restart_seconds=20.0, world_size=2))
    append_restart(run_dir, _record(attempt=2, action="gave up", failed_at_step=15, restarted_from_step=12,
                                    steps_lost=3, reason="--max-restarts 1 spent"))
    files = make_report(run_dir.root)
    text = files.report.read_text()
    assert "## Restarts" in text
    assert "| 1 | restart | rank 1 on node node2: killed | node2 | 9 | 8 | 1 | 33.5 | 2 |" in text
    assert "| 2 | gave up | rank 1 on node node2: killed | node2 | 15 | 12 | 3 | - | - |" in text
    assert "--max-restarts 1 spent |" in text and "1 restart; 33.5 s lost in all" in text
    # The marks: red pixels in the loss plot, none without restarts.json.
    from tests.support.helpers import check_png

    check_png(run_dir.plots / "curves_steps.png", colours=((214, 39, 40),))
    assert json.loads(run_dir.restarts.read_text())["restarts"][0]["attempt"] == 1
    run_dir.restarts.unlink()
    assert "## Restarts" not in make_report(run_dir.root).report.read_text()


def test_plan_shows_the_smaller_world_without_excluded_nodes(tiny_data, tmp_path, monkeypatch, capsys):
    """`roformer plan --hostfile H --exclude-nodes node-b`: the plan a restart without node-b would run
    (each stage's global batch kept, more accumulation), or the stage that cannot keep it, named."""
    from launcher.cli import main as cli_main
    from tests.support.helpers import tiny_run_config

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\nnode-c slots=1\n")
    stages = [{"name": "small", "max_seq_len": 32, "global_batch_size": 8, "micro_batch_size": 1, "steps": 3},
              {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "micro_batch_size": 2, "steps": 2}]
    config = tiny_run_config(tmp_path, tiny_data, stages=stages)
    base = ["plan", "--config", str(config), "--hostfile", str(hostfile), "--peak-tflops", "1", "--json"]
    assert cli_main([*base, "--exclude-nodes", "node-c"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["world_size"] == 4 and "without node-c: world size 4" in captured.err
    assert [(s["global_batch_size"], s["grad_accum_steps"]) for s in plan["stages"]] == [(8, 2), (16, 2)]
    assert cli_main([*base, "--exclude-nodes", "node-b,node-c"]) == 0
    assert [s["grad_accum_steps"] for s in json.loads(capsys.readouterr().out)["stages"]] == [4, 4]
    assert cli_main([*base, "--exclude-nodes", "node-b"]) == 2  # world size 3: stage 'small' cannot keep 8
    err = capsys.readouterr().err
    assert "without node-b: world size 3 does not fit the schedule (a restart with --exclude-failed-nodes would be " \
           "refused)" in err and "small" in err
    assert cli_main([*base, "--exclude-nodes", "node-x"]) == 2
    assert "--exclude-nodes: node-x not in" in capsys.readouterr().err


# Each case: a script run with `signals` (a StopSignals) in scope, the lines it prints, and the grace time's line.
# - a scheduler's SIGTERM reaches a rank twice (directly and through DeepSpeed's launcher): still one stop, the
#   checkpoint still wanted; past restarts.preemption_grace_seconds the rank exits, saying so;
# - the rank's wrapper starts it with SIGTERM / SIGINT blocked (launcher/launch/rank_process.py): a Ctrl-C sent then
#   is delivered when the handlers are installed, recorded (the start-up goes on), announced when the trainer arms
#   them, and its grace time counts from its arrival, not from the announcement.
STOP_CASES = {
    "repeated_sigterm_is_one_stop": (
        "signals.arm(StopAnnouncer(3.0, 0, lambda text: print(text, flush=True), lambda: 41 + 1))\n"
        "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2)\n"
        "print('alive after two SIGTERMs:', signals.requested is not None, flush=True)\n"
        "time.sleep(30)\n",
        ["stop requested (SIGTERM): finishing step 42, then a checkpoint (within 3 s)", "alive after two SIGTERMs: True"]),
    "held_before_the_start_then_announced": (
        "signal.pthread_sigmask(signal.SIG_BLOCK, RANK_STOP_SIGNALS)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "signals.install()\n"
        "print('start-up goes on:', signals.requested.signal, flush=True)\n"
        "time.sleep(2)\n"
        "signals.arm(StopAnnouncer(3.0, 0, lambda text: print(text, flush=True), lambda: 1))\n"
        "time.sleep(1.8)\n",
        ["start-up goes on: SIGINT", "stop requested (SIGINT): finishing step 1, then a checkpoint (within 3 s)"]),
}


@pytest.mark.parametrize("case", STOP_CASES)
def test_a_ranks_stop_is_one_stop_announced_once_within_its_grace_time(tmp_path, case):
    body, printed = STOP_CASES[case]
    result = _stop_signals_script(tmp_path, body + "print('not stopped by the grace time', flush=True)\n")
    assert result.stdout.splitlines() == printed, result.stdout + result.stderr
    assert result.returncode == 1
    assert "pretrain (rank 0): no checkpoint within the preemption grace time of 3 s " \
           "(restarts.preemption_grace_seconds): exiting without it" in result.stderr


def _stop_signals_script(tmp_path, body: str):
    """`body` run in a fresh process with `signals`, a StopSignals, and the module's names in scope."""
    import subprocess
    import sys

    script = tmp_path / "rank_stop.py"
    script.write_text("import os, signal, sys, time\n"
                      "from launcher.common.defaults import RANK_STOP_SIGNALS\n"
                      "from launcher.train.stop_signals import StopAnnouncer, StopSignals\n"
                      "signals = StopSignals()\n" + body)
    return subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
