"""Restart by itself: `roformer pretrain --max-restarts N [--exclude-failed-nodes]` (docs/unattended.md).

After a fault named by launcher.launch.supervise: judge it (`RestartPolicy.decide`), wait a backoff,
rebuild the launch plan (less excluded nodes) and launch again; the ranks resume from the newest intact
checkpoint by themselves. Not retried: bad input (2), a numerics-guard stop (3), the same error twice at
the same step, a stop asked of `roformer pretrain`, anything once N restarts are spent. Every fault goes to
RUN_DIR/restarts.json.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.common.defaults import BAD_INPUT_EXIT_CODE, GUARD_STOP_EXIT_CODE
from launcher.common.errors import UserError
from launcher.launch.supervise import JobOutcome
from launcher.run_dir.layout import RunDir
from launcher.run_dir.metrics_format import read_records
from launcher.run_dir.restart_records import RestartRecord, append_restart, read_restarts, update_restart

NOT_REPEATABLE_KINDS = ("preempted", "preflight")  # not a property of the step: never "the same error twice"
EXCLUDABLE_KINDS = ("rank", "node", "hung")  # a fault that names the node it happened on
FIRST_STEP_POLL_SECONDS = 1.0
_DURATION_RE = re.compile(r"\b\d+(\.\d+)? s\b")
STARTUP_EVENT = "startup"  # rank 0's metrics.jsonl event when it is ready for its first step (launcher/train/metrics.py Metrics.report_start)


@dataclass(frozen=True)
class Fault:
    """What ended one launch of the job."""

    kind: str
    """"rank", "node", "hung", "preempted", "preflight" or "launcher" (RestartRecord.kind)."""
    cause: str
    """The fault as the console names it."""
    status: str
    """The failure itself without where it happened ("killed by SIGKILL", "exit code 1", the hang phase)."""
    node: str | None
    rank: int | None
    failed_at_step: int
    """Steps completed when it happened."""
    returncode: int
    """What `roformer pretrain` exits with if the run ends here."""
    error: str | None = None
    """The first rank's own error line ("rank N: MESSAGE"), None when no rank gave one."""

    def same_error(self, other: "Fault") -> bool:
        """The same failure at the same step: a deterministic fault, which a restart would only repeat."""
        return (self.kind not in NOT_REPEATABLE_KINDS and self.kind == other.kind
                and _without_durations(self.status) == _without_durations(other.status)
                and self.failed_at_step == other.failed_at_step)


def _without_durations(status: str) -> str:
    """A hang verdict says how long the rank was overdue ('for 26 s (bound 20 s)'): not part of the error."""
    return _DURATION_RE.sub("N s", status)


@dataclass(frozen=True)
class Decision:
    restart: bool
    reason: str
    """Why not (restart False), else empty."""
    exclude: str | None = None
    """The node to leave out of the restart (--exclude-failed-nodes), None for none."""


@dataclass(frozen=True)
class RestartPolicy:
    """The `restarts:` section with the command line's overrides (launcher.config.restarts_section)."""

    max_restarts: int = 0
    backoff_seconds: float = 10.0
    max_backoff_seconds: float = 300.0
    exclude_failed_nodes: bool = False

    @classmethod
    def from_args(cls, args, section) -> "RestartPolicy":
        """`--max-restarts` / `--exclude-failed-nodes` when given, else the run config's `restarts:`."""
        max_restarts = section.max_restarts if args.max_restarts is None else args.max_restarts
        if max_restarts < 0:
            raise UserError(f"--max-restarts {max_restarts}: must be >= 0")
        exclude = section.exclude_failed_nodes if args.exclude_failed_nodes is None else args.exclude_failed_nodes
        return cls(max_restarts, section.backoff_seconds, section.max_backoff_seconds, exclude)

    def backoff(self, restart_number: int) -> float:
        """Seconds to wait before restart `restart_number` (1-based): doubling from backoff_seconds, capped."""
        return min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (restart_number - 1))

    def decide(self, fault: Fault, earlier: list[Fault], restarts_done: int) -> Decision:
        if fault.kind == "rank" and fault.status == f"exit code {BAD_INPUT_EXIT_CODE}":
            return Decision(False, f"a rank ended on its own error (exit code {BAD_INPUT_EXIT_CODE}: a config or data "
                                   f"error, a failed save), which a restart would meet again: "
                                   f"{fault.error or 'named above'}")
        if fault.kind == "rank" and fault.status == f"exit code {GUARD_STOP_EXIT_CODE}":
            return Decision(False, "the numerics guard stopped the run, which is not a fault to retry: a restart "
                                   f"would meet the same spike: {fault.error or 'its line above names the step and figure'}")
        repeated = next((f for f in earlier if fault.same_error(f)), None)
        if repeated is not None:
            return Decision(False, f"the same error twice at step {fault.failed_at_step} ({fault.status}): a "
                                   "deterministic fault (a bug, a bad batch, a config error) is not retried")
        if restarts_done >= self.max_restarts:
            return Decision(False, f"--max-restarts {self.max_restarts} "
                                   f"{'spent' if self.max_restarts else '(restarts are off)'}")
        exclude = fault.node if self.exclude_failed_nodes and fault.kind in EXCLUDABLE_KINDS and fault.node \
            and fault.node != "?" else None
        return Decision(True, "", exclude)


