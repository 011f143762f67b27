"""The hang watchdog without a training job: PhaseBounds arithmetic, the `watchdog:` config section,
heartbeat files, `diagnose` for each kind of evidence, two guards deciding on real (sleeping / stopped)
processes, and `roformer pretrain`'s report of a verdict. The real hangs: tests/cluster/test_watchdog_on_cluster.py.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from launcher.config.run_config import load_run_config
from launcher.config.watchdog_section import WatchdogSection
from launcher.common.errors import UserError
from launcher.launch import watchdog as guard_watchdog
from launcher.launch.watchdog import GuardStatus, PeerView, Verdict, Watchdog, diagnose
from launcher.run_dir.heartbeat_file import Heartbeat, read_record, write_record
from launcher.run_dir.layout import RunDir
from launcher.train.heartbeats import PhaseBounds, HeartbeatWriter
from tests.support.helpers import run_config_dict, write_complete_checkpoint, write_yaml

CFG = WatchdogSection(step_factor=4.0, min_step_seconds=10.0, warmup_steps=2, history_steps=3,
                      phase_seconds=60.0, startup_seconds=600.0)


# --- bounds (pure) --------------------------------------------------------------------------------


def test_step_bound_is_the_phase_floor_until_steps_after_warmup_are_timed():
    bounds = PhaseBounds(CFG)
    assert bounds.step_bound(stage=0) == 60.0
    bounds.record_step(30.0)  # warm-up steps (first use of the shapes) are not history
    assert bounds.step_bound(stage=0) == 60.0
    bounds.record_step(25.0)
    assert bounds.step_bound(stage=0) == 60.0
    bounds.record_step(1.0)
    assert bounds.step_bound(stage=0) == 10.0  # 4 x 1 s is below the floor
    bounds.record_step(5.0)
    assert bounds.step_bound(stage=0) == 20.0  # 4 x the slowest recent step


def test_step_bound_follows_the_recent_window_and_restarts_at_a_stage_switch():
    bounds = PhaseBounds(CFG)
    bounds.step_bound(stage=0)
    for seconds in (9.0, 9.0, 8.0, 3.0, 3.0, 3.0):
        bounds.record_step(seconds)
    assert bounds.step_bound(stage=0) == 12.0  # the 8 s step left the 3-step window
    assert bounds.step_bound(stage=1) == 60.0  # new shapes: the floor again, history cleared
    for seconds in (40.0, 40.0, 4.0):
        bounds.record_step(seconds)
    assert bounds.step_bound(stage=1) == 16.0


def test_phase_bound_grows_with_the_longest_observed_run_of_that_phase():
    bounds = PhaseBounds(CFG)
    assert bounds.phase_bound("checkpoint save") == 60.0
    bounds.record_phase("checkpoint save", 5.0)
    assert bounds.phase_bound("checkpoint save") == 60.0  # the floor
    bounds.record_phase("checkpoint save", 30.0)
    bounds.record_phase("checkpoint save", 2.0)
    assert bounds.phase_bound("checkpoint save") == 120.0  # 4 x the longest save
    assert bounds.phase_bound("validation") == 60.0  # each kind has its own record
    assert bounds.startup_bound() == 600.0


@pytest.mark.parametrize("key, value, message", [
    ("min_step_seconds", 0, "watchdog.min_step_seconds: must be > 0"),
    ("step_factor", 0.5, "watchdog.step_factor: must be >= 1"),
    ("warmup_steps", 0, "watchdog.warmup_steps: must be >= 1"),
    ("phase_seconds", "soon", "watchdog.phase_seconds: expected float"),
    ("timeout", 3, "unknown key(s) watchdog.timeout"),
])
def test_watchdog_section_errors_name_the_field(tmp_path, key, value, message):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tmp_path, watchdog={key: value}))
    with pytest.raises(UserError, match=re.escape(message)):
        load_run_config(config)


def test_watchdog_section_defaults_and_overrides(tmp_path):
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tmp_path))
    assert load_run_config(config).watchdog == WatchdogSection()
    cfg = load_run_config(config, ["watchdog.min_step_seconds=20", "watchdog.enabled=false"])
    assert (cfg.watchdog.min_step_seconds, cfg.watchdog.enabled) == (20.0, False)


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_recorder_writes_phase_step_and_bound_before_the_work(tmp_path):
    run_dir, clock = RunDir(tmp_path), FakeClock()
    progress = HeartbeatWriter(run_dir, 3, CFG, clock=clock)
    progress.start_up("engine")
    beat = read_record(run_dir.heartbeat(3), Heartbeat)
    assert (beat.phase, beat.step, beat.bound_seconds, beat.pid) == ("start-up: engine", None, 600.0, os.getpid())
    with progress.phase("checkpoint save", 12):
        beat = read_record(run_dir.heartbeat(3), Heartbeat)
        assert (beat.describe_phase(), beat.bound_seconds, beat.monotonic) == ("checkpoint save after step 12", 60.0,
                                                                               1000.0)
        clock.now += 20.0
    with progress.step(12, stage=1):
        assert read_record(run_dir.heartbeat(3), Heartbeat).describe_phase() == "train step 13"
    assert progress.bounds.phase_bound("checkpoint save") == 80.0  # the 20 s save was recorded
    progress.ended("finished", 13)
    beat = read_record(run_dir.heartbeat(3), Heartbeat)
    assert (beat.phase, beat.bound_seconds, beat.seq) == ("finished", None, 4)


def test_disabled_recorder_writes_nothing(tmp_path):
    progress = HeartbeatWriter(RunDir(tmp_path), 0, WatchdogSection(enabled=False))
    progress.start_up("engine")
    with progress.step(0, stage=0):
        pass
    assert not RunDir(tmp_path).heartbeats.exists()


def _status(rank: int, step: int | None = 40, phase: str | None = "train step 41", state: str = "S",
            reachable: bool | None = True, silent: float = 35.0, node: str = "0") -> GuardStatus:
    return GuardStatus(rank=rank, local_rank="0", node_rank=node, host=f"host{node}", seq=1, rank_pid=100 + rank,
                       phase=phase, step=step, silent_seconds=silent, bound_seconds=30.0, process_state=state,
                       master_reachable=reachable)


def _views(*statuses: GuardStatus, silent_ranks: tuple[int, ...] = ()) -> list[PeerView]:
    return [PeerView(s.rank, s, live=s.rank not in silent_ranks) for s in statuses]


def test_diagnose_names_a_stopped_process_first():
    verdict = diagnose(_views(_status(0), _status(1, state="T", node="1"), _status(2, reachable=False)), "m:1")
    assert verdict.ranks == [1] and "process is stopped" in verdict.reason
    assert (verdict.phase, verdict.node_ranks, verdict.silent_seconds) == ("train step 41", ["1"], 35.0)


def test_diagnose_names_every_rank_of_a_node_cut_off_from_rank_0():
    views = _views(_status(0), _status(1), _status(2, reachable=False, node="1"), _status(3, reachable=False, node="1"))
    verdict = diagnose(views, "10.1.2.11:29500")
    assert verdict.ranks == [2, 3]
    assert verdict.reason == "its node cannot reach rank 0's host 10.1.2.11:29500 (network link down or partitioned)"
    assert Verdict.from_line("node1: " + verdict.to_line()) == verdict


def test_diagnose_names_the_rank_behind_the_others():
    # rank 1 still validates after step 40 while the others are in training step 41
    views = _views(_status(0), _status(1, phase="validation after step 40"), _status(2))
    verdict = diagnose(views, "m:1")
    assert verdict.ranks == [1] and "behind the other ranks (validation after step 40" in verdict.reason
    views = _views(_status(0), _status(1, step=None, phase=None))  # no heartbeat yet: behind start-up
    assert diagnose(views, "m:1").ranks == [1]


def test_diagnose_names_a_busy_or_blocked_rank_while_the_others_wait():
    verdict = diagnose(_views(_status(0), _status(1, state="D")), "m:1")
    assert verdict.ranks == [1] and "uninterruptible I/O" in verdict.reason
    assert diagnose(_views(_status(0, state="R"), _status(1)), "m:1").ranks == [0]


def test_diagnose_names_a_silent_guard_and_otherwise_the_longest_silent_rank():
    verdict = diagnose(_views(_status(0), _status(1), silent_ranks=(1,)), "m:1")
    assert verdict.ranks == [1] and "stopped updating" in verdict.reason
    verdict = diagnose([PeerView(0, _status(0), True), PeerView(1, None, False)], "m:1")
    assert verdict.ranks == [1] and verdict.phase is None and verdict.hosts == ["?"]
    verdict = diagnose(_views(_status(0, silent=31.0), _status(1, silent=36.0)), "m:1")
    assert verdict.ranks == [1] and "silent the longest" in verdict.reason


def test_guards_stop_a_stopped_rank_and_agree_on_it(tmp_path, monkeypatch):
    """Rank 1 is SIGSTOPped, rank 0 waits (sleeps): both guards name rank 1 and kill their rank."""
    monkeypatch.setattr(guard_watchdog, "SETTLE_SECONDS", 3.0)
    run_dir, clock = RunDir(tmp_path / "run"), FakeClock()
    run_dir.heartbeats.mkdir(parents=True)
    ranks = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    lines: list[str] = []
    try:
        ranks[1].send_signal(signal.SIGSTOP)
        while guard_watchdog.process_state(ranks[1].pid) != "T":
            time.sleep(0.01)
        guards = []
        for rank, proc in enumerate(ranks):
            identity = {"rank": str(rank), "local_rank": "0", "node_rank": str(rank), "host": f"n{rank}"}
            guards.append(Watchdog(run_dir, identity, 2, proc.pid, "127.0.0.1", 9, report=lines.append, clock=clock))
            write_record(run_dir.heartbeat(rank), Heartbeat(rank=rank, pid=proc.pid, phase="train", step=40,
                                                            bound_seconds=10.0, monotonic=clock.now,
                                                            wall_time=time.time(), seq=1))
        assert not any(g.check() for g in guards)  # within the bound: statuses only
        assert read_record(run_dir.guard_status(1), GuardStatus).process_state == "T"
        clock.now += 11.0  # overdue: both start deciding
        assert not any(g.check() for g in guards)
        clock.now += 1.0
        assert not any(g.check() for g in guards)  # statuses seen changing: both peers live
        clock.now += 3.0
        assert guards[0].check()  # rank 0's guard decides first, from the evidence
        assert guards[1].check()  # rank 1's guard takes the published verdict
        assert [g.verdict.ranks for g in guards] == [[1], [1]]
        assert "process is stopped" in guards[1].verdict.reason
        assert all(proc.wait(timeout=10) == -signal.SIGKILL for proc in ranks)
        assert len(lines) == 2 and all(Verdict.from_line(line).ranks == [1] for line in lines)
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()


def test_guard_ignores_a_previous_runs_heartbeat(tmp_path):
    run_dir = RunDir(tmp_path)
    with HeartbeatWriter(run_dir, 0, CFG).step(5, stage=0):  # written by this process, not the guard's child
        pass
    identity = {"rank": "0", "local_rank": "0", "node_rank": "0", "host": "n0"}
    guard = Watchdog(run_dir, identity, 1, 999999, "127.0.0.1", 9, report=print, clock=lambda: time.monotonic() + 1e6)
    assert guard.check() is False and not run_dir.guard_status(0).exists()


def test_guard_stops_its_rank_when_the_run_directory_becomes_unreachable(tmp_path, monkeypatch):
    """A node cut off from the shared run directory too: its guard still stops its rank (no orphan)."""
    monkeypatch.setattr(guard_watchdog, "SETTLE_SECONDS", 3.0)
    run_dir, clock = RunDir(tmp_path / "run"), FakeClock()
    run_dir.heartbeats.mkdir(parents=True)
    rank, master = subprocess.Popen(["sleep", "60"]), socket.create_server(("127.0.0.1", 0))  # rank 0 reachable
    try:
        write_record(run_dir.heartbeat(1), Heartbeat(rank=1, pid=rank.pid, phase="train", step=40, bound_seconds=10.0,
                                                     monotonic=clock.now, wall_time=time.time(), seq=1))
        identity = {"rank": "1", "local_rank": "0", "node_rank": "1", "host": "n1"}
        guard = Watchdog(run_dir, identity, 2, rank.pid, *master.getsockname(), report=print, clock=clock)
        assert guard.check() is False
        shutil.rmtree(run_dir.root)  # from now on every read and write fails
        for _ in range(3):
            clock.now += 6.0
            if guard.check():
                break
        assert guard.verdict is not None and guard.verdict.ranks == [0]  # its peer looks silent from here
        assert rank.wait(timeout=10) == -signal.SIGKILL
    finally:
        rank.kill()
        rank.wait()
        master.close()


def test_supervisor_reports_the_verdict_with_the_culprits_node_and_the_resume_point(tmp_path):
    from launcher.launch.supervise import OutputMonitor, failure_report
    from tests.unit.test_launch import _plan

    plan = _plan("pdsh", tmp_path)  # reference hostfile: node1 ranks 0-3, node2 ranks 4-7
    monitor = OutputMonitor(plan)
    monitor.feed("node1: [roformer-rank-exit] rank=0 local_rank=0 node_rank=0 host=a pid=1 status=exit code 1\n")
    verdict = Verdict(ranks=[5, 6], reason="its node cannot reach rank 0's host x:1 (network link down or "
                      "partitioned)", phase="train step 58", silent_seconds=31.4, bound_seconds=20.0)
    monitor.feed("node1: " + verdict.to_line() + "\n")
    first = monitor.first()
    assert (first.host, first.rank, first.local_rank, first.hung) == ("node2", 5, "1", True)
    write_complete_checkpoint(RunDir(plan.run_dir), 56)
    assert failure_report(monitor, 1, True) == (
        "hung: rank 5 (local rank 1) on node node2: stopped making progress in train step 58 for 31 s (bound 20 s) "
        "(so did rank 6): its node cannot reach rank 0's host x:1 (network link down or partitioned); stopped by "
        "the hang watchdog on all nodes; the newest complete checkpoint is global_step56: run the same command "
        "again to resume from it")
