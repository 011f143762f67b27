"""Run DeepSpeed's runner (on one machine its per-node launcher), echo its output, and when a rank dies
say which one and stop the rest.

The runner runs in its own session, so a Ctrl-C reaches only us: the first Ctrl-C/SIGTERM goes to the
ranks alone (they checkpoint and exit); a second one, or GRACEFUL_STOP_SECONDS, stops every process of the
job, matched by this job's own command line (the runner's pdsh handler would `pkill -f` every DeepSpeed
job on the nodes). The cause of a failure is the first `[roformer-rank-exit]` line, rank error line
(RANK_ERROR_PREFIX) or `[roformer-watchdog]` verdict; the rest gets FAILURE_GRACE_SECONDS (a hang:
HUNG_GRACE_SECONDS) to end. docs/multinode.md, "When a rank dies" and "When the job hangs".
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.common.defaults import (GUARD_STOP_EXIT_CODE, HUNG_EXIT_CODE, ORDERLY_STOP_EXIT_CODE,
                               PEER_GONE_PREFIX, RANK_ERROR_PREFIX, stop_signals_to_handle)
from launcher.launch import env_forwarding
from launcher.launch.console import Console
from launcher.launch.launch_plan import LaunchPlan
from launcher.launch.rank_process import MARKER, ORPHAN_STOP_SECONDS
from launcher.launch.ssh import ssh
from launcher.launch.watchdog import Verdict
from launcher.run_dir.layout import RunDir
from launcher.run_dir.lock import LOCK_ID_ENV, wait_for_local_ranks

FAILURE_GRACE_SECONDS = 30.0  # + the stop itself stays well inside the 60 s promised in docs/multinode.md
STOP_WAIT_SECONDS = 10.0
GRACEFUL_STOP_SECONDS = 120.0  # Ctrl-C: time for the ranks to finish the step and write a checkpoint
HUNG_GRACE_SECONDS = 10.0  # after a watchdog verdict: the other guards decide within their settle time
REMOTE_STOP_POLL_SECONDS = 2.0  # a requested stop looks for ranks started since on each node this often

_PDSH_PREFIX_RE = re.compile(r"^([A-Za-z0-9_.-]+): (.*)$")
_GUARD_RE = re.compile(re.escape(MARKER) + r" rank=(\S+) local_rank=(\S+) node_rank=(\S+) host=(\S+) pid=(\d+) "
                       r"status=(.*)$")
_DS_EXIT_RE = re.compile(r"exits with return code = (-?\d+)")
# DeepSpeed's per-node launcher (launch.py) on a SIGTERM/SIGINT it got: it stops its ranks and exits 1.
_NODE_SIGNALLED_RE = re.compile(r"Main process received (SIGTERM|SIGINT), exiting")
_PDSH_SSH_EXIT_RE = re.compile(r"^pdsh@\S+: ([A-Za-z0-9_.-]+): ssh exited with exit code (\d+)")
_RANK_ERROR_RE = re.compile("^" + re.escape(RANK_ERROR_PREFIX.format(rank="RANK")).replace("RANK", r"(\d+)")
                            + r"(.+)$")
_PEER_GONE_RE = re.compile("^" + re.escape(PEER_GONE_PREFIX.format(rank="RANK")).replace("RANK", r"(\d+)"))


@dataclass
class Failure:
    """One failure seen in the job's output."""

    host: str  # node it happened on (hostfile name)
    rank: int | None  # global rank, None when only the node is known
    local_rank: str  # rank on its node, "?" when unknown
    status: str  # "killed by SIGKILL", "exit code 1", ...
    seen_at: float  # time.monotonic() when its line arrived
    hung: bool = False  # a hang watchdog verdict (the cause of whatever fails after it)

    def describe(self) -> str:
        who = f"rank {self.rank} (local rank {self.local_rank}) on node {self.host}" if self.rank is not None \
            else f"node {self.host}"
        return f"{who}: {self.status}"


