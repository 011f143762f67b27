"""TEST-ONLY: the suite's rank jobs started warm. torch, DeepSpeed and the rank's modules are imported once per
pytest process; every job is forked from that warm process instead of starting three interpreters.

    python -u -m tests.support.fork_server SOCKET      (started by `ForkServer.start`, one per pytest process)

A job is what DeepSpeed's per-node launcher (deepspeed.launcher.launch) makes of `--module M ARGS` on one node,
minus its interpreter start-up: a process in a session of its own (so a test signals exactly its job, as with
`helpers.start_run`'s start_new_session) that forks `num_ranks` ranks, each `python -m M --local_rank=<r> ARGS`
with DeepSpeed's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR/PORT, CROSS_RANK/SIZE), then
behaves as launch.py does: a SIGTERM or SIGINT is passed to every rank as SIGTERM, the job waits up to 30 s for
them (then SIGKILL) and exits 1; the first rank that exits non-zero has the others terminated the same way and
its code ends the job (a signal death N as launch.py's sys.exit(-N) does: 256 - N). Ranks write to the job's log.

What it costs and saves: a tiny 2-rank job started through DeepSpeed's launcher imports torch and DeepSpeed three
times (launcher and two ranks, ~3 CPU-s each on the reference machine); forked, it imports nothing. The warm
process never runs a torch operation, so it has no thread when it forks (the pattern of teardown_ranks.py).

Not for jobs whose subject is the launcher, the console or a process's command line: `helpers.start_run(...,
warm=False)` starts those through DeepSpeed's launcher, as do `roformer pretrain`'s own.

CPU accounting: the server is a child subreaper; it reports each job's CPU (its own and its ranks', os.wait4) when
the job ends, and `cpu_not_yet_reaped()` adds those seconds to the test that waited (tests/support/cpu_report.py)
until the server itself is reaped, whose rusage then holds them.
"""
from __future__ import annotations

import ctypes
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
TERMINATE_WAIT_S = 30.0  # launch.py's terminate_process_tree: psutil.wait_procs(children, timeout=30)
WARM_MODULES = ("torch", "torch.distributed", "deepspeed.comm", "launcher.train.rank", "launcher.train.rank_entry",
                "launcher.train.engine", "launcher.checkpoint.checkpointer", "launcher.train.trainer",
                "tests.support.rank_wrapper")


# --- the warm process -----------------------------------------------------------------------------------------


IMPORT_ENV: dict[str, str] = {}
"""What the warm imports set in the environment (DeepSpeed's PYTORCH_NVML_BASED_CUDA_CHECK): a launcher that imported
them passes it on to its ranks, so every job's environment gets it too (as a default)."""


def warm_up() -> None:
    """Everything a rank imports before its first torch operation (imports only: no thread may exist at a fork)."""
    import importlib

    from launcher.deepspeed_env.lean_imports import import_deepspeed

    before = dict(os.environ)
    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    get_accelerator()  # built here once (the job asks it for the node's device variables, as launch.py does)
    for name in WARM_MODULES:  # a module renamed fails the server's start loudly: keep this list true
        importlib.import_module(name)
    IMPORT_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})


def serve(path: str) -> None:
    """Accept job requests on the unix socket `path` until pytest (the parent) is gone or says stop."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # a killed job's ranks are reaped here, their CPU counted
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is pytest's to handle; the server ends with it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    child_ended, wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # SIGCHLD wakes the select: no polling
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wakeup)
    jobs: dict[int, socket.socket] = {}  # job pid -> the connection that waits for its exit
    print("ready", flush=True)
    while os.getppid() == parent:
        readable, _, _ = select.select([listener, child_ended], [], [], 1.0)
        if child_ended in readable:
            os.read(child_ended, 4096)
        if listener in readable:
            conn, _ = listener.accept()
            request = json.loads(_read_line(conn))
            if request.get("stop"):
                conn.close()
                break
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (child_ended, wakeup):
                    os.close(fd)
                listener.close()
                for other in jobs.values():
                    other.close()
                conn.close()
                _run_job(request)  # never returns
            jobs[pid] = conn
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(jobs)
    listener.close()
    for pid in list(jobs):  # pytest is gone or done: no job outlives it (a detached side job of a rank, e.g. a
        _signal_group(pid, signal.SIGKILL)  # stage-end eval, is not the job's: it goes on as under DeepSpeed's launcher)
        _, status, usage = os.wait4(pid, 0)
        _tell(jobs.pop(pid), status, usage)
    _reap(jobs)


def _reap(jobs: dict[int, socket.socket]) -> None:
    """Reap every ended child (jobs, and ranks or side jobs whose parent is gone); tell each ended job's waiter."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in jobs:
            _tell(jobs.pop(pid), status, usage)


def _tell(conn: socket.socket, status: int, usage) -> None:
    """The job's exit code (a signal death as -N, as Popen.returncode) and CPU seconds, to the test waiting for it."""
    code = os.waitstatus_to_exitcode(status)  # a signal death as -N
    try:
        conn.sendall(json.dumps({"exit": code, "cpu_s": usage.ru_utime + usage.ru_stime}).encode() + b"\n")
    except OSError:
        pass  # the test stopped waiting
    conn.close()


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# --- a job: DeepSpeed's per-node launcher, forked -------------------------------------------------------------


