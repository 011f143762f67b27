"""A one-node Slurm cluster on this machine: `slurmctld` + `slurmd` with their own config in a temp dir.

    with SlurmCluster(tmp_dir, cpus=2) as cluster:   # raises SlurmUnavailable, saying why, if it cannot start
        env = cluster.client_env()                  # SLURM_CONF pointing at the cluster's slurm.conf
        subprocess.run(["srun", "-n", "2", "hostname"], env=env)

What it sets up (Debian `slurm-wlm` 22.05; nothing under /etc or /var is used or changed):
- `slurm.conf` in the temp dir: controller and node both `localhost` (127.0.0.1) on free TCP ports,
  `AuthType=auth/none` + `CredType=cred/none` (no munge daemon or key needed), daemons and jobs as
  root, process tracking by /proc (`proctrack/linuxproc`, no cgroups needed), consumable CPUs
  (`select/cons_tres`, `CR_CPU`) so `srun -n 2` places two tasks on a node with `CPUs=2`, and
  state, spool, pid and log files inside the temp dir.
- `slurmctld -D` and `slurmd -D -N localhost`, each in its own session; ready once `sinfo` reports
  the node idle.
Every client (srun, sinfo, scontrol, squeue) finds the cluster through `SLURM_CONF`, which srun
also passes on to the tasks. Teardown (also after failures) cancels every job of the cluster,
waits for them to leave, stops both daemons and removes the temp dir.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.helpers import free_port

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo", "squeue", "scancel", "scontrol")
NODE_NAME = "localhost"
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 15.0


class SlurmUnavailable(RuntimeError):
    """Slurm is not installed, or we are not root (slurmd starts jobs as their user); the message says why.

    Daemons that are there but fail to start raise RuntimeError with their log: that is a failure."""


class SlurmCluster:
    def __init__(self, work_dir: Path, cpus: int = 2):
        self.tag = f"{random.getrandbits(20):05x}"
        self.dir = Path(work_dir) / f"slurm-{self.tag}"
        self.cpus = cpus
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    # ---- set-up -------------------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        missing = [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed (Debian slurm-wlm; scripts/setup.sh installs it)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd must run as root to start jobs (SlurmdUser=root)")
        try:
            self._write_config()
            self._start_daemons()
            self._wait_until_idle()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True)
        d = self.dir
        self.conf.write_text("\n".join([
            f"ClusterName=roformertest{self.tag}",
            f"SlurmctldHost={NODE_NAME}(127.0.0.1)",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/none", "CredType=cred/none",
            "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "ReturnToService=2", "SlurmdParameters=config_overrides",
            # A task ends its step when it exits; a failed rank ends the others after KillWait seconds.
            "KillWait=5", "InactiveLimit=0", "MinJobAge=300",  # finished jobs stay visible 5 min
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            f"PlugStackConfig={d / 'plugstack.conf'}",  # empty: no site SPANK plugins from /etc/slurm
            f"NodeName={NODE_NAME} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=test Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        (d / "plugstack.conf").write_text("")

    def _start_daemons(self) -> None:
        commands = {"slurmctld": ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                    "slurmd": ["slurmd", "-D", "-N", NODE_NAME, "-f", str(self.conf)]}
        for name, cmd in commands.items():
            log = open(self.dir / "log" / f"{name}.out", "w")
            self.daemons[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                  env=self.client_env(), start_new_session=True)

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode}: {self._log_tail(name)}")
            result = self._client("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = result.stdout.strip()
            if state.startswith("idle"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"node {NODE_NAME} not idle after {START_TIMEOUT_SECONDS:g} s (state {state!r}); "
                               f"slurmctld: {self._log_tail('slurmctld')}; slurmd: {self._log_tail('slurmd')}")

    def _log_tail(self, name: str, lines: int = 5) -> str:
        text = ""
        for path in (self.dir / "log" / f"{name}.log", self.dir / "log" / f"{name}.out"):
            if path.is_file():
                text += path.read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:]) or "no log"

    # ---- use ----------------------------------------------------------------------------------
    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def _client(self, *cmd: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
        result = subprocess.run(list(cmd), capture_output=True, text=True, env=self.client_env(), timeout=timeout,
                                stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
        return result

    def jobs(self) -> list[str]:
        """Job ids the controller still knows as pending, running or completing."""
        result = self._client("squeue", "-h", "-o", "%i", "-t", "PD,R,CG", check=False)
        return result.stdout.split()

    def job_records(self) -> list[dict[str, str]]:
        """Every job the controller remembers (finished ones for MinJobAge), as `scontrol show job` fields."""
        result = self._client("scontrol", "show", "job", "--oneliner", check=False)
        if "No jobs in the system" in result.stdout + result.stderr:
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in result.stdout.splitlines() if line.strip()]

    def finished_job(self, job_id: str, timeout: float = 60.0) -> dict[str, str]:
        """The job's record once it has left pending / running / completing: `salloc` can return while
        the controller still runs the job's epilogue (state COMPLETING) on a busy machine."""
        deadline = time.monotonic() + timeout
        while True:
            record = next((job for job in self.job_records() if job["JobId"] == job_id), None)
            if record is None or record["JobState"] not in ("PENDING", "RUNNING", "COMPLETING") \
                    or time.monotonic() > deadline:
                return record
            time.sleep(0.5)

    def daemon_log(self, name: str) -> str:
        path = self.dir / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
            try:
                if self.jobs():
                    self._client("scancel", "--full", "--quiet", "-u", "root", check=False)
                deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.3)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(DAEMONS):  # slurmd first, so the controller sees it go
            proc = self.daemons.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.daemons.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