@dataclass(frozen=True)
class RankError:
    """A rank's own one-line error ("pretrain (rank N): error: MESSAGE"), as it gave it."""

    rank: int
    message: str

    def describe(self) -> str:
        return f"rank {self.rank}: {self.message}"


@dataclass
class OutputMonitor:
    """Parses the runner's output lines into Failures."""

    plan: LaunchPlan
    failures: list[Failure] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    signalled_nodes: list[str] = field(default_factory=list)
    """Nodes whose DeepSpeed launcher said it got SIGTERM/SIGINT (a scheduler preempting the job, or our stop)."""
    first_error: RankError | None = None
    """The first rank's own error line seen (the cause the job's last line names), None when none was."""
    peer_gone_ranks: set[int] = field(default_factory=set)
    """Ranks that said they failed only because another process of the job ended: never the cause while
    another rank's failure was seen (their exit can reach us first: a killed rank's wrapper is slower)."""

    def feed(self, line: str) -> None:
        host, text = None, line.rstrip("\n")
        match = _PDSH_PREFIX_RE.match(text)
        if match and match.group(1) in self.plan.resources:
            host, text = match.group(1), match.group(2)
        if _NODE_SIGNALLED_RE.search(text):
            with self.lock:
                self.signalled_nodes.append(host or next(iter(self.plan.resources)))
        peer_gone = _PEER_GONE_RE.match(text)
        if peer_gone:
            with self.lock:
                self.peer_gone_ranks.add(int(peer_gone.group(1)))
        error = _RANK_ERROR_RE.match(text)
        if error:
            with self.lock:
                self.first_error = self.first_error or RankError(int(error.group(1)), error.group(2).strip())
        failure = self._parse(host, text)
        if failure is not None:
            with self.lock:
                self.failures.append(failure)

    def _parse(self, host: str | None, text: str) -> Failure | None:
        now = time.monotonic()
        verdict = Verdict.from_line(text)
        if verdict is not None and verdict.ranks:
            # The culprit's node from the hostfile: a partitioned node's own line never arrives.
            by_rank = {r: (h, str(local)) for r, h, local in self.plan.rank_hosts()}
            culprit_host, local_rank = by_rank.get(verdict.ranks[0]) or ("?", (verdict.local_ranks or ["?"])[0])
            return Failure(culprit_host, verdict.ranks[0], local_rank, verdict.what(), now, hung=True)
        guard = _GUARD_RE.search(text)
        if guard:
            rank_text, local_rank, _node_rank, _hostname, _pid, status = guard.groups()
            rank = int(rank_text) if rank_text.isdigit() else None
            by_rank = {r: h for r, h, _ in self.plan.rank_hosts()}
            return Failure(host or by_rank.get(rank, "?"), rank, local_rank, status.strip(), now)
        ssh_exit = _PDSH_SSH_EXIT_RE.match(text)
        if ssh_exit and int(ssh_exit.group(2)) != ORDERLY_STOP_EXIT_CODE:
            return Failure(ssh_exit.group(1), None, "?", f"remote launcher exit code {ssh_exit.group(2)}", now)
        ds_exit = _DS_EXIT_RE.search(text)
        if ds_exit and int(ds_exit.group(1)) != ORDERLY_STOP_EXIT_CODE:
            where = host or next(iter(self.plan.resources))
            return Failure(where, None, "?", f"DeepSpeed launcher: a rank exited with code {ds_exit.group(1)}", now)
        return None

    def first(self) -> Failure | None:
        with self.lock:
            hung = [f for f in self.failures if f.hung]
            ranked = [f for f in self.failures if f.rank is not None]
            causes = [f for f in ranked if f.rank not in self.peer_gone_ranks]
            return min(hung or causes or ranked or self.failures, key=lambda f: f.seen_at, default=None)

    def snapshot(self) -> list[Failure]:
        with self.lock:
            return list(self.failures)