def _run_job(request: dict) -> None:
    """The job process: its own session, the test's environment and log, its ranks forked; ends the process."""
    code = 1
    try:
        os.setsid()
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update({**IMPORT_ENV, **request["env"]})
        code = _launch(request)
    except BaseException:  # noqa: BLE001 - a job's own failure is its exit code, as an interpreter's would be
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def _launch(request: dict) -> int:
    num_ranks, module, args = request["num_ranks"], request["module"], request["args"]
    from deepspeed.accelerator import get_accelerator

    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(request["port"]), "WORLD_SIZE": str(num_ranks),
              "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": str(num_ranks)}
    get_accelerator().set_visible_devices_envs(common, list(range(num_ranks)))  # as launch.py: the node's devices
    ranks = []
    for rank in range(num_ranks):
        pid = os.fork()
        if pid == 0:
            _run_rank(module, [f"--local_rank={rank}", *args], {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)})
        ranks.append(pid)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    alive = set(ranks)
    try:
        while alive:
            pid, status = os.waitpid(-1, 0)
            alive.discard(pid)
            code = os.waitstatus_to_exitcode(status)  # a signal death as -N
            if code != 0:
                return _terminate(alive, code)
    except _Stopped:
        return _terminate(alive, 1)
    return 0


class _Stopped(Exception):
    """A SIGTERM or SIGINT reached the job (launch.py's sigkill_handler: terminate the ranks, then exit 1)."""


def _stop(signum, frame):
    raise _Stopped


def _terminate(alive: set[int], code: int) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one termination at a time, as the handler's own 30 s wait
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + TERMINATE_WAIT_S
    while alive and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
        alive.discard(pid)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return code


def _run_rank(module: str, argv: list[str], env: dict[str, str]) -> None:
    """One rank: `python -m module ARGV` as its own interpreter would run it, in this forked process."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.update(env)
        _threads_as_a_fresh_rank()
        entry = sys.modules.get("launcher.train.rank_entry")
        if entry is not None:
            entry.PROCESS_START = time.time()  # its start-up timing counts from this process's start
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def _threads_as_a_fresh_rank() -> None:
    """torch's thread count as the rank's own interpreter would have it: the rank entry decides OMP_NUM_THREADS before
    its torch import (the node's cores / its ranks), which reads it; torch was imported here before the fork, with the
    server's count (one thread a core: two 2-rank jobs on two cores then spun, each rank waiting for a core)."""
    import torch

    from launcher.train.rank_entry import prepare_process_environment

    decided = dict(os.environ)  # a copy: the rank's environment stays as its launcher gave it (the rank sets it)
    prepare_process_environment(decided)
    torch.set_num_threads(int(decided["OMP_NUM_THREADS"]))


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


# --- the test's side ------------------------------------------------------------------------------------------


_reported_cpu_s = 0.0
"""CPU seconds of ended jobs the server reported and is not yet reaped for (cpu_report adds them)."""


def cpu_not_yet_reaped() -> float:
    return _reported_cpu_s


class ForkedJob:
    """A job of the server, as much of subprocess.Popen as the tests use: pid, poll, wait, returncode, signals."""

    def __init__(self, conn: socket.socket, pid: int):
        self._conn, self.pid, self.returncode = conn, pid, None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"forked job {self.pid}", timeout)
            self._collect()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self) -> None:
        global _reported_cpu_s
        line = _read_line(self._conn)
        self._conn.close()
        if not line:
            raise RuntimeError(f"the fork server ended before job {self.pid}")
        reply = json.loads(line)
        self.returncode = reply["exit"]
        _reported_cpu_s += reply["cpu_s"]


class ForkServer:
    """One warm process per pytest process, started at the first job, stopped at the session's end."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self._dir = tempfile.mkdtemp(prefix="roformer-fork-server.")
        self.path = os.path.join(self._dir, "socket")
        self._proc = subprocess.Popen([sys.executable, "-u", "-m", "tests.support.fork_server", self.path], cwd=cwd,
                                      env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        ready = self._proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start (exit {self._proc.wait()})")

    def start(self, num_ranks: int, module: str, args: list[str], port: int, env: dict[str, str], cwd: Path,
              log: Path) -> ForkedJob:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendall(json.dumps({"num_ranks": num_ranks, "module": module, "args": list(args), "port": port,
                                 "env": env, "cwd": str(cwd), "log": str(log)}).encode() + b"\n")
        return ForkedJob(conn, json.loads(_read_line(conn))["pid"])

    def stop(self) -> None:
        global _reported_cpu_s
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.path)
            conn.sendall(b'{"stop": true}\n')
            conn.close()
            self._proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        _reported_cpu_s = 0.0  # the server is reaped: its rusage, now this process's, holds its jobs' CPU
        self._proc.stdout.close()
        Path(self.path).unlink(missing_ok=True)
        os.rmdir(self._dir)


if __name__ == "__main__":
    warm_up()
    serve(sys.argv[1])