def fault_of(outcome: JobOutcome, failed_at_step: int) -> Fault:
    """The Fault of a launch that ended neither finished nor asked to stop."""
    failure = outcome.failure
    if outcome.preempted:
        where = f" on {', '.join(dict.fromkeys(outcome.signalled_nodes))}" if outcome.signalled_nodes else ""
        return Fault("preempted", f"preempted: the job's processes{where} got SIGTERM from outside (the ranks "
                     "checkpoint at their current step)", "preempted", None, None, failed_at_step, outcome.returncode)
    if failure is not None:
        kind = "hung" if failure.hung else "rank" if failure.rank is not None else \
            "node" if failure.status.startswith("remote launcher") else "launcher"
        error = outcome.error.describe() if outcome.error is not None else None
        cause = failure.describe() + (f" ({error})" if error and not failure.hung else "")
        return Fault(kind, cause, failure.status, None if failure.host == "?" else failure.host,
                     failure.rank, failed_at_step, outcome.returncode, error)
    return Fault("launcher", f"DeepSpeed's launcher exited with code {outcome.returncode}",
                 f"launcher exit code {outcome.returncode}", None, None, failed_at_step, outcome.returncode)


def train_records(run_dir: RunDir, since: float = 0.0) -> list[dict]:
    """The train records of metrics.jsonl in file order (a torn last line skipped); with `since` (time.time()
    of a launch) only those the ranks of that launch wrote."""
    return [r for r in _records(run_dir, since) if r.get("kind") == "train"]


def _records(run_dir: RunDir, since: float = 0.0) -> list[dict]:
    """The records of metrics.jsonl; with `since`, from the first `startup` event stamped at or after it on
    (a resumed rank 0 rewrites the file without the lines past its checkpoint, a fresh format event first,
    before its `startup` event: so neither a byte offset nor the first time stamp would do)."""
    try:
        out = read_records(run_dir.metrics)
    except OSError:
        return []
    if since:
        first = next((i for i, r in enumerate(out) if r.get("event") == STARTUP_EVENT
                      and isinstance(r.get("time"), (int, float)) and r["time"] >= since), len(out))
        out = out[first:]
    return out


def restart_point(run_dir: RunDir) -> tuple[int, str | None]:
    """(step, tag) of the checkpoint the restarted ranks resume from: the newest intact one, files verified
    as rank 0 verifies them (CheckpointCatalogue.newest_intact); (0, None) when there is none."""
    point = CheckpointCatalogue.scan(run_dir).newest_intact()
    return (point.step, point.tag) if point is not None else (0, None)


def redo_seconds(records: list[dict], after_step: int, up_to_step: int) -> float:
    """The step times of steps after_step+1 .. up_to_step as last trained (what redoing them costs)."""
    times = {r["step"]: float(r.get("step_time_s") or 0.0) for r in records
             if isinstance(r.get("step"), int) and after_step < r["step"] <= up_to_step}
    return sum(times.values())


class FirstStepWatch:
    """After a restart: when the job's first train record appears, fill in the restart record's
    restart_seconds (launch -> end of the first step) and seconds_lost."""

    def __init__(self, run_dir: RunDir, index: int, record: RestartRecord, launched_wall: float):
        self.run_dir, self.index, self.record, self.launched_wall = run_dir, index, record, launched_wall
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="restart-first-step", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(FIRST_STEP_POLL_SECONDS):
            self.check()

    def check(self) -> bool:
        """Look once; True once the record is complete."""
        if self.record.restart_seconds is not None:
            return True
        records = _records(self.run_dir, self.launched_wall)
        first = next((r for r in records if r.get("kind") == "train"), None)
        if first is None:
            return False
        ready = records[0]["time"]  # the launch's startup event
        seconds = max(0.0, ready - self.launched_wall) + float(first.get("step_time_s") or 0.0)
        lost = self.record.stop_seconds + self.record.backoff_seconds + seconds + self.record.redo_seconds
        self.record = update_restart(self.run_dir, self.index, restart_seconds=round(seconds, 2),
                                     seconds_lost=round(lost, 2))
        self.done.set()
        return True

    def stop(self) -> None:
        """The launch ended: one last look, after the polling thread (never two writers at once)."""
        self.done.set()
        self.thread.join(timeout=30)
        self.check()