def job_pattern(plan: LaunchPlan) -> str:
    """A pkill -f regex (POSIX ERE) for this job's per-node launchers, guards and ranks.

    It matches `deepspeed.launcher.launch ... launcher.train.rank_entry --config C --run-dir R`,
    `-m launcher.launch.rank_process launcher.train.rank_entry ...` and `-m launcher.train.rank_entry ...`, and
    NOT DeepSpeed's runner (`-m launcher.launch.deepspeed_processes runner ...`), whose SIGTERM handler would pkill
    every DeepSpeed launcher on the nodes. Literal characters are bracketed ('.' -> '[.]'), so the
    regex does not match the command line of the shell running pkill, which holds the regex text.
    """
    tail = " ".join(["--config", str(plan.config_path), "--run-dir", str(plan.run_dir)])
    entry = _ere_literal(plan.entry_module)
    return (f"(deepspeed[.]launcher[.]launch .*|-m )({_ere_literal('launcher.launch.rank_process')} )?"
            f"{entry} {_ere_literal(tail)}( |$)")


def rank_pattern(plan: LaunchPlan) -> str:
    """A pkill -f regex for this job's training processes only (not launchers, not guards)."""
    tail = " ".join(["--config", str(plan.config_path), "--run-dir", str(plan.run_dir)])
    # '[-]m', not '-m': pkill would take a pattern starting with '-' for an option.
    return f"[-]m {_ere_literal(plan.entry_module)} {_ere_literal(tail)}( |$)"


def local_rank_regex(plan: LaunchPlan) -> re.Pattern:
    """rank_pattern as a Python regex, for the local stop (which reads command lines itself).

    Not rank_pattern compiled with `re`: its POSIX brackets are not Python sets for every
    character ('[\\]' and '[^]' do not even compile), and a local --run-dir may hold any character.
    """
    tail = " ".join(["--config", str(plan.config_path), "--run-dir", str(plan.run_dir)])
    return re.compile(re.escape(f"-m {plan.entry_module} {tail}") + "( |$)")


class StopForwarder:
    """The first Ctrl-C / SIGTERM of `roformer pretrain`, passed on as SIGTERM to the ranks alone (the trainer
    then finishes its step, checkpoints and exits), each rank once, and also to each rank that starts after
    the stop arrived: a stop during the job's start-up is not lost (a rank records it from its first instant
    and honours it at its first step boundary: launcher/train/stop_signals.py).

    Signalling DeepSpeed's launcher too would make it signal the ranks a second time, which the trainer
    takes as "stop now". MPI launchers: mpirun passes SIGTERM on to its ranks itself.
    """

    def __init__(self, plan: LaunchPlan, runner: subprocess.Popen):
        self.plan, self.runner = plan, runner
        self.signalled: dict[str, set[int]] = {host: set() for host in plan.resources}
        """Per host, the process ids of the ranks signalled so far."""
        self.ranks_per_host = {host: len(slots) for host, slots in plan.resources.items()}
        self.unreachable: set[str] = set()
        """Hosts ssh did not reach (their ranks' guards stop them when the job ends)."""
        self.next_remote_look = 0.0

    def forward(self) -> None:
        """Signal the ranks not signalled yet; called on every poll of the supervisor once a stop was asked."""
        if self.plan.launcher == "local":
            self._forward_local()
        elif self.plan.launcher == "pdsh":
            if time.monotonic() >= self.next_remote_look:  # ssh per host: not on every poll
                self.next_remote_look = time.monotonic() + REMOTE_STOP_POLL_SECONDS
                self._forward_remote()
        elif not any(self.signalled.values()):
            _killpg(self.runner, signal.SIGTERM)
            self.signalled[next(iter(self.signalled))].add(self.runner.pid)

    def _forward_local(self) -> None:
        import psutil

        regex, seen = local_rank_regex(self.plan), self.signalled[next(iter(self.signalled))]
        try:
            children = psutil.Process(self.runner.pid).children(recursive=True)
        except psutil.Error:
            return  # the runner has ended
        for proc in children:
            try:
                if proc.pid not in seen and regex.search(" ".join(proc.cmdline())):
                    proc.terminate()
                    seen.add(proc.pid)
            except psutil.Error:
                pass

    def _forward_remote(self) -> None:
        for host, seen in self.signalled.items():
            if len(seen) >= self.ranks_per_host[host] or host in self.unreachable:
                continue
            result = ssh(host, remote_stop_command(rank_pattern(self.plan), seen), timeout=15)
            if result.returncode == 255:  # ssh's own failure: not asked again (each try costs its timeout)
                self.unreachable.add(host)
            seen.update(int(pid) for pid in result.stdout.split() if pid.isdigit())


def remote_stop_command(pattern: str, seen: set[int]) -> str:
    """The shell command that SIGTERMs the processes matching `pattern` (pgrep -f) whose ids are not in
    `seen`, printing the ids it signalled."""
    skip = " ".join(str(pid) for pid in sorted(seen))
    return (f"for p in $(pgrep -f {shlex.quote(pattern)}); do case ' {skip} ' in *\" $p \"*) ;; "
            f"*) kill -TERM $p && echo $p ;; esac; done")


def _ere_literal(text: str) -> str:
    return "".join(c if c.isalnum() or c in " _@=:,/-" else f"[{c}]" for c in text)


def stop_job(plan: LaunchPlan, runner: subprocess.Popen, unreachable: set[str]) -> None:
    """Stop every process of this job on every node, then the local runner and its children.
    Hosts ssh cannot reach are added to `unreachable` and not asked again (a partitioned node's
    guards stop its ranks themselves; every further attempt would only add an ssh timeout)."""
    pattern = shlex.quote(job_pattern(plan))
    if plan.launcher == "pdsh":
        hosts = list(plan.resources)
        for sig in ("TERM", "KILL"):
            for host in hosts:  # sequential is fine: a few hosts, 10 s ssh timeout each at worst
                if host not in unreachable and ssh(host, f"pkill -{sig} -f {pattern}", timeout=15).returncode == 255:
                    unreachable.add(host)
            if sig == "TERM" and _wait(runner, STOP_WAIT_SECONDS):
                break
        _killpg(runner, signal.SIGKILL)  # pdsh and the runner; SIGKILL bypasses the runner's pkill handler
    else:
        # local: DeepSpeed's launcher terminates its ranks on SIGTERM; MPI: mpirun stops all ranks.
        _killpg(runner, signal.SIGTERM)
        if not _wait(runner, STOP_WAIT_SECONDS):
            _killpg(runner, signal.SIGKILL)
    runner.wait()


def sweep_remote(plan: LaunchPlan, unreachable: set[str]) -> None:
    """After a failed pdsh job: make sure nothing of it is left on any node ssh still reaches."""
    pattern = shlex.quote(job_pattern(plan))
    for host in plan.resources:
        if host not in unreachable:
            ssh(host, f"pkill -KILL -f {pattern}", timeout=15)