def run_with_restarts(plan, policy: RestartPolicy, launch: Callable[[object], JobOutcome],
                      rebuild: Callable[[tuple[str, ...]], object], say: Callable[[str], None],
                      sleep: Callable[[float], None] = time.sleep) -> int:
    """Launch `plan` (launch(plan) -> JobOutcome), restarting after faults as `policy` allows; `rebuild
    (excluded_nodes)` makes the plan of a restart (UserError: the restart is refused, e.g. a stage's
    global batch does not fit the smaller world). Returns the exit code of `roformer pretrain`."""
    run_dir = RunDir(plan.run_dir)
    faults: list[Fault] = []
    excluded: list[str] = []
    watch: FirstStepWatch | None = None
    attempt = 0
    while True:
        attempt += 1
        launched_wall = time.time()
        if watch is not None:
            watch.launched_wall = launched_wall
        try:
            outcome = launch(plan)
        except UserError as err:
            if attempt == 1:  # the first launch's checks: bad input, as without restarts
                raise
            outcome = None
            preflight_error = str(err)
        if watch is not None:
            watch.stop()
            watch = None
        if outcome is not None and (outcome.returncode in (0, GUARD_STOP_EXIT_CODE) or outcome.interrupted is not None):
            return outcome.returncode  # finished, stopped by the numerics guard or asked to stop (the console said which)
        records, this_launch = train_records(run_dir), train_records(run_dir, launched_wall)
        from_step, from_tag = restart_point(run_dir)
        # A launch that failed before its first step made no progress: it failed where it resumed.
        failed_at = this_launch[-1]["step"] if this_launch else min(from_step, records[-1]["step"] if records else 0)
        if outcome is None:
            fault = Fault("preflight", f"the restart's checks failed: {preflight_error}", "preflight failed",
                          None, None, failed_at, BAD_INPUT_EXIT_CODE)
            say(f"roformer pretrain: error: {fault.cause}")
            stop_seconds, seen_wall = 0.0, time.time()
        else:
            fault = fault_of(outcome, failed_at)
            seen_at = outcome.failure.seen_at if outcome.failure is not None else outcome.ended_at
            stop_seconds = max(0.0, outcome.ended_at - seen_at)
            seen_wall = time.time() - (time.monotonic() - seen_at)
        decision = policy.decide(fault, faults, attempt - 1)
        faults.append(fault)
        next_plan = None
        if decision.restart:
            drop = tuple(excluded + [decision.exclude]) if decision.exclude and decision.exclude not in excluded \
                else tuple(excluded)
            try:
                next_plan = rebuild(drop)
            except UserError as err:
                decision = Decision(False, f"cannot restart without {', '.join(drop)}: {err}")
            else:
                excluded = list(drop)
        backoff = policy.backoff(attempt) if decision.restart else 0.0
        record = RestartRecord(
            attempt=attempt, action="restart" if decision.restart else "gave up",
            time=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seen_wall)), unix_time=round(seen_wall, 3),
            cause=fault.cause, kind=fault.kind,
            node=fault.node, rank=fault.rank, failed_at_step=failed_at, restarted_from_step=from_step,
            restarted_from_tag=from_tag, steps_lost=max(0, failed_at - from_step), stop_seconds=round(stop_seconds, 2),
            backoff_seconds=backoff, redo_seconds=round(redo_seconds(records, from_step, failed_at), 2),
            world_size=next_plan.world_size if next_plan is not None else None, excluded_nodes=list(excluded),
            reason=decision.reason)
        append_restart(run_dir, record)
        if not decision.restart:
            if policy.max_restarts:  # without restarts the console's error line is all there was before
                say(f"roformer pretrain: not restarting: {decision.reason}")
            return fault.returncode
        where = f"from {from_tag} (step {from_step}; {record.steps_lost} step(s) to redo)" if from_tag \
            else f"from step 0 (no checkpoint yet; {record.steps_lost} step(s) to redo)"
        without = f", without {', '.join(excluded)} (world size {next_plan.world_size})" if excluded else ""
        say(f"roformer pretrain: restart {attempt}/{policy.max_restarts} in {backoff:g} s {where}{without} "
            f"after: {fault.cause}")
        sleep(backoff)
        plan = next_plan
        watch = FirstStepWatch(run_dir, len(read_restarts(run_dir)) - 1, record, time.time())