def end_orphaned_ranks(plan: LaunchPlan) -> None:
    """DeepSpeed's launcher gone (killed) before its ranks: they stop on their own (their guards see their parent
    gone) but still write their checkpoint. The job is not over, nor its lock released or a restart started,
    before they have ended; past their own bound they are killed (checked by pid and start time)."""
    lock_id = plan.env.get(LOCK_ID_ENV)
    if not lock_id:
        return
    for rank in wait_for_local_ranks(plan.run_dir, lock_id, ORPHAN_STOP_SECONDS + STOP_WAIT_SECONDS):
        try:
            os.kill(rank.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def signal_name(signum: int) -> str:
    """'Ctrl-C (SIGINT)', 'SIGTERM', ... as the user should read it."""
    name = signal.Signals(signum).name
    return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


@dataclass
class JobOutcome:
    """How one launch of the job ended (what the restart policy, launcher.launch.restart_loop, judges)."""

    returncode: int
    """What `roformer pretrain` exits with for this launch (0, 124 hung, 128+N stopped by signal N, ...)."""
    failure: Failure | None
    """The first failure seen (the cause), None when none was."""
    interrupted: int | None
    """The signal `roformer pretrain` itself received (SIGINT / SIGTERM), None when none."""
    ended_at: float
    """time.monotonic() when the last process of the job had ended."""
    signalled_nodes: list[str] = field(default_factory=list)
    """Nodes whose DeepSpeed launcher got SIGTERM/SIGINT (OutputMonitor.signalled_nodes)."""
    error: RankError | None = None
    """The first rank's own error line (OutputMonitor.first_error): the cause as the rank gave it."""

    @property
    def preempted(self) -> bool:
        """The job was stopped by a SIGTERM not sent by us (a scheduler): the ranks alone (they checkpoint and
        exit 143), or every process of a node, whose launcher then exits 1 after its ranks checkpointed."""
        if self.interrupted is not None:
            return False
        if self.failure is None:
            return self.returncode == ORDERLY_STOP_EXIT_CODE
        return (self.failure.rank is None and self.failure.status.startswith("remote launcher")
                and self.failure.host in self.signalled_nodes)


def supervise(plan: LaunchPlan, runner_env: dict[str, str], console: Console | None = None) -> int:
    """Run the job to its end; return 0 or a non-zero exit code after printing what failed."""
    return supervise_job(plan, runner_env, console).returncode


def supervise_job(plan: LaunchPlan, runner_env: dict[str, str], console: Console | None = None,
                  grace_seconds: float = GRACEFUL_STOP_SECONDS) -> JobOutcome:
    """Run the job to its end, printing what failed; `grace_seconds`: how long a requested stop (SIGTERM,
    Ctrl-C) waits for the ranks' checkpoint at the current step before stopping every process."""
    console = console or Console(sys.stdout, RunDir(plan.run_dir).launcher_log, status=False, hosts=plan.resources)
    interrupted: list[int] = []  # handlers first: a Ctrl-C from here on must not orphan the runner
    previous = {s: signal.signal(s, lambda signum, _f: interrupted.append(signum))
                for s in stop_signals_to_handle()}  # SIGINT, SIGTERM and SIGHUP (unless under nohup)
    try:
        runner = subprocess.Popen(plan.command(), cwd=env_forwarding.project_root(), env=runner_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, text=True, errors="replace", bufsize=1)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    monitor = OutputMonitor(plan)

    def pump() -> None:
        for line in runner.stdout:
            monitor.feed(line)
            console.job_line(line)  # never raises: a closed stdout only stops the echo

    reader = threading.Thread(target=pump, name="runner-output", daemon=True)
    reader.start()
    stopped_after_failure = False
    graceful_deadline: float | None = None
    stop = StopForwarder(plan, runner)
    unreachable: set[str] = set()  # hosts ssh did not reach while stopping the job
    try:
        while runner.poll() is None:
            time.sleep(0.2)
            first = monitor.first()
            if interrupted and graceful_deadline is None:
                console.note(f"roformer pretrain: {signal_name(interrupted[0])} received: the ranks finish their "
                             f"step, write a checkpoint and stop (up to {grace_seconds:g} s; interrupt again "
                             f"to stop at once)")
                graceful_deadline = time.monotonic() + grace_seconds
            elif graceful_deadline is not None and (len(interrupted) > 1 or time.monotonic() > graceful_deadline):
                console.note("roformer pretrain: stopping every process of the job now")
                stop_job(plan, runner, unreachable)
            elif first is not None and time.monotonic() - first.seen_at > (
                    HUNG_GRACE_SECONDS if first.hung else FAILURE_GRACE_SECONDS):
                stop_job(plan, runner, unreachable)
                stopped_after_failure = True
            if graceful_deadline is not None:  # again on every poll: the ranks that started since
                stop.forward()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(timeout=10)
    returncode = runner.wait()
    end_orphaned_ranks(plan)
    failures = monitor.snapshot()
    if plan.launcher == "pdsh" and (failures or returncode != 0):
        sweep_remote(plan, unreachable)
    first = monitor.first()

    def outcome(code: int) -> JobOutcome:
        return JobOutcome(code, first, interrupted[0] if interrupted else None, time.monotonic(),
                          list(monitor.signalled_nodes), monitor.first_error)

    if interrupted and returncode == 0 and not failures:  # it came after the last step: the run had finished
        console.note(f"roformer pretrain: {signal_name(interrupted[0])} arrived after the last step: the run "
                     f"finished")
        return JobOutcome(0, None, None, time.monotonic(), list(monitor.signalled_nodes), monitor.first_error)
    if interrupted:  # asked for: not an error, whatever the ranks' exit codes say
        preempted = "preempted, resumable: " if interrupted[0] == signal.SIGTERM else ""
        console.note(f"roformer pretrain: {preempted}stopped by {signal_name(interrupted[0])}; {resume_hint(plan)}")
        return outcome(128 + interrupted[0])
    if returncode == 0 and not failures:
        return outcome(0)
    if returncode == ORDERLY_STOP_EXIT_CODE and not failures:
        console.note("roformer pretrain: preempted, resumable: the ranks were stopped by a signal and wrote a "
                     "checkpoint; run the same command again to resume")
        return outcome(returncode)
    ranked = [f for f in failures if f.rank is not None]  # the DeepSpeed launcher's own line repeats the code
    if ranked and all(f.status == f"exit code {GUARD_STOP_EXIT_CODE}" for f in ranked):
        cause = monitor.first_error.describe() if monitor.first_error else "its line above"
        console.note(f"roformer pretrain: stopped by the numerics guard, not a fault, so not restarted: {cause}")
        return JobOutcome(GUARD_STOP_EXIT_CODE, None, None, time.monotonic(), list(monitor.signalled_nodes),
                          monitor.first_error)
    if outcome(returncode).preempted:  # every process of a node got SIGTERM from outside: a scheduler
        nodes = ", ".join(dict.fromkeys(monitor.signalled_nodes))
        console.note(f"roformer pretrain: preempted, resumable: the job's processes on {nodes} got SIGTERM from "
                     f"outside and the ranks checkpoint at their current step; {resume_hint(plan)}")
        return outcome(ORDERLY_STOP_EXIT_CODE)
    console.note("roformer pretrain: error: " + failure_report(monitor, returncode, stopped_after_failure))
    if any(f.hung for f in failures):
        return outcome(HUNG_EXIT_CODE)
    return outcome(returncode if returncode > 0 else 1)


def failure_report(monitor: OutputMonitor, returncode: int, stopped_after_failure: bool) -> str:
    first = monitor.first()
    if first is None:
        return f"DeepSpeed's launcher exited with code {returncode}; see the output above"
    if first.hung:
        return f"hung: {first.describe()}; stopped by the hang watchdog on all nodes; {resume_hint(monitor.plan)}"
    later = [f.describe() for f in monitor.snapshot() if f is not first and f.rank is not None]
    text = f"{first.describe()}; the job was stopped on all nodes"
    if stopped_after_failure:
        text += f" (by roformer pretrain, {FAILURE_GRACE_SECONDS:g} s after the failure)"
    if later:
        text += ". Afterwards: " + "; ".join(later)
    if monitor.first_error is not None:  # the cause as the rank said it, then how the ranks ended
        return f"{monitor.first_error.describe()} [{text}]"
    return text


def resume_hint(plan: LaunchPlan) -> str:
    """Where a re-run of the same command continues from (the newest complete checkpoint; its files are
    verified by the re-run, not here: a stop does not wait for hashing)."""
    complete = CheckpointCatalogue.scan(plan.run_dir).complete()
    if not complete:
        return "no checkpoint was complete yet: running the same command again starts from the beginning"
    return f"the newest complete checkpoint is {complete[-1].tag}: run the same command again to resume from it"
